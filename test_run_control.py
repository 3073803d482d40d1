"""Offline tests of SPEC B4 run control: concurrency, retries, resume, cost cap, shards,
progress, redaction and secrets.

The runner is driven as `python regression.py ...` subprocesses against fakes.FakeServer
on 127.0.0.1 with a fake key; every file lives under tmp_path.
"""

import email.utils
import json
import os
import pathlib
import random
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

import compare_runs
import fakes
import regression

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
KEY = "pplx-test-SECRET-0123456789"
CASE_IDS = [case["id"] for case in regression.CASES]
DEFAULT_MODELS = list(regression.MODELS)
PROGRAM = f"{regression._python_word()} regression.py"  # how hints name the script run from HERE


# ====================================================================== helpers

def clean_env(server=None, key=KEY):
    """The environment of a child run: no real keys, no proxies, no REGRESSION_* twins."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_"))
           and name.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    if server is not None:
        env["PERPLEXITY_BASE_URL"] = server.url
    if key:
        env["PERPLEXITY_API_KEY"] = key
    return env


def run(args, server=None, key=KEY, timeout=60):
    """`python regression.py ARGS` with the fake server's URL and a fake key, in a process of
    its own forked from a zygote that has paid the SDK import once (fakes.run_script)."""
    return fakes.run_script(args, HERE, clean_env(server, key), timeout=timeout)


def read(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def keys(rows):
    return [regression.row_key(row) for row in rows]


def row_lines(stdout):
    """The per-row console lines (everything before the summary JSON)."""
    lines = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            break
        if line.strip():
            lines.append(line)
    return lines


def line_key(line):
    model, case_id, repeat = line.split()[:3]
    return model, case_id, int(repeat.lstrip("r"))


def essence(row):
    """What must not differ between two runs of the same answers (timings aside)."""
    return {field: row.get(field) for field in ("case_id", "model", "repeat", "reasons", "passed", "answer_text")}


def without_seconds(row):
    return {field: value for field, value in row.items() if field != "seconds"}


def case_of(request):
    return fakes.CASES_BY_QUESTION.get((request.json or {}).get("input"))


def correct(request, cost=0.0012):
    """A correct Agent API answer for the built-in case asked."""
    case = case_of(request)
    if case is None:
        return fakes.Reply(400, {"error": {"message": "unknown question"}})
    return fakes.Reply(body=fakes.advisor_answer(case, cost=cost))


class Gauge:
    """Counts requests being handled at the same time (the peak is what we assert)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


def slow(gauge, delay_of, answer=correct):
    """A reply function that holds each request for delay_of(request) seconds, counted by gauge."""
    def reply(request):
        with gauge:
            time.sleep(delay_of(request))
            return answer(request)
    return reply


class StatusError(Exception):
    """An exception shaped like an SDK / urllib HTTP error."""

    def __init__(self, status, headers=None):
        super().__init__(f"status {status}")
        self.status_code = status
        if headers is not None:
            self.headers = headers


# ====================================================================== --concurrency

def test_concurrency_rows_written_in_plan_order_when_completion_is_reversed(tmp_path):
    models = ["a", "b"]
    plan = regression.plan_rows(models, CASE_IDS, 1)
    position = {(model, case_id): n for n, (model, case_id, _) in enumerate(plan)}
    gauge = Gauge()
    everyone = threading.Barrier(len(plan))

    def delay_of(request):
        # The replies wait until all eight requests are in (a loaded machine may start them
        # over more than a reply's spacing), then the later a row is in the plan, the sooner
        # its reply comes back, 0.15 s apart.
        everyone.wait(timeout=30)
        return 0.15 * (len(plan) - position[(request.json["model"], case_of(request)["id"])])

    out = tmp_path / "run.json"
    with fakes.FakeServer(slow(gauge, delay_of)) as server:
        result = run(["--models", *models, "--concurrency", "8", "--out", out], server)
    assert result.returncode == 0, result.stderr
    # the console shows completion order: the reverse of the plan
    assert [line_key(line) for line in row_lines(result.stdout)] == plan[::-1]
    record = read(out)
    assert keys(record["runs"]) == plan
    assert all(row["passed"] for row in record["runs"])
    assert record["summary"]["complete"] is True and record["summary"]["exit_code"] == 0
    assert gauge.peak == 8
    assert "concurrency" not in record["config"]


def test_concurrency_never_exceeds_n_in_flight(tmp_path):
    models = ["a", "b"]
    gauge = Gauge()
    out = tmp_path / "run.json"
    with fakes.FakeServer(slow(gauge, lambda request: 0.1)) as server:
        result = run(["--models", *models, "--repeats", "2", "--concurrency", "3", "--out", out], server)
        count = server.count
    assert result.returncode == 0, result.stderr
    assert count == 16
    assert 2 <= gauge.peak <= 3
    record = read(out)
    assert keys(record["runs"]) == regression.plan_rows(models, CASE_IDS, 2)
    assert record["summary"]["complete"] is True


def test_concurrency_is_faster_than_sequential(tmp_path):
    latency, rows = 0.3, 16
    gauge = Gauge()
    out = tmp_path / "run.json"
    with fakes.FakeServer(slow(gauge, lambda request: latency)) as server:
        result = run(["--models", "a", "b", "--repeats", "2", "--concurrency", "8", "--out", out], server)
        arrivals = list(server.arrivals)
    assert result.returncode == 0, result.stderr
    assert len(read(out)["runs"]) == rows
    # On the server's clock, so the start-up (the SDK import takes seconds on a loaded machine)
    # is left out: sequential requests would arrive (rows - 1) * latency = 4.5 s apart end to
    # end, eight at a time take one latency (0.3 s). Loose on purpose.
    span = arrivals[-1] - arrivals[0]
    assert span < 0.3 * (rows - 1) * latency, span


def test_concurrency_first_error_stops_new_requests_but_keeps_in_flight_rows(tmp_path):
    gauge = Gauge()

    def reply(request):
        with gauge:
            if request.number == 2:
                return fakes.Reply(500, {"error": {"message": "fake 500"}})
            time.sleep(0.8)
            return correct(request)

    out = tmp_path / "run.json"
    with fakes.FakeServer(reply) as server:
        result = run(["--concurrency", "4", "--out", out], server)
        time.sleep(0.2)  # anything sent late would have arrived by now
        count = server.count
    assert result.returncode == 2, result.stderr
    assert count == 4  # the 4 in flight; nothing started after the error was seen
    record = read(out)
    rows = record["runs"]
    assert len(rows) == 4
    errors = [row for row in rows if row["error"] is not None]
    assert len(errors) == 1 and errors[0]["error_status"] == 500
    assert errors[0]["reasons"] == ["execution_error"]
    assert sum(row["passed"] for row in rows) == 3  # the in-flight rows finished and were recorded
    plan = regression.plan_rows(DEFAULT_MODELS, CASE_IDS, 1)
    assert keys(rows) == [key for key in plan if key in set(keys(rows))]
    assert record["summary"]["exit_code"] == 2
    assert record["summary"]["complete"] is False
    assert "execution error" in record["summary"]["stopped"]
    assert "500" in record["summary"]["stopped"]


