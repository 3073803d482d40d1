"""The run's worker pool (issue 10 item 6): one pool of long-lived workers that make rows and
enforce each request's whole-request deadline, without a second thread per request.

In-process and offline: providers here are small fakes whose request() sleeps or trickles
for a set time; deadlines are a fraction of a second, so every test is bounded and fast.
"""

import threading
import time

import pytest

import regression

SUITE = regression.validate_suite({"name": "pool", "instructions": "Repeat the input.", "cases": [{"id": "c", "input": "hello", "contains": ["hello"]}]})
CASE = SUITE["cases"][0]


class Fake(regression.EchoProvider):
    """Echo answers after `plan(attempt_number)` seconds; a negative plan raises a 503 instead.

    `trickle` makes the wait a loop of short sleeps, like a body arriving a few bytes at a time
    (each read returns, so no per-read timeout can fire)."""

    def __init__(self, plan=lambda n: 0.0, deadline=None, trickle=False):
        self.plan, self.deadline, self.trickle = plan, deadline, trickle
        self.lock = threading.Lock()
        self.calls = self.now = self.peak = 0
        self.threads = set()

    def request(self, model, suite, case, repeat=0):
        with self.lock:
            self.calls += 1
            number = self.calls
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.threads.add(threading.get_ident())
        try:
            wait = self.plan(number)
            if wait < 0:
                error = RuntimeError("fake 503")
                error.status_code = 503
                raise error
            end = time.monotonic() + wait
            while time.monotonic() < end:
                time.sleep(0.01 if self.trickle else end - time.monotonic())
            return super().request(model, suite, case, repeat)
        finally:
            with self.lock:
                self.now -= 1


def rows_of(provider, jobs, concurrency, retries=None, stopping=lambda: False, refill_early=lambda row: False):
    """(job, row) pairs from run_jobs over execute_steps, in completion order."""
    def work(job):
        return regression.run_row_steps(provider, SUITE, CASE, "m", job, retries=retries,
                                        sleep=lambda s: None)
    return list(regression.run_jobs(jobs, work, concurrency, stopping, refill_early))


# ====================================================================== deadline

@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("trickle", [False, True], ids=["hang", "trickle"])
def test_a_call_past_its_deadline_becomes_a_timeout_row_on_time(concurrency, trickle):
    provider = Fake(plan=lambda n: 2.0, deadline=0.2, trickle=trickle)
    started = time.monotonic()
    rows = rows_of(provider, list(range(concurrency)), concurrency)
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, f"the deadline (0.2 s) did not cut a 2 s {'trickle' if trickle else 'hang'} off"
    assert sorted(job for job, _ in rows) == list(range(concurrency))
    for _, row in rows:
        assert row["error"] == "TimeoutError" and row["error_status"] is None
        assert row["reasons"] == ["execution_error"] and row["passed"] is False
        assert "within 0.2 s" in row["error_message"]


def test_a_timed_out_attempt_is_retried_and_the_retry_can_succeed():
    provider = Fake(plan=lambda n: 3.0 if n == 1 else 0.0, deadline=0.4, trickle=True)
    started = time.monotonic()
    (job, row), = rows_of(provider, [0], 1, retries=2)
    assert time.monotonic() - started < 2.5
    assert row["error"] is None and row["passed"] is True and row["attempts"] == 2
    assert provider.calls == 2


def test_the_pool_keeps_its_size_after_abandoning_workers():
    """Every job times out once and then succeeds: the abandoned workers are replaced, so all
    jobs finish and no more than `concurrency` requests are ever answered at once by live workers."""
    provider = Fake(plan=lambda n: 2.0 if n <= 2 else 0.0, deadline=0.4)
    rows = rows_of(provider, list(range(6)), 2, retries=1)
    assert sorted(job for job, _ in rows) == list(range(6))
    assert all(row["passed"] for _, row in rows)
    assert provider.calls == 8


def test_calls_within_their_deadline_are_never_cut():
    provider = Fake(plan=lambda n: 0.05, deadline=3.0)
    rows = rows_of(provider, list(range(8)), 4)
    assert all(row["passed"] for _, row in rows) and provider.calls == 8


def test_within_alone_still_cuts_a_trickling_call():
    def trickle():
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            time.sleep(0.01)
        return "late"

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="within 0.2 s"):
        regression.within(0.2, trickle)
    assert time.monotonic() - started < 1.0
    assert regression.within(0.5, lambda: "ok") == "ok"
    assert regression.within(None, lambda: "inline") == "inline"