# ====================================================================== --retries: units

@pytest.mark.parametrize("status, expected", [
    (400, False), (401, False), (403, False), (404, False), (409, False), (422, False),
    (429, True), (500, True), (502, True), (503, True), (504, True),
])
def test_transient_statuses(status, expected):
    assert regression.transient(StatusError(status)) is expected


@pytest.mark.parametrize("exc, expected", [
    (TimeoutError("timed out"), True),
    (ConnectionResetError("reset"), True),
    (ValueError("not JSON"), False),
])
def test_transient_exceptions(exc, expected):
    assert regression.transient(exc) is expected


def test_transient_sdk_errors():
    import perplexity
    request = httpx.Request("POST", "http://127.0.0.1/v1/responses")
    assert regression.transient(perplexity.APITimeoutError(request=request)) is True
    assert regression.transient(perplexity.APIConnectionError(request=request)) is True
    unauthorized = perplexity.AuthenticationError("no", response=httpx.Response(401, request=request), body=None)
    assert regression.transient(unauthorized) is False
    limited = perplexity.RateLimitError("slow down", response=httpx.Response(429, request=request), body=None)
    assert regression.transient(limited) is True


def test_retry_after_seconds_from_response_headers():
    exc = SimpleNamespace(response=SimpleNamespace(headers=httpx.Headers({"Retry-After": "7"})))
    assert regression.retry_after(exc) == 7.0


def test_retry_after_seconds_from_dict_headers():
    assert regression.retry_after(StatusError(429, {"retry-after": "2.5"})) == 2.5


def test_retry_after_http_date_a_few_seconds_ahead():
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    wait = regression.retry_after(StatusError(503, {"retry-after": when}))
    assert wait is not None and 3.5 <= wait <= 5.01


def test_retry_after_http_date_in_the_past_is_zero():
    when = email.utils.formatdate(time.time() - 60, usegmt=True)
    assert regression.retry_after(StatusError(503, {"retry-after": when})) == 0.0


@pytest.mark.parametrize("headers", [None, {}, {"retry-after": ""}, {"retry-after": "soon"}])
def test_retry_after_absent_or_unreadable_is_none(headers):
    assert regression.retry_after(StatusError(429, headers)) is None


def test_backoff_is_exponential_capped_and_jittered():
    exc = StatusError(500)
    full = lambda: 1.0  # noqa: E731
    half = lambda: 0.5  # noqa: E731
    waits = [regression.backoff(attempt, exc, full) for attempt in range(1, 12)]
    assert waits[:3] == [regression.BACKOFF_BASE_SECONDS * factor for factor in (1, 2, 4)]
    assert waits == sorted(waits)
    assert max(waits) == regression.BACKOFF_CAP_SECONDS == waits[-1]
    assert regression.backoff(3, exc, half) == waits[2] / 2
    assert regression.backoff(40, exc, half) == regression.BACKOFF_CAP_SECONDS / 2


def test_backoff_prefers_retry_after():
    exc = StatusError(429, {"retry-after": "3"})
    assert regression.backoff(1, exc, lambda: 0.5) == 3.0


class Flaky:
    """A provider that raises the queued exceptions first, then answers."""

    name = "flaky"

    def __init__(self, *errors):
        self.errors, self.calls = list(errors), 0

    def request(self, model, suite, case, repeat=0):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"ok": True}


def test_send_retries_transient_with_backoff():
    sleeps = []
    provider = Flaky(StatusError(503), TimeoutError("slow"))
    raw, attempts = regression.send_request(provider, "m", {}, {"id": "c"}, 0, retries=3,
                                    sleep=sleeps.append, jitter=lambda: 1.0)
    assert (raw, attempts, provider.calls) == ({"ok": True}, 3, 3)
    assert sleeps == [1.0, 2.0]


def test_send_default_jitter_varies_within_bounds():
    sleeps = []
    provider = Flaky(*[StatusError(502) for _ in range(8)])
    regression.send_request(provider, "m", {}, {"id": "c"}, 0, retries=8, sleep=sleeps.append)
    assert 0.5 * regression.BACKOFF_BASE_SECONDS <= sleeps[0] <= regression.BACKOFF_BASE_SECONDS
    assert all(wait <= regression.BACKOFF_CAP_SECONDS for wait in sleeps)
    assert len(set(sleeps)) > 1


def test_send_never_retries_permanent_errors():
    sleeps = []
    provider = Flaky(StatusError(401))
    with pytest.raises(StatusError) as raised:
        regression.send_request(provider, "m", {}, {"id": "c"}, 0, retries=5, sleep=sleeps.append)
    assert provider.calls == 1 and sleeps == [] and raised.value.attempts == 1


# ====================================================================== --retries: end to end

def sdk_send(server, retries):
    """send_request through the real SDK against the fake server, with the sleep injected:
    (raw, attempts, the waits send asked for). The wait is asserted, never slept."""
    import perplexity
    client = perplexity.Perplexity(api_key=KEY, base_url=server.url, max_retries=0, timeout=10)
    provider = regression.PerplexityProvider(client, regression.deadline_seconds(10))
    sleeps = []
    try:
        raw, attempts = regression.send_request(provider, "a", regression.builtin_suite(),
                                        regression.builtin_case(regression.CASES[0]), 0, retries,
                                        sleep=sleeps.append, jitter=lambda: 1.0)
    finally:
        client.close()
    return raw, attempts, sleeps


def test_retry_429_honours_retry_after_seconds():
    def reply(request):
        if request.number == 1:
            # 7 s: longer than the first backoff (1 s here), so only Retry-After explains the wait
            return fakes.Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "7"})
        return correct(request)

    with fakes.FakeServer(reply) as server:
        raw, attempts, sleeps = sdk_send(server, retries=2)
        count = server.count
    assert sleeps == [7.0]
    assert attempts == 2 and count == 2
    assert regression.PerplexityProvider.parse(raw).final_text


def test_retry_honours_http_date_retry_after():
    def reply(request):
        if request.number == 1:
            # an HTTP date has whole seconds: 5 s ahead means a wait of more than 4 s, longer
            # than the first backoff (1 s here)
            when = email.utils.formatdate(time.time() + 5, usegmt=True)
            return fakes.Reply(503, {"error": {"message": "busy"}}, headers={"Retry-After": when})
        return correct(request)

    with fakes.FakeServer(reply) as server:
        raw, attempts, sleeps = sdk_send(server, retries=1)
        count = server.count
    assert len(sleeps) == 1 and 3.0 <= sleeps[0] <= 5.0, sleeps
    assert attempts == 2 and count == 2


def test_retry_500_then_success_recovers(tmp_path):
    out = tmp_path / "run.json"
    def reply(request):
        if request.number == 1:
            return fakes.Reply(500, {"error": {"message": "boom"}})
        return correct(request)

    with fakes.FakeServer(reply) as server:
        result = run(["--models", "a", "--retries", "1", "--out", out], server)
        count = server.count
    assert result.returncode == 0, result.stderr
    assert count == len(CASE_IDS) + 1
    record = read(out)
    assert record["runs"][0]["attempts"] == 2 and record["runs"][0]["passed"] is True
    assert record["summary"]["exit_code"] == 0


def test_retry_401_is_never_retried(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(fakes.failing(401)) as server:
        result = run(["--models", "a", "--retries", "3", "--out", out], server)
        time.sleep(0.1)
        count = server.count
    assert result.returncode == 2
    assert count == 1
    row, = read(out)["runs"]
    assert row["error_status"] == 401 and row["attempts"] == 1


def test_retries_exhausted_is_an_error_row(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(fakes.failing(503, headers={"Retry-After": "0"})) as server:
        result = run(["--models", "a", "--retries", "2", "--out", out], server)
        count = server.count
    assert result.returncode == 2
    assert count == 3
    record = read(out)
    row, = record["runs"]
    assert row["error_status"] == 503 and row["attempts"] == 3
    assert row["reasons"] == ["execution_error"]
    assert record["summary"]["exit_code"] == 2


@pytest.mark.parametrize("status", [429, 500])
def test_default_retries_zero_never_repeats(tmp_path, status):
    out = tmp_path / "run.json"
    with fakes.FakeServer(fakes.failing(status, headers={"Retry-After": "0"})) as server:
        result = run(["--models", "a", "--out", out], server)
        time.sleep(0.1)
        count = server.count
    assert result.returncode == 2
    assert count == 1
    row, = read(out)["runs"]
    assert row["error_status"] == status and row.get("attempts", 1) == 1


# ====================================================================== --resume

MODELS5 = ["a", "b", "c", "d", "e"]


def test_resume_after_sigkill_completes_without_paying_twice(tmp_path):
    settings = {"delay": 0.05}
    plan = regression.plan_rows(MODELS5, CASE_IDS, 2)
    assert len(plan) == 40

    def reply(request):
        time.sleep(settings["delay"])
        return correct(request)

    out = tmp_path / "run.json"
    other_suite = tmp_path / "other.json"
    other_suite.write_text(json.dumps({"name": "other", "instructions": "Say hi.",
                                       "cases": [{"id": "hi", "input": "hi", "contains": ["hi"]}]}))
    k = 12
    with fakes.FakeServer(reply) as server:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--models", *MODELS5, "--repeats", "2",
                                 "--out", str(out)], cwd=HERE, env=clean_env(server), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        watchdog = threading.Timer(30, proc.kill)
        watchdog.start()
        try:
            printed = [proc.stdout.readline() for _ in range(k)]
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        finally:
            watchdog.cancel()
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        time.sleep(0.2)  # a request sent just before the kill has arrived by now
        sent_before = server.count

        recovered = regression.load_record(out)
        rows = recovered["runs"]
        assert len(rows) >= k and len(rows) < len(plan)
        assert [line_key(line) for line in printed] == keys(rows)[:k]
        assert keys(rows) == plan[:len(rows)]
        finished = [row for row in rows if row["error"] is None]

        # a flag that would change the config is refused and leaves the record alone
        before = out.read_bytes()
        for flags, named in ((["--repeats", "3"], "repeats"), (["--models", "x"], "models"),
                             (["--suite", other_suite], None)):
            refused = run(["--resume", out, *flags], server)
            assert refused.returncode == 2, flags
            message = refused.stderr.strip().splitlines()[-1]
            assert "config key" in message
            if named:
                assert f"'{named}'" in message
            else:
                assert re.search(r"'(cases|instructions|tool|tools|response_format|sources)'", message)
            assert out.read_bytes() == before
        refused = run(["--resume", out, "--out", tmp_path / "elsewhere.json"], server)
        assert refused.returncode == 2 and "--out" in refused.stderr
        assert out.read_bytes() == before and not (tmp_path / "elsewhere.json").exists()
        assert server.count == sent_before

        settings["delay"] = 0.0
        resumed = run(["--resume", out], server)
        assert resumed.returncode == 0, resumed.stderr
        assert server.count - sent_before == len(plan) - len(finished)

        single = tmp_path / "single.json"
        assert run(["--models", *MODELS5, "--repeats", "2", "--out", single], server).returncode == 0

    final = read(out)
    assert final["summary"]["complete"] is True and final["summary"]["exit_code"] == 0
    assert keys(final["runs"]) == plan
    assert [essence(row) for row in final["runs"]] == [essence(row) for row in read(single)["runs"]]
    assert final["config"] == read(single)["config"]
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_resume_reruns_only_errored_and_missing_rows(tmp_path):
    def reply(request):
        if request.number == 3:
            return fakes.Reply(500, {"error": {"message": "fake 500"}})
        return correct(request)

    out = tmp_path / "run.json"
    plan = regression.plan_rows(["a", "b"], CASE_IDS, 1)
    with fakes.FakeServer(reply) as server:
        first = run(["--models", "a", "b", "--out", out], server)
        assert first.returncode == 2
        rows = read(out)["runs"]
        assert len(rows) == 3 and rows[2]["error_status"] == 500
        sent_before = server.count
        resumed = run(["--resume", out], server)
        sent = server.count - sent_before
    assert resumed.returncode == 0, resumed.stderr
    assert sent == 1 + (len(plan) - 3)
    final = read(out)
    assert keys(final["runs"]) == plan
    assert all(row["passed"] and row["error"] is None for row in final["runs"])
    # the two finished rows were kept as they were, not paid for again
    assert final["runs"][:2] == rows[:2]
    assert final["summary"]["complete"] is True and final["summary"]["exit_code"] == 0


def test_resume_with_out_is_a_usage_error(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(correct) as server:
        assert run(["--models", "a", "--out", out], server).returncode == 0
        before, count = out.read_bytes(), server.count
        result = run(["--resume", out, "--out", tmp_path / "new.json"], server)
        assert server.count == count
    assert result.returncode == 2
    assert "--out" in result.stderr and "Traceback" not in result.stderr
    assert out.read_bytes() == before


# ====================================================================== --max-cost-usd

def test_max_cost_stops_once_spend_reaches_the_cap(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(correct) as server:
        # 0.0012 per row: 0.0012, 0.0024 < 0.003; 0.0036 >= 0.003 after the third row
        result = run(["--max-cost-usd", "0.003", "--out", out], server)
        count = server.count
    assert result.returncode == 2
    assert count == 3
    record = read(out)
    assert len(record["runs"]) == 3
    assert record["summary"]["complete"] is False and record["summary"]["exit_code"] == 2
    assert "max-cost" in record["summary"]["stopped"]
    assert "max-cost" in result.stderr


def test_max_cost_exact_reach_stops(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(correct) as server:
        result = run(["--max-cost-usd", "0.0024", "--out", out], server)
        count = server.count
    assert result.returncode == 2
    assert count == 2  # 0.0024 reaches 0.0024: no third request


def test_max_cost_without_reported_cost_stops_after_first_row(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(lambda request: correct(request, cost=None)) as server:
        result = run(["--max-cost-usd", "1", "--out", out], server)
        count = server.count
    assert result.returncode == 2
    assert count == 1
    record = read(out)
    assert len(record["runs"]) == 1 and record["runs"][0]["cost_usd"] is None
    stopped = record["summary"]["stopped"]
    assert "no cost" in stopped and "max-cost" in stopped


# ====================================================================== --shard and --merge

def test_shards_partition_the_plan_and_merge_equals_a_single_run(tmp_path, capsys):
    full_plan = regression.plan_rows(DEFAULT_MODELS, CASE_IDS, 2)
    shards = [tmp_path / f"shard{i}.json" for i in (1, 2, 3)]
    single, merged = tmp_path / "single.json", tmp_path / "merged.json"
    with fakes.FakeServer(correct) as server:
        for i, path in enumerate(shards, 1):
            result = run(["--repeats", "2", "--shard", f"{i}/3", "--out", path], server)
            assert result.returncode == 0, result.stderr
        assert server.count == len(full_plan)
        assert run(["--repeats", "2", "--out", single], server).returncode == 0
        other = tmp_path / "other-config.json"
        assert run(["--repeats", "1", "--shard", "1/3", "--out", other], server).returncode == 0

    parts = [keys(read(path)["runs"]) for path in shards]
    assert all(parts)
    assert sum(len(part) for part in parts) == len(full_plan)
    assert set().union(*map(set, parts)) == set(full_plan)
    for path, part in zip(shards, parts):
        shard_summary = read(path)["summary"]
        assert shard_summary["complete"] is True and shard_summary["exit_code"] == 0
        assert shard_summary["rows"] == len(part)

    result = run(["--merge", merged, *shards])
    assert result.returncode == 0, result.stderr
    record = read(merged)
    assert record["summary"]["complete"] is True and record["summary"]["exit_code"] == 0
    assert [without_seconds(row) for row in record["runs"]] == \
        [without_seconds(row) for row in read(single)["runs"]]
    assert stat.S_IMODE(os.stat(merged).st_mode) == 0o600
    assert compare_runs.compare(read(single), record) == 0
    capsys.readouterr()

    refused = run(["--merge", tmp_path / "bad.json", shards[0], other])
    assert refused.returncode == 2 and "config" in refused.stderr
    assert not (tmp_path / "bad.json").exists()

    twice = run(["--merge", tmp_path / "twice.json", shards[0], shards[0]])
    assert twice.returncode == 2
    assert not (tmp_path / "twice.json").exists()

    partial = tmp_path / "partial.json"
    incomplete = run(["--merge", partial, shards[0], shards[1]])
    assert incomplete.returncode == 2
    record = read(partial)
    assert record["summary"]["complete"] is False and record["summary"]["exit_code"] == 2
    assert len(record["runs"]) == len(parts[0]) + len(parts[1])


# ====================================================================== progress

def test_progress_plain_lines_when_stderr_is_not_a_terminal(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(correct) as server:
        result = run(["--out", out], server)
    assert result.returncode == 0
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
    lines = row_lines(result.stdout)
    assert [line_key(line) for line in lines] == regression.plan_rows(DEFAULT_MODELS, CASE_IDS, 1)
    assert all("PASS" in line and "\r" not in line for line in lines)


def test_progress_status_line_on_a_terminal(tmp_path):
    out = tmp_path / "run.json"
    master, slave = os.openpty()
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        with fakes.FakeServer(correct) as server:
            result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=HERE,
                                    env=clean_env(server), stdout=subprocess.PIPE, stderr=slave,
                                    text=True, timeout=60)
        os.close(slave)
        slave = None
        reader.join(5)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert result.returncode == 0
    status = b"".join(chunks).decode("utf-8", "replace")
    assert "[8/8]" in status and "passed" in status and "ETA" in status
    assert "\r" in status  # a live line that redraws itself
    assert len(row_lines(result.stdout)) == 8


# ====================================================================== redaction

CARD = "4111 1111 1111 1111"  # Luhn-valid (a well-known test number)
NOT_A_CARD = "4111 1111 1111 1112"  # fails the Luhn check
BEARER = "abcDEF123456789xyzTOKEN"
SK_KEY = "sk-proj-ABCDEFGHIJKLMNOP1234"
EMAIL = "alice.smith@example.com"


def chat_suite(tmp_path, case):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"name": "pii", "instructions": "Answer briefly.", "cases": [case]}))
    return path


def chat_run(tmp_path, answer, case, *flags):
    out = tmp_path / "run.json"
    suite = chat_suite(tmp_path, case)
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response(answer))) as server:
        result = run(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                      "--suite", suite, "--out", out, *flags], key=None)
    return result, out