# ====================================================================== one pool, no thread per request

@pytest.mark.parametrize("concurrency", [1, 2, 8])
def test_requests_run_on_at_most_concurrency_long_lived_workers(concurrency):
    provider = Fake(plan=lambda n: 0.002, deadline=5.0)
    before = threading.active_count()
    rows = rows_of(provider, list(range(60)), concurrency)
    assert len(rows) == 60 and all(row["passed"] for _, row in rows)
    assert provider.peak <= concurrency
    # one thread per worker, reused for every request: not one (or two) per request
    assert len(provider.threads) <= concurrency
    assert threading.get_ident() not in provider.threads
    deadline = time.monotonic() + 2.0
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before, "the pool's threads end with the run"


def test_rows_equal_those_of_a_direct_execute():
    provider = Fake(deadline=1.0)
    (_, pooled), = rows_of(provider, [3], 4, retries=1)
    direct = regression.run_row(provider, SUITE, CASE, "m", 3, retries=1)
    assert {k: v for k, v in pooled.items() if k != "seconds"} == {k: v for k, v in direct.items() if k != "seconds"}


def test_send_through_steps_keeps_its_retry_contract():
    provider = Fake(plan=lambda n: -1 if n < 3 else 0.0)
    sleeps = []
    raw, attempts = regression.send_request(provider, "m", SUITE, CASE, 0, retries=3,
                                            sleep=sleeps.append, jitter=lambda: 1.0)
    assert attempts == 3 and sleeps == [1.0, 2.0] and raw["output_text"] == "hello"


# ====================================================================== stopping and failures

def test_stopping_lets_in_flight_rows_finish_and_starts_nothing_new():
    seen_error = threading.Event()

    def plan(n):  # the others answer only once the caller has seen the error row
        if n == 2:
            return -1
        assert seen_error.wait(10)
        return 0.0

    provider = Fake(plan=plan)
    state = {"stopped": False}
    seen = []
    for job, row in regression.run_jobs(list(range(20)), lambda job: regression.run_row_steps(
            provider, SUITE, CASE, "m", job), 4, lambda: state["stopped"]):
        seen.append(row)
        state["stopped"] = state["stopped"] or row["error"] is not None
        if state["stopped"]:
            seen_error.set()
    assert provider.calls == 4, "only the four in flight when the error was seen"
    assert len(seen) == 4 and sum(row["error"] is not None for row in seen) == 1


def test_a_sequential_run_refills_early_only_when_the_row_cannot_stop_it():
    order = []
    provider = Fake()

    def work(job):
        order.append(("start", job))
        return regression.run_row_steps(provider, SUITE, CASE, "m", job)

    for job, _ in regression.run_jobs([0, 1, 2], work, 1, lambda: False, refill_early=lambda row: False):
        order.append(("row", job))
    assert order == [("start", 0), ("row", 0), ("start", 1), ("row", 1), ("start", 2), ("row", 2)]


def test_a_failure_outside_the_row_propagates_to_the_caller():
    def work(job):
        raise ValueError(f"broken job {job}")

    with pytest.raises(ValueError, match="broken job"):
        list(regression.run_jobs([1, 2], work, 2, lambda: False))


def test_keyboard_interrupt_inside_a_request_reaches_the_caller():
    class Interrupting(Fake):
        def request(self, *args):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rows_of(Interrupting(deadline=1.0), [0], 1)


def test_work_may_still_return_a_finished_row():
    rows = list(regression.run_jobs([1, 2, 3], lambda job: {"job": job}, 2, lambda: False))
    assert sorted(row["job"] for _, row in rows) == [1, 2, 3]


def test_a_short_run_starts_no_idle_workers(monkeypatch):
    sizes = []

    class Recording(regression.WorkerPool):
        def __init__(self, work, size):
            sizes.append(size)
            super().__init__(work, size)

    monkeypatch.setattr(regression, "WorkerPool", Recording)
    provider = Fake()
    def steps(job):
        return regression.run_row_steps(provider, SUITE, CASE, "m", job)
    rows = list(regression.run_jobs([0, 1, 2], steps, 64, lambda: False))
    assert len(rows) == 3
    assert sizes == [3], "three jobs need three workers, not 64"