def test_redact_pii_masks_stored_text_after_checks_ran_on_the_original(tmp_path):
    answer = (f"Your card {CARD} is on file, reference {NOT_A_CARD}. Authorization: Bearer {BEARER} "
              f"key {SK_KEY} contact {EMAIL}.")
    # the forbidden phrase occurs only inside the real card number: masked in storage, so
    # the failure can only come from checks on the original answer
    case = {"id": "leak", "input": "What do you have on file?", "excludes": ["1111 1111 1111"]}
    result, out = chat_run(tmp_path, answer, case, "--redact-pii")
    assert result.returncode == 1, result.stderr
    data = out.read_bytes()
    for secret in (CARD, CARD.replace(" ", ""), BEARER, SK_KEY, EMAIL):
        assert secret.encode() not in data, secret
    row, = read(out)["runs"]
    assert row["reasons"] == ["forbidden_text_present"] and row["passed"] is False
    assert "REDACTED" in row["answer_text"]
    assert NOT_A_CARD in row["answer_text"]  # a Luhn-invalid number is not a card


def test_redact_regex_masks_a_custom_pattern(tmp_path):
    answer = "Order ORDER-123456 ships today."
    case = {"id": "order", "input": "Where is my order?", "contains": ["ships today"]}
    result, out = chat_run(tmp_path, answer, case, "--redact", "ORDER-[0-9]{6}")
    assert result.returncode == 0, result.stderr
    assert b"ORDER-123456" not in out.read_bytes()
    row, = read(out)["runs"]
    assert row["passed"] is True
    assert "[REDACTED]" in row["answer_text"] and "ships today" in row["answer_text"]


def test_invalid_redact_regex_is_a_usage_error(tmp_path):
    out = tmp_path / "run.json"
    result = run(["--provider", "echo", "--redact", "(", "--out", out])
    assert result.returncode == 2
    assert "--redact" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("text", [
    f"card {CARD} cvv 123",
    f"{CARD.replace(' ', '-')}",
    f"{CARD.replace(' ', '')}.",
])
def test_redact_pii_masks_card_numbers_in_context(text):
    masked = regression.redactor(pii=True)(text)
    assert CARD.replace(" ", "") not in re.sub(r"\D", "", masked)


@pytest.mark.parametrize("text", [
    "ref-4111111111111111", "4111111111111111-exp", "4111-1111-1111-1111-", "4111.1111.1111.1111",
    "4111_1111_1111_1111", "ref: 9999-4111-1111-1111-1111", "4111-1111-1111-1111-12-28 exp",
    "card 12 4111 1111 1111 1111", "\uff14\uff11\uff11\uff11.1111.1111.1111",
])
def test_redact_pii_masks_a_card_touching_a_dash_or_grouped_by_dots_or_inside_longer_groups(text):
    # a card is masked wherever its digit groups stand: touching a dash, grouped by dots or
    # underscores, or among other digit groups (before, the run had to be exactly the card)
    masked = regression.redactor(pii=True)(text)
    assert "[REDACTED:card]" in masked
    assert "4111111111111111" not in regression.text_form(re.sub(r"[\s._-]", "", masked))


def test_redact_pii_keeps_long_digit_runs_and_invalid_numbers_as_written():
    for text in ["id 12345678901234567890123", "99994111111111111111", "v1.2.3.4 build 20261204",
                 f"ref {NOT_A_CARD.replace(' ', '-')}-exp"]:
        assert regression.redactor(pii=True)(text) == text


def _ledger(rng):
    day = lambda: f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"  # noqa: E731
    phone = lambda: f"{rng.randint(200, 999)}-{rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"  # noqa: E731
    amount = lambda: f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d}"  # noqa: E731
    return rng.choice([
        "\n".join(f"{day()} {amount()}" for _ in range(4)), " ".join(f"{day()} {amount()}" for _ in range(4)),
        "\n".join(phone() for _ in range(3)), " ".join(phone() for _ in range(3)),
        f"{day()} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {day()} {amount()}",
        " ".join(str(rng.randint(10 ** 5, 10 ** 6)) for _ in range(4))])


def test_redact_pii_keeps_dates_amounts_and_phone_numbers_that_happen_to_pass_luhn():
    # digits joined across lines or grouped as dates, amounts or phone numbers are no card: a
    # window of them passes the Luhn check one time in ten, and masking it lost honest evidence
    rng = random.Random(20261204)
    texts = [_ledger(rng) for _ in range(400)]
    assert [text for text in texts if regression.redactor(pii=True)(text) != text] == []


def test_redact_pii_keeps_the_evidence_of_an_honest_statement_through_the_cli(tmp_path):
    answer = "Your payments:\n2024-03-15 10.50\n2024-03-16 12.75\nSupport: 415-555-0132, 312-555-0123"
    case = {"id": "ledger", "input": "List my payments.", "contains": ["2024-03-16 12.75", "312-555-0123"]}
    result, out = chat_run(tmp_path, answer, case, "--redact-pii")
    assert result.returncode == 0, result.stderr
    row, = read(out)["runs"]
    assert row["answer_text"] == answer and "REDACTED" not in out.read_text(encoding="utf-8")


def test_redact_pii_of_a_long_unbroken_answer_finishes_through_the_cli(tmp_path):
    # the e-mail rule tried every start inside a run of letters and digits: a 200 kB base64-like
    # answer took many minutes under --redact-pii (quadratic); now one try per run
    blob = "QUJD" * 50_000 + " 4111-1111-1111-1111 x" + "1-" * 50_000
    case = {"id": "blob", "input": "Send the file.", "contains": ["QUJD"]}
    result, out = chat_run(tmp_path, blob, case, "--redact-pii")
    assert result.returncode == 0, result.stderr
    row, = read(out)["runs"]
    assert "[REDACTED:card]" in row["answer_text"] and "4111-1111" not in row["answer_text"]


def test_redact_pii_masks_a_card_followed_by_a_short_number():
    # A card number followed by its CVV (or any 1-3 digit group) is still a card number.
    masked = regression.redactor(pii=True)(f"card {CARD} 123")
    assert CARD not in masked


def test_redact_pii_keeps_luhn_invalid_numbers():
    assert regression.redactor(pii=True)(f"ref {NOT_A_CARD}") == f"ref {NOT_A_CARD}"


# ====================================================================== secrets

def test_api_key_never_written_and_record_is_0600(tmp_path):
    def echo_auth(request):
        auth = request.headers.get("Authorization", "")
        case = case_of(request)
        url = fakes.RFC_URL.format(case["rfc"])
        return fakes.Reply(body=fakes.agent_response(f"you sent {auth}", urls=[url]))

    def unauthorized(request):
        auth = request.headers.get("Authorization", "")
        key = auth.split()[-1] if auth else ""
        return fakes.Reply(401, {"error": {"message": f"invalid key {key} ({auth})", "type": "auth"}})

    runs = tmp_path / "runs"
    runs.mkdir()
    outputs = []
    with fakes.FakeServer(echo_auth) as server:
        result = run(["--models", "a", "--out", runs / "echoed.json", "--markdown", runs / "echoed.md",
                      "--junit", runs / "echoed.xml", "--html", runs / "echoed.html"], server)
        assert result.returncode == 1, result.stderr
        assert KEY in server.requests[0].headers["Authorization"]  # the fake really saw (and echoed) it
        outputs.append(result)
    with fakes.FakeServer(unauthorized) as server:
        result = run(["--models", "a", "--out", runs / "denied.json", "--markdown", runs / "denied.md",
                      "--html", runs / "denied.html"], server)
        assert result.returncode == 2
        outputs.append(result)

    denied = read(runs / "denied.json")["runs"][0]
    assert denied["error_status"] == 401 and "invalid key" in (denied.get("error_message") or "")
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert len(files) == 7
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    for result in outputs:
        assert KEY not in result.stdout and KEY not in result.stderr


def test_api_key_cut_by_error_message_truncation_is_not_stored(tmp_path):
    """An error body that echoes the key where the stored error message is cut off must
    not leave a prefix of the key on disk."""
    marker = "MARKER-7f3a"
    settings = {"message": marker}

    def reply(request):
        key = request.headers.get("Authorization", "").split()[-1]
        return fakes.Reply(401, {"error": {"message": settings["message"].replace("{key}", key), "type": "auth"}})

    with fakes.FakeServer(reply) as server:
        probe = tmp_path / "probe.json"
        assert run(["--models", "a", "--out", probe], server).returncode == 2
        stored = read(probe)["runs"][0]["error_message"]
        offset = stored.index(marker)  # where the endpoint's message starts in the stored text
        assert len(stored) < 400, "the stored error message is unexpectedly long"
        # put the key across the point where the stored message is cut (500 characters)
        settings["message"] = "x" * (500 - offset - 20) + "{key}"
        out = tmp_path / "run.json"
        assert run(["--models", "a", "--out", out], server).returncode == 2
    message = read(out)["runs"][0]["error_message"]
    assert message.startswith(stored[:offset]) and len(message) >= 480
    data = out.read_bytes()
    assert KEY[:12].encode() not in data, message[-40:]


# ====================================================================== resume without flags

def truncate_record(path, keep):
    """Rewrite a record as if the run had been cut after `keep` rows (a torn tail, as a crash leaves)."""
    text = path.read_text()
    record = json.loads(text)
    cut = text.index(json.dumps(record["runs"][keep], ensure_ascii=False)) if keep < len(record["runs"]) else len(text)
    path.write_text(text[:cut])
    assert len(regression.load_record(str(path))["runs"]) == keep


def test_resume_of_an_openai_record_needs_no_flags(tmp_path):
    """`--resume FILE` alone continues against the record's own endpoint (no --provider, no --base-url)."""
    answer = lambda body: fakes.chat_response("Could you share your order ID?")  # noqa: E731
    with fakes.FakeServer(fakes.chat(answer)) as server:
        out = tmp_path / "run.json"
        first = run(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "a", "b",
                     "--suite", HERE / "suites" / "agent-tools.json", "--out", out])
        assert first.returncode == 0, first.stderr  # asking for the id passes every case
        complete = read(out)
        truncate_record(out, 2)
        before = server.count
        resumed = run(["--resume", out])
        assert resumed.returncode == 0, resumed.stderr
        assert server.count - before == len(complete["runs"]) - 2
        final = read(out)
        assert [essence(row) for row in final["runs"]] == [essence(row) for row in complete["runs"]]
        assert final["provider"] == complete["provider"]


def test_resume_of_a_replay_record_replays_again_and_never_goes_live(tmp_path):
    source, regraded = tmp_path / "echo.json", tmp_path / "regraded.json"
    assert run(["--provider", "echo", "--suite", HERE / "suites" / "support-guardrails.json",
                "--out", source], key=None).returncode == 1
    assert run(["--provider", "replay", "--replay", source, "--out", regraded], key=None).returncode == 1
    complete = read(regraded)
    truncate_record(regraded, 1)
    resumed = run(["--resume", regraded], key=None)  # no key: a live provider would be refused
    assert resumed.returncode == 1, resumed.stderr
    final = read(regraded)
    assert [essence(row) for row in final["runs"]] == [essence(row) for row in complete["runs"]]
    assert final["replayed_from"] == complete["replayed_from"]
    refused = run(["--resume", regraded, "--provider", "perplexity"])
    assert refused.returncode == 2 and "replay" in refused.stderr


# ====================================================================== hostile paths and lifecycle

GUARDRAILS = HERE / "suites" / "support-guardrails.json"


def bounded_cli(args, cwd, script="regression.py", timeout=10):
    """`python -W error SCRIPT ARGS` with its memory capped at 1 GB, so a reader that never
    stops (a device) fails fast instead of filling the machine's memory; forked from a -W error
    zygote (fakes.run_script), the cap set before the script starts, stdin /dev/null."""
    return fakes.run_script(args, cwd, clean_env(key=None), timeout=timeout, script=script,
                            flags=("-W", "error"), limits={"RLIMIT_AS": 1 << 30})


def test_a_fifo_or_device_named_as_a_file_is_one_line_and_exit_2(tmp_path):
    """Every command that reads a named file (a record, a suite, an existing --out it inspects)
    refuses a FIFO (reading one blocks forever) and a device (/dev/zero never ends: reading it
    once filled 24 GB of memory) with one line and exit 2, before reading a byte."""
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    record = tmp_path / "run.json"
    assert bounded_cli(["--provider", "echo", "--suite", GUARDRAILS, "--out", record], tmp_path).returncode == 1
    for args, script in [
            (["--resume", fifo], "regression.py"),
            (["--merge", tmp_path / "merged.json", record, fifo], "regression.py"),
            (["--provider", "echo", "--suite", fifo, "--out", tmp_path / "new.json"], "regression.py"),
            (["--report", "/dev/zero", "--markdown", tmp_path / "report.md"], "regression.py"),
            (["--provider", "replay", "--replay", "/dev/zero", "--out", tmp_path / "new.json"], "regression.py"),
            ([record, fifo], "compare_runs.py"),
            (["/dev/zero", record], "compare_runs.py")]:
        result = bounded_cli(args, tmp_path, script)
        output = (result.stdout + result.stderr).strip()
        assert result.returncode == 2, (args, output[-500:])
        assert "not a regular file" in output and "Traceback" not in output, (args, output[-500:])
        assert len(output.splitlines()) <= (1 if script == "compare_runs.py" else 3), output  # usage + error
    for hostile in (fifo, "/dev/full"):  # an existing --out is inspected for a continue hint: never read
        result = bounded_cli(["--provider", "echo", "--suite", GUARDRAILS, "--out", hostile], tmp_path)
        assert result.returncode == 2 and "already exists" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "merged.json").exists() and not (tmp_path / "new.json").exists()


def test_update_baseline_refuses_a_suite_edited_during_the_run(tmp_path):
    """The suite is edited while the run is in flight (the case now asks something else and
    must contain "goodbye"): the answer to the old question fails the case as it is now, so it
    is never approved as its baseline. The run says so (exit 2) and leaves the edit as it is."""
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({"name": "s", "instructions": "Answer briefly.", "cases": [
        {"id": "greet", "input": "Say hello", "expected_text": "", "min_similarity": 0.8,
         "contains": ["hello"]}]}, indent=2), encoding="utf-8")
    edited = suite.read_text(encoding="utf-8").replace("Say hello", "Say goodbye").replace('"hello"', '"goodbye"')

    def answer(body):
        suite.write_text(edited, encoding="utf-8")  # the user's editor saves while the request is out
        return fakes.chat_response("hello there")
    with fakes.FakeServer(fakes.chat(answer)) as server:
        result = run(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                      "--suite", suite, "--out", tmp_path / "run.json", "--update-baseline"], key=None)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "changed during the run" in result.stderr and "no baseline was filled" in result.stderr
    assert "Traceback" not in result.stderr
    assert suite.read_text(encoding="utf-8") == edited  # the user's edit kept, no baseline written into it
    assert read(tmp_path / "run.json")["summary"]["complete"] is True  # the paid row is kept


def test_a_shard_with_no_rows_is_refused_not_passed(tmp_path):
    """4 rows in 5 shards: shard 5/5 has nothing to run. It used to write an empty record and
    exit 0 with every model "qualified" on 0 of 0 rows: a pass that checked nothing."""
    for extra in ([], ["--dry-run"]):
        result = run(["--provider", "echo", "--suite", GUARDRAILS, "--models", "m", "--shard", "5/5",
                      "--out", tmp_path / "shard.json", *extra], key=None)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip().splitlines()[-1] == (
            "regression.py: error: --shard 5/5: this shard has no rows to run: the plan has 4 rows, "
            "so use at most 4 shards")
        assert not (tmp_path / "shard.json").exists()
    last = run(["--provider", "echo", "--suite", GUARDRAILS, "--models", "m", "--shard", "4/4",
                "--out", tmp_path / "shard.json"], key=None)
    assert last.returncode in (0, 1) and len(read(tmp_path / "shard.json")["runs"]) == 1


def test_compare_of_a_record_with_itself_is_not_comparable(tmp_path, capsys):
    """`compare_runs.py run.json run.json` (a typo, or AFTER a link to BEFORE) compared a run with
    itself and said "no new failure" (exit 0) for a run it never looked at twice: now exit 2."""
    record = tmp_path / "run.json"
    assert run(["--provider", "echo", "--suite", GUARDRAILS, "--out", record], key=None).returncode == 1
    (tmp_path / "after.json").symlink_to(record)
    line = ("NOT_COMPARABLE: {} and {} are the same file, so nothing would be compared; "
            "give the record of the run before and of the run after the change")
    result = fakes.run_script([record, record], tmp_path, clean_env(key=None), script="compare_runs.py")
    assert (result.returncode, result.stdout.strip().splitlines()) == (2, [line.format(record, record)])
    for args in ([record, tmp_path / "after.json"], ["--matrix", record, record]):
        assert compare_runs.main([str(arg) for arg in args]) == 2
        assert capsys.readouterr().out.strip().splitlines() == [line.format(*args[-2:])]
    copy = tmp_path / "copy.json"
    copy.write_bytes(record.read_bytes())
    assert compare_runs.main([str(record), str(copy)]) == 0  # two files: the comparison itself decides


def test_a_report_that_cannot_be_written_is_refused_before_the_run_or_says_how_to_finish(tmp_path):
    """A report into a missing folder used to fail only after the run (paid for, exit 2, no
    report and no word on the record): now it is refused before anything is sent. A folder
    that vanishes during the run still fails at the end, naming the complete record and the
    command that writes the report from it."""
    out, folder = tmp_path / "run.json", tmp_path / "reports"
    args = ["--provider", "openai", "--models", "m", "--suite", GUARDRAILS, "--out", out,
            "--junit", folder / "run.xml"]
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("ok"))) as server:
        before = run([*args, "--base-url", server.url + "/v1"], key=None)
        assert before.returncode == 2 and server.count == 0 and not out.exists()
        assert before.stderr.strip().splitlines()[-1] == (
            f"regression.py: error: --junit {folder / 'run.xml'}: {folder} is not an existing folder; "
            "create it first (nothing was run)")
        folder.mkdir()

        def vanishing(request):  # the folder goes while the run is in flight
            if folder.exists():
                folder.rmdir()
            return fakes.chat(lambda body: fakes.chat_response("ok"))(request)
        server.reply = vanishing
        after = run([*args, "--base-url", server.url + "/v1"], key=None)
    assert after.returncode == 2 and read(out)["summary"]["complete"] is True
    last = after.stderr.strip().splitlines()[-1]
    assert f"{out} is complete; write the rest with: {PROGRAM} --report {out} --junit " in last, \
        last


def test_resume_through_a_symlink_completes_the_real_record_and_keeps_the_link(tmp_path):
    """`--resume latest.json` where latest.json links to runs/real.json replaced the link by a
    new file and left runs/real.json torn, its finished rows never completed there."""
    (tmp_path / "runs").mkdir()
    real, link = tmp_path / "runs" / "real.json", tmp_path / "latest.json"
    assert run(["--provider", "echo", "--suite", GUARDRAILS, "--out", real], key=None).returncode == 1
    complete = read(real)
    truncate_record(real, 2)
    link.symlink_to(os.path.join("runs", "real.json"))
    resumed = run(["--resume", link], key=None)
    assert resumed.returncode == 1, resumed.stderr
    assert link.is_symlink() and os.readlink(link) == os.path.join("runs", "real.json")
    assert [essence(row) for row in read(real)["runs"]] == [essence(row) for row in complete["runs"]]
    assert sorted(os.listdir(tmp_path)) == ["latest.json", "runs"] and os.listdir(tmp_path / "runs") == ["real.json"]


def test_a_ci_job_with_regression_out_set_can_report_resume_and_merge_its_record(tmp_path):
    """REGRESSION_OUT set for a whole CI job named the record of its run, and then refused every
    later step on that record (--report, --resume, --merge; REGRESSION_SHARD too) with
    "--out: ... already exists" or "drop --out", a flag nobody gave: exit 2, no report."""
    env = {**clean_env(key=None), "REGRESSION_OUT": "run.json", "REGRESSION_SHARD": "1/2"}

    def cli(*args):
        return fakes.run_script([str(arg) for arg in args], tmp_path, env)
    assert cli("--provider", "echo", "--suite", GUARDRAILS).returncode == 1
    assert read(tmp_path / "run.json")["shard"] == "1/2"
    truncate_record(tmp_path / "run.json", 1)
    resumed = cli("--resume", "run.json")
    assert resumed.returncode == 1, resumed.stderr
    assert len(read(tmp_path / "run.json")["runs"]) == 2
    report = cli("--report", "run.json", "--markdown", "run.md")
    assert report.returncode == 0 and (tmp_path / "run.md").exists(), report.stderr
    merged = cli("--merge", "merged.json", "run.json")
    assert merged.returncode == 2 and "no record of shard(s) 2/2" in merged.stderr  # half a run: incomplete
    again = cli("--provider", "echo", "--suite", GUARDRAILS)  # a new run still never replaces the record
    assert again.returncode == 2 and "REGRESSION_OUT: run.json already exists" in again.stderr


def test_an_empty_file_name_is_one_line_and_exit_2_never_a_default(tmp_path, capsys):
    """`--suite "$SUITE"` with SUITE unset ran the built-in suite and gated on it (exit 0 when it
    passed); `--resume ""` or `--report ""` started a new full run; `--markdown ""` skipped
    the report. An empty file name is now refused with one line naming the flag, exit 2."""
    record = tmp_path / "run.json"
    assert run(["--provider", "echo", "--suite", GUARDRAILS, "--out", record], key=None).returncode == 1
    table = [["--provider", "echo", "--suite", "", "--out", "new.json"],
             ["--provider", "echo", "--resume", ""],
             ["--report", "", "--html", "report.html"],
             ["--provider", "echo", "--suite", GUARDRAILS, "--out", "new.json", "--markdown", ""],
             ["--merge", "merged.json", record, ""],
             ["--provider", "replay", "--replay", "", "--out", "new.json"],
             ["--provider", "echo", "--suite", GUARDRAILS, "--out", ""]]
    for argv, (code, out, err) in zip(table, fakes.cli_table([(argv, tmp_path) for argv in table],
                                                             env=clean_env(key=None))):
        flag = "--merge" if "--merge" in argv else next(argv[n - 1] for n, arg in enumerate(argv) if arg == "")
        assert (code, err.strip().splitlines()[-1]) == (
            2, f"regression.py: error: {flag}: the file name is empty (an unset variable?)"), (argv, out, err)
    assert sorted(os.listdir(tmp_path)) == ["run.json"]  # nothing ran, nothing was written
    with pytest.raises(SystemExit) as exit_:
        compare_runs.main([str(record), str(record), "--junit", ""])
    assert exit_.value.code == 2 and "--junit: the file name is empty" in capsys.readouterr().err


def test_update_baseline_never_rewrites_a_read_only_suite(tmp_path):
    """A suite its owner made read-only (chmod 444) was rewritten anyway (a rename ignores the
    mode), after the run. Now it is refused before any request, and a suite made read-only
    during the run is left as it is (one line, exit 2, the record kept)."""
    suite = tmp_path / "suite.json"
    text = json.dumps({"name": "s", "instructions": "Answer briefly.", "cases": [
        {"id": "greet", "input": "Say hello", "expected_text": "", "min_similarity": 0.8}]})
    suite.write_text(text, encoding="utf-8")
    suite.chmod(0o444)
    args = ["--provider", "openai", "--models", "m", "--suite", suite, "--out", tmp_path / "run.json",
            "--update-baseline"]
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("hello there"))) as server:
        refused = run([*args, "--base-url", server.url + "/v1"], key=None)
        assert refused.returncode == 2 and server.count == 0 and not (tmp_path / "run.json").exists()
        assert refused.stderr.strip().splitlines()[-1] == (
            f"regression.py: error: --update-baseline: {suite}: it is read-only (its owner may not write it); "
            "make it writable first; nothing was run")
        suite.chmod(0o644)

        def locking(body):  # the owner makes it read-only while the run is in flight
            suite.chmod(0o444)
            return fakes.chat_response("hello there")
        server.reply = fakes.chat(locking)
        late = run([*args, "--base-url", server.url + "/v1"], key=None)
    assert late.returncode == 2 and "read-only" in late.stderr and "Traceback" not in late.stderr
    assert suite.read_text(encoding="utf-8") == text and stat.S_IMODE(suite.stat().st_mode) == 0o444
    assert read(tmp_path / "run.json")["summary"]["complete"] is True
    assert sorted(os.listdir(tmp_path)) == ["run.json", "suite.json"]  # no temporary file left


def test_a_cap_or_price_too_large_or_small_to_write_out_is_refused(tmp_path):
    """--max-cost-usd 1e999999999 was accepted and written out in full: a billion digits in
    the record's run_options (a 1 GB record, 3 GB of memory). --price m=1e999999/1 overflowed
    on the first answer and made that paid row an execution error; --price m=0E-99999999/0
    wrote a 5 MB cost. Amounts are now 0 or 0.000000001 to 1000000000 dollars, else one line."""
    for value in ("1e999999999", "1e-999999999", "1e10"):
        result = bounded_cli(["--provider", "echo", "--suite", GUARDRAILS, "--max-cost-usd", value, "--dry-run"],
                             tmp_path)
        assert result.returncode == 2, result.stderr[-300:]
        assert result.stderr.strip().splitlines()[-1] == ("regression.py: error: --max-cost-usd must be from "
                                                          "0.000000001 to 1000000000 US dollars (at most 30 digits)")
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("hello"))) as server:
        args = ["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m", "--suite", GUARDRAILS]
        refused = run([*args, "--price", "m=1e999999/1", "--out", tmp_path / "a.json"], key=None)
        assert refused.returncode == 2 and server.count == 0 and "is not a price" in refused.stderr
        zero = run([*args, "--price", "m=0E-99999999/0", "--out", tmp_path / "b.json"], key=None)
    assert zero.returncode == 1, zero.stderr
    assert {row["cost_usd"] for row in read(tmp_path / "b.json")["runs"]} == {"0"}


def test_the_budget_stop_at_the_highest_cap_suggests_a_cap_the_cli_accepts(tmp_path):
    """The budget stop suggests twice the cap; at the highest cap (1000000000) that was a
    command the CLI itself refuses, and then the same cap, which pays nothing and stops again.
    With the spend past the highest cap, no continue command is offered: it says so."""
    out = tmp_path / "run.json"
    with fakes.FakeServer(lambda request: correct(request, cost=600_000_000)) as server:
        result = run(["--max-cost-usd", "1000000000", "--out", out], server)
        assert result.returncode == 2 and server.count == 2
        hint = result.stderr.strip().splitlines()[-1]
        assert hint.endswith("its spend is past the highest --max-cost-usd (1000000000), so no "
                             "cap lets it continue"), hint
        resumed = run(["--resume", out, "--max-cost-usd", "1000000000"], server)
        assert server.count == 2  # the resume sends nothing: the record already spent the cap
    assert resumed.returncode == 2 and "--max-cost-usd reached" in resumed.stderr  # refused by the cap, not the CLI


def test_update_baseline_of_a_golden_folder_another_process_holds_is_refused(tmp_path):
    """A golden suite is a folder; its lock is the folder's. Reading only regular files must
    not drop that lock: a second --update-baseline of the folder still refuses (exit 2)."""
    import fcntl
    import shutil
    folder = tmp_path / "golden"
    shutil.copytree(HERE / "suites" / "golden-support", folder)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a concurrent --update-baseline holds it
        result = run(["--provider", "echo", "--suite", folder, "--update-baseline", "--out", tmp_path / "r.json"],
                     key=None)
    finally:
        os.close(fd)
    assert result.returncode == 2 and "being written by another process" in result.stderr, result.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_model_with_no_row_in_a_shard_is_not_qualified_by_it(tmp_path):
    """One case, models A and B, two shards: shard 1/2 holds only A's row, and its record
    called B "qualified" (0 of 0 rows passed): a shard record read alone said ship B."""
    suite = tmp_path / "one.json"
    suite.write_text(json.dumps({"name": "one", "instructions": "x",
                                 "cases": [{"id": "c", "input": "hello", "contains": ["hello"]}]}))
    records = []
    for shard in ("1/2", "2/2"):
        out = tmp_path / f"shard-{shard[0]}.json"
        result = run(["--provider", "echo", "--suite", suite, "--models", "A", "B", "--shard", shard, "--out", out],
                     key=None)
        assert result.returncode == 0, result.stderr
        records.append(out)
    assert {model: stats["qualified"] for model, stats in read(records[0])["summary"]["models"].items()} == \
        {"A": True, "B": False}
    assert {model: stats["qualified"] for model, stats in read(records[1])["summary"]["models"].items()} == \
        {"A": False, "B": True}
    merged = run(["--merge", tmp_path / "all.json", *records], key=None)
    assert merged.returncode == 0 and all(stats["qualified"] for stats in
                                          read(tmp_path / "all.json")["summary"]["models"].values())
