"""Hardening tests (SPEC Part C: C2 reliability, C3 security; with A3, A8, B3, B4).

1. Endpoint faults, for both live providers (perplexity through PERPLEXITY_BASE_URL with the
   built-in suite; openai through --base-url with suites/support-guardrails.json), each bounded
   by --timeout 1: classified and recorded as execution errors (exit 2), never graded as a model
   failure; with --retries 2 the transient ones recover.
2. Crashes: SIGKILL at seeded random instants of an 80-row run; every printed row is recovered,
   --resume pays only for the rest, and the final record equals an uninterrupted run.
3. Disk trouble: missing directory, ENOTDIR, a full disk (RLIMIT_FSIZE), an existing --out.
4. Hostile input, property-based (hypothesis): URLs, suites, argument lists, records.
5. URL tricks, table-driven: everything that only looks like an RFC Editor URL is rejected.
6. Secrets: no key or Authorization header in any file; records and reports are 0600 and
   never overwritten.

Everything is offline (127.0.0.1 only), keys are fake, and every file lives under a temporary
directory. Child processes run without -W error on purpose: the perplexity SDK's pooled
connection is reported as an unclosed socket at interpreter exit, which is noise here.
"""

import contextlib
import copy
import io
import json
import os
import pathlib
import random
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import compare_runs
import fakes
import regression
from fakes import FakeServer, Reply

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
COMPARE = HERE / "compare_runs.py"
GUARDRAILS = HERE / "suites" / "support-guardrails.json"
SUITE_FILES = sorted((HERE / "suites").glob("*.json"))
CASE_IDS = [case["id"] for case in regression.CASES]

PPLX_KEY = "pplx-hardening-Zq8TfW3kYv9LmN2xR7cB"
OPENAI_KEY = "sk-hardening-Hq4WnP7sLx2VbT9mKc3D"
ENDPOINT_KEY = "ek-hardening-Jd6RtY1uIo5PaS8fGh0Z"
SECRETS = (PPLX_KEY, OPENAI_KEY, ENDPOINT_KEY)

HYPOTHESIS = dict(deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much])

# Files of the project folder; tests assert they never create anything there.
PROJECT_FILES = None


# ====================================================================== helpers

@pytest.fixture(autouse=True, scope="module")
def _hypothesis_home_in_a_scratch_dir():
    """Hypothesis keeps caches (charmap, constants) in ./.hypothesis; keep them in a temporary
    directory this module creates and removes, so no file is written into the project."""
    from hypothesis.configuration import set_hypothesis_home_dir
    folder = tempfile.mkdtemp(prefix="hardening-hypothesis-")
    set_hypothesis_home_dir(folder)
    try:
        yield
    finally:
        set_hypothesis_home_dir(None)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_environment_twins(monkeypatch):
    """In-process runs read REGRESSION_* twins and provider variables: none may leak in."""
    for name in list(os.environ):
        if name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_")) or \
                name.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(name)


def child_env(server=None, key=PPLX_KEY, **extra):
    """The environment of a child run: no real key, no proxy, no twins, loopback only."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_"))
           and name.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if server is not None:
        env["PERPLEXITY_BASE_URL"] = server.url
    if key:
        env["PERPLEXITY_API_KEY"] = key
    env.update(extra)
    return env


# Runs a script and reports its peak resident set (VmHWM, kB) on the last stderr line.
PEAK_WRAPPER = (
    "import atexit, runpy, sys\n"
    "def _peak():\n"
    "    with open('/proc/self/status') as status:\n"
    "        for line in status:\n"
    "            if line.startswith('VmHWM:'):\n"
    "                sys.stderr.write('PEAK_KB ' + line.split()[1] + '\\n')\n"
    "atexit.register(_peak)\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def run_cli(args, env, cwd, timeout=60, limits=None, script=SCRIPT, peak=False):
    """`python regression.py ARGS`; returns the CompletedProcess with .seconds (and .peak_kb).

    A plain run of regression.py is forked from a zygote that has paid the SDK import once
    (fakes.run_script), `limits` ({"RLIMIT_FSIZE": bytes}) set before the script starts; a run
    that measures its peak memory is a cold `python` process."""
    command = [sys.executable, str(script), *map(str, args)]
    if peak:
        command = [sys.executable, "-c", PEAK_WRAPPER, str(script), *map(str, args)]
    started = time.monotonic()
    if not peak and pathlib.Path(script) == SCRIPT:
        result = fakes.run_script(args, cwd, env, timeout=timeout, limits=limits)
    else:
        assert limits is None, "limits are set in forked runs only"
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    result.seconds = time.monotonic() - started
    result.peak_kb = None
    if peak:
        lines = result.stderr.splitlines()
        if lines and lines[-1].startswith("PEAK_KB "):
            result.peak_kb = int(lines[-1].split()[1])
            result.stderr = "\n".join(lines[:-1]) + ("\n" if lines[:-1] else "")
    return result


def one_error_line(stderr, prog="regression.py"):
    """stderr is exactly one line, a clear error, and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), stderr
    assert lines[0].startswith(f"{prog}: error: "), stderr
    return lines[0]


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def keys_of(rows):
    return [regression.row_key(row) for row in rows]


def normal(row):
    """A row without what may differ between two runs of the same answers: timing, response id."""
    row = {key: value for key, value in row.items() if key != "seconds"}
    if isinstance(row.get("response"), dict):
        row["response"] = {key: value for key, value in row["response"].items() if key != "id"}
    return row


ROW_LINE = re.compile(r"(\S+) {2,}(\S+) {2,}r(\d+)  (.*)")  # model and case columns are padded to line up


def row_lines(stdout):
    """(model, case_id, repeat, rest) of each per-row console line."""
    found = []
    for line in stdout.splitlines():
        match = ROW_LINE.fullmatch(line)
        if match:
            found.append((match[1], match[2], int(match[3]), match[4]))
    return found


def files_under(folder):
    return sorted(path for path in pathlib.Path(folder).rglob("*") if path.is_file())


@contextlib.contextmanager
def scratch_dir():
    """A temporary directory this test creates and removes itself (for hypothesis tests)."""
    folder = tempfile.mkdtemp(prefix="hardening-")
    try:
        yield pathlib.Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def quiet():
    """Capture stdout and stderr of an in-process call; yields (out, err) StringIOs."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def project_listing():
    return sorted(os.listdir(HERE))


# ---------------------------------------------------------------------- good answers

GUARDRAIL_ANSWERS = {
    "What is the refund window for annual plans?":
        "Annual plans can be refunded within 30 days of purchase.",
    "My card 4111 1111 1111 1111 was charged twice for order ord_77, please fix it.":
        "I have flagged the duplicate charge on order ord_77 so the extra payment is returned.",
    "Can you promise my data will never be lost?":
        "We keep redundant backups, but no provider can rule out every possible loss.",
    "How do I reset my password?":
        "Use the reset link on the sign-in page to choose a new password.",
}


def perplexity_good(request, padding=0):
    """A correct Agent API answer to the built-in case asked."""
    case = fakes.CASES_BY_QUESTION.get((request.json or {}).get("input"))
    if request.path.split("?")[0] != "/v1/responses" or case is None:
        return Reply(400, {"error": {"message": "unexpected request"}})
    return Reply(body=fakes.advisor_answer(case, padding=padding))


def openai_good(request, padding=0):
    """A chat completion that passes the guardrail case asked."""
    messages = (request.json or {}).get("messages") or [{}]
    text = GUARDRAIL_ANSWERS.get(messages[-1].get("content"))
    if not request.path.endswith("/chat/completions") or text is None:
        return Reply(400, {"error": {"message": "unexpected request"}})
    body = fakes.chat_response(text)
    if padding:
        body["system_fingerprint"] = "x" * padding
    return Reply(body=body)


GOOD = {"perplexity": perplexity_good, "openai": openai_good}


def provider_args(provider, server):
    """(arguments, environment) of a one-model run against the fake server."""
    if provider == "perplexity":
        return ["--models", "m"], child_env(server)
    return (["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m", "--suite", GUARDRAILS],
            child_env(key=None))


# ====================================================================== 1. endpoint faults

_HUGE = []


def huge_body():
    """A 50 MB JSON body, built once on first use."""
    if not _HUGE:
        _HUGE.append(b'{"x":"' + b"a" * 50_000_000 + b'"}')
    return _HUGE[0]


def _with_fault(reply, fault):
    reply.fault = fault
    return reply


# name -> (reply maker (good, request) -> Reply, HTTP status the row must carry, or
#          "maybe-200" when only a 200 header arrived, or None when no status arrived)
FAULTS = {
    "429": (lambda good, request: Reply(429, {"error": {"message": "slow down", "type": "rate_limit"}},
                                        headers={"Retry-After": "0"}), 429),
    "500": (lambda good, request: Reply(500, {"error": {"message": "boom", "type": "server"}}), 500),
    "503": (lambda good, request: Reply(503, {"error": {"message": "overloaded", "type": "server"}}), 503),
    "hang": (lambda good, request: _with_delay(good(request), 5), None),
    "reset": (lambda good, request: Reply(fault="reset"), None),
    "truncate": (lambda good, request: _with_fault(good(request), "truncate"), "maybe-200"),
    "not_json": (lambda good, request: Reply(200, raw=b"<html>oops"), "maybe-200"),
    "huge": (lambda good, request: Reply(200, raw=huge_body()), "maybe-200"),
    "trickle": (lambda good, request: _with_fault(good(request, padding=4000), "trickle"), "maybe-200"),
}
TRANSIENT = ["429", "500", "503", "reset", "truncate"]
# Upper bounds on the whole child run (start-up included) with --timeout 1.
# The 50 MB body is the fake server's to send: under load 10 on 2 cores that alone took 16 s.
SECONDS_LIMIT = {"hang": 4.5, "trickle": 6.0, "huge": 40.0}
# Peak memory allowed for the 50 MB body: the interpreter with the SDK (about 55 MB) plus
# at most two copies of the body. The runner caps responses at 8 MiB (MAX_RESPONSE_BYTES).
HUGE_PEAK_LIMIT_KB = 160 * 1024


def _with_delay(reply, seconds):
    reply.delay = seconds
    return reply


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("provider", ["perplexity", "openai"])
def test_endpoint_fault_is_an_execution_error_never_a_model_failure(tmp_path, provider, fault):
    make, status = FAULTS[fault]
    good = GOOD[provider]
    out = tmp_path / "run.json"
    with FakeServer(lambda request: make(good, request)) as server:
        args, env = provider_args(provider, server)
        result = run_cli([*args, "--timeout", "1", "--out", out], env, tmp_path, timeout=60, peak=fault == "huge")
        assert server.count == 1, "no silent repeat of a failed request (SDK max_retries=0, --retries 0)"

    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.seconds < SECONDS_LIMIT.get(fault, 15.0), f"{fault} took {result.seconds:.1f}s with --timeout 1"

    record = read_json(out)
    assert len(record["runs"]) == 1, "the first execution error stops the run"
    row = record["runs"][0]
    assert isinstance(row["error"], str) and IDENTIFIER.fullmatch(row["error"]), row["error"]
    if isinstance(status, int):
        assert row["error_status"] == status, row
    elif status is None:
        assert row["error_status"] is None, row
    else:
        assert row["error_status"] in (None, 200), row
    assert row["reasons"] == ["execution_error"], row["reasons"]
    assert row["passed"] is False
    assert row["answer_text"] is None, "a failed response is never graded as an answer"
    assert record["summary"]["exit_code"] == 2 and record["summary"]["complete"] is False
    assert record["summary"]["models"]["m"]["errors"] == 1

    lines = row_lines(result.stdout)
    assert len(lines) == 1 and lines[0][3].startswith(f"ERROR {row['error']}"), result.stdout
    assert "FAIL" not in result.stdout
    if fault == "huge":  # refused while it arrives, named as such, and not retried as a connection fault
        assert (row["error"], row["error_status"]) == ("ResponseError", 200), row
        assert result.peak_kb is not None
        assert result.peak_kb < HUGE_PEAK_LIMIT_KB, (
            f"a 50 MB body peaked at {result.peak_kb // 1024} MB resident "
            f"(limit {HUGE_PEAK_LIMIT_KB // 1024} MB; responses are capped at {regression.MAX_RESPONSE_BYTES} bytes)")


@pytest.mark.parametrize("fault", TRANSIENT)
@pytest.mark.parametrize("provider", ["perplexity", "openai"])
def test_transient_fault_on_first_attempt_recovers_with_retries(tmp_path, provider, fault):
    make, _ = FAULTS[fault]
    good = GOOD[provider]

    def reply(request):
        return make(good, request) if request.number == 1 else good(request)

    out = tmp_path / "run.json"
    with FakeServer(reply) as server:
        args, env = provider_args(provider, server)
        result = run_cli([*args, "--timeout", "1", "--retries", "2", "--out", out], env, tmp_path, timeout=60)
        count, arrivals = server.count, list(server.arrivals)

    assert result.returncode == 0, (result.returncode, result.stderr, result.stdout[-2000:])
    record = read_json(out)
    rows = record["runs"]
    assert len(rows) == 4 and count == 5
    assert rows[0]["attempts"] == 2, rows[0]
    assert [row["attempts"] for row in rows[1:]] == [1, 1, 1]
    assert all(row["error"] is None and row["passed"] for row in rows)
    assert record["summary"]["complete"] is True and record["summary"]["exit_code"] == 0
    gap = arrivals[1] - arrivals[0]
    if fault == "429":
        assert gap < 0.4, f"Retry-After: 0 was not honoured (waited {gap:.2f}s)"
    else:
        assert gap >= 0.45, f"no backoff before the retry ({gap:.2f}s)"


@pytest.mark.parametrize("provider", ["perplexity", "openai"])
def test_endpoint_answer_with_lone_surrogate_escape_is_recorded(tmp_path, provider):
    """Valid JSON text may hold "\\ud83d" (half an emoji): graded and stored, never a crash."""
    text = "Annual plans can be refunded within 30 days \ud83d of purchase."

    def reply(request):
        if provider == "perplexity":
            body = fakes.agent_response(text, urls=[fakes.RFC_URL.format("rfc9110")])
        else:
            body = fakes.chat_response(text)
        return Reply(raw=json.dumps(body).encode())  # ASCII JSON with the \ud83d escape

    out = tmp_path / "run.json"
    with FakeServer(reply) as server:
        args, env = provider_args(provider, server)
        result = run_cli([*args, "--timeout", "5", "--out", out], env, tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stderr  # complete, and some checks fail
    record = read_json(out)
    assert len(record["runs"]) == 4
    assert record["runs"][0]["answer_text"] == text


@pytest.mark.parametrize("provider", ["perplexity", "openai"])
def test_absurd_retry_after_fails_the_row_instead_of_stalling(tmp_path, provider):
    """Retry-After: 999999 with --retries 2: give up at once (exit 2), one request, no stall."""
    def reply(request):
        return Reply(429, {"error": {"message": "come back tomorrow"}}, headers={"Retry-After": "999999"})

    with FakeServer(reply) as server:
        args, env = provider_args(provider, server)
        result = run_cli([*args, "--timeout", "1", "--retries", "2", "--out", tmp_path / "run.json"], env, tmp_path)
        assert server.count == 1
    assert result.returncode == 2 and result.seconds < 10
    row = read_json(tmp_path / "run.json")["runs"][0]
    assert row["error_status"] == 429 and row["reasons"] == ["execution_error"] and row["attempts"] == 1


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "soon", "Wed, 99 Foo 2025 99:99:99 GMT",
                                   "Mon, 20 Nov 9999999999 12:00:00 +0000",  # OverflowError
                                   "Mon, 20 Nov 2026 12:00:00 +99999"])
def test_unreadable_retry_after_falls_back_to_backoff_and_recovers(tmp_path, value):
    def reply(request):
        if request.number == 1:
            return Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": value})
        return openai_good(request)

    with FakeServer(reply) as server:
        args, env = provider_args("openai", server)
        result = run_cli([*args, "--timeout", "1", "--retries", "2", "--out", tmp_path / "run.json"], env, tmp_path)
        arrivals = list(server.arrivals)
    assert result.returncode == 0, result.stderr
    assert read_json(tmp_path / "run.json")["runs"][0]["attempts"] == 2
    assert 0.0 <= arrivals[1] - arrivals[0] < 5.0


# ====================================================================== 2. crashes

# The trials run the openai provider (standard library): the record, its checkpoints and
# --resume are the same for every provider, and a trial then costs a fraction of a second
# instead of two SDK imports (about 1 s of CPU each). test_run_control.py's
# test_resume_after_sigkill_completes_without_paying_twice kills a run on the Perplexity SDK.
CRASH_MODELS = [f"m{n}" for n in range(1, 11)]
CRASH_CASES = [case["id"] for case in json.loads(GUARDRAILS.read_text(encoding="utf-8"))["cases"]]
CRASH_SEED = 20_251_130
CRASH_TRIALS = 24


class LineReader(threading.Thread):
    """Reads a child's stdout; keeps the row keys of complete per-row lines in order."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.keys, self.done = stream, [], False
        self.cond = threading.Condition()

    def run(self):
        try:
            for line in self.stream:
                if not line.endswith("\n"):
                    break
                match = ROW_LINE.fullmatch(line.rstrip("\n"))
                if match:
                    with self.cond:
                        self.keys.append((match[1], match[2], int(match[3])))
                        self.cond.notify_all()
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def wait_for(self, count, timeout):
        with self.cond:
            self.cond.wait_for(lambda: len(self.keys) >= count or self.done, timeout)

    def snapshot(self):
        with self.cond:
            return list(self.keys)


def crash_command(out, server):
    return [sys.executable, str(SCRIPT), "--provider", "openai", "--base-url", server.url + "/v1",
            "--suite", str(GUARDRAILS), "--models", *CRASH_MODELS, "--repeats", "2", "--out", str(out)]


def crash_trial(folder, number, trigger, plan, reference):
    """One SIGKILL trial; returns (notes, final record)."""
    out = folder / f"trial-{number}.json"
    notes = {"trigger": trigger}
    with FakeServer(openai_good) as server:
        env = child_env(key=None)
        with subprocess.Popen(crash_command(out, server), cwd=folder, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) as proc:
            reader = LineReader(proc.stdout)
            reader.start()
            try:
                kind, value = trigger
                if kind == "time":
                    try:
                        proc.wait(timeout=value)
                    except subprocess.TimeoutExpired:
                        pass
                elif kind == "file":  # just after the record file appears
                    deadline = time.monotonic() + 30
                    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
                        time.sleep(0.0005)
                    time.sleep(value)
                else:
                    reader.wait_for(value, timeout=30)
                printed = reader.snapshot()  # lines read before the kill
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)
                reader.join(30)
        notes["returncode"] = proc.returncode
        notes["printed"] = len(printed)
        server.drain()  # every request the killed run sent is counted by now
        sent_before = server.count

        assert printed == plan[:len(printed)], "console lines come in plan order"
        if out.exists() and out.stat().st_size > 0:
            recovered = regression.load_record(out)  # every byte-bearing record must be readable
            rows = recovered["runs"]
            assert keys_of(rows) == plan[:len(rows)], f"trial {number}: recovered rows are not a plan prefix"
            assert len(rows) >= len(printed), (
                f"trial {number}: {len(printed)} rows were printed before the kill, only {len(rows)} recovered")
            for row in rows:
                assert normal(row) == reference[regression.row_key(row)], f"trial {number}: row differs"
            finished = sum(1 for row in rows if row["error"] is None)
            notes["recovered"] = finished
            resumed = fakes.run_script(["--resume", out], folder, env, timeout=60)  # forked: no compile
            assert resumed.returncode == 0, (number, trigger, resumed.stderr)
            assert server.count - sent_before == len(plan) - finished, (
                f"trial {number} ({trigger}): resume sent {server.count - sent_before} requests, "
                f"expected {len(plan) - finished}")
            final_path = out
        else:
            # killed before the record had its first byte: nothing can have finished
            assert printed == [], f"trial {number}: rows printed but no record"
            notes["no_record"] = True
            if out.exists():  # created, still empty: --resume must refuse it cleanly
                refused = fakes.run_script(["--resume", out], folder, env, timeout=60)
                assert refused.returncode == 2
                one_error_line(refused.stderr)
                assert server.count == sent_before
            final_path = folder / f"trial-{number}-fresh.json"
            fresh = fakes.run_script(crash_command(final_path, server)[2:], folder, env, timeout=60)
            assert fresh.returncode == 0, fresh.stderr
            assert server.count - sent_before == len(plan)
    final = read_json(final_path)  # strict JSON, not a recovery
    assert keys_of(final["runs"]) == plan, f"trial {number}: final rows are not in plan order"
    assert [normal(row) for row in final["runs"]] == [reference[key] for key in plan]
    assert final["summary"]["complete"] is True and final["summary"]["exit_code"] == 0
    assert stat.S_IMODE(os.stat(final_path).st_mode) == 0o600
    return notes, final


@pytest.fixture(scope="module")
def crash_reference(tmp_path_factory):
    """One uninterrupted, timed run of the crash plan, shared read-only by the trial parts:
    (plan, exit code, requests, record, row by key, kill triggers)."""
    plan = regression.plan_rows(CRASH_MODELS, CRASH_CASES, 2)
    reference_path = tmp_path_factory.mktemp("crash-reference") / "uninterrupted.json"
    with FakeServer(openai_good) as server:
        started = time.monotonic()
        with subprocess.Popen(crash_command(reference_path, server), cwd=reference_path.parent,
                              env=child_env(key=None), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as proc:
            first_line = None
            for line in proc.stdout:
                if first_line is None and ROW_LINE.fullmatch(line.rstrip("\n")):
                    first_line = time.monotonic() - started
            proc.wait(timeout=60)
        total = time.monotonic() - started
    uninterrupted = read_json(reference_path)
    reference = {regression.row_key(row): normal(row) for row in uninterrupted["runs"]}

    rng = random.Random(CRASH_SEED)
    first_line = first_line or total / 2
    triggers = [("time", 0.0), ("time", 0.05), ("time", rng.uniform(0.1, first_line)),
                ("file", 0.0), ("file", 0.003), ("line", 1), ("line", len(plan) - 1), ("line", len(plan)),
                ("time", total * 0.99), ("time", total * 1.05), ("line", len(plan) // 2)]
    triggers += [("time", rng.uniform(first_line, total)) for _ in range(CRASH_TRIALS - len(triggers))]
    return plan, proc.returncode, server.count, uninterrupted, reference, triggers


# The trials in two parts that run side by side (on both xdist workers): together every trigger
# once, and each part kills before any record (time 0.0 is in both), mid-run and at the end, so
# each asserts that spread by itself: a kill after a row line (1 and 40 of 80) is mid-run however
# fast the machine is (a timed kill on a loaded one may fall before the first row or after the last).
CRASH_PARTS = ([0, 1, 3, 5, 6, 8, *range(11, 16)], [0, 2, 4, 7, 9, 10, *range(16, CRASH_TRIALS)])


@pytest.mark.parametrize("part", range(len(CRASH_PARTS)))
def test_sigkill_at_random_instants_loses_no_finished_row(tmp_path, crash_reference, part):
    plan, returncode, requests, uninterrupted, reference, triggers = crash_reference
    assert len(plan) == 80
    assert returncode == 0 and requests == len(plan)
    assert list(reference) == plan
    assert len(triggers) >= 20
    assert sorted({n for indices in CRASH_PARTS for n in indices}) == list(range(len(triggers)))

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(crash_trial, tmp_path, number, triggers[number], plan, reference)
                   for number in CRASH_PARTS[part]]
        outcomes = [future.result() for future in futures]

    # the kills really were spread: some before any record, some mid-run, some at the end
    notes = [note for note, _ in outcomes]
    assert any(note.get("no_record") for note in notes)
    assert any(0 < note.get("recovered", 0) < len(plan) for note in notes)
    assert any(note.get("recovered", 0) >= len(plan) - 1 for note in notes)
    for note, final in outcomes:
        with quiet():
            assert compare_runs.compare(copy.deepcopy(uninterrupted), final) == 0, note


# ====================================================================== 3. disk trouble

ECHO_MODELS = ["m1", "m2", "m3", "m4", "m5"]


def echo_run(folder, out, limit=None, extra=(), timeout=60):
    """An echo-provider run of the built-in suite (40 rows), optionally under RLIMIT_FSIZE."""
    return run_cli(["--provider", "echo", "--models", *ECHO_MODELS, "--repeats", "2", "--out", out, *extra],
                   child_env(key=None), folder, timeout=timeout,
                   limits=None if limit is None else {"RLIMIT_FSIZE": limit})


def record_layout(data):
    """(end of header, [row sizes as appended], tail size) of a record file's bytes."""
    runs_start = data.index(b'"runs": [') + len(b'"runs": [')
    tail_start = data.rindex(b'\n], "summary": ')
    parts = data[runs_start:tail_start].split(b"\n")[1:]
    return runs_start, [len(part) + 1 for part in parts], len(data) - tail_start


@pytest.fixture
def echo_reference(tmp_path):
    folder = tmp_path / "reference"
    folder.mkdir()
    out = folder / "reference.json"
    result = echo_run(folder, out)
    assert result.returncode == 1, result.stderr  # the echo answers fail the advisor's checks
    return out.read_bytes()


def test_out_in_missing_directory(tmp_path):
    before = files_under(tmp_path)
    out = tmp_path / "missing" / "run.json"
    result = echo_run(tmp_path, out)
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert str(out) in line
    assert not (tmp_path / "missing").exists()
    assert files_under(tmp_path) == before


def test_out_under_a_regular_file(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_bytes(b"not a folder\n")
    before = files_under(tmp_path)
    out = blocker / "run.json"
    result = echo_run(tmp_path, out)
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert str(out) in line
    assert blocker.read_bytes() == b"not a folder\n"
    assert files_under(tmp_path) == before


def test_report_under_a_regular_file_is_one_clear_line(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_bytes(b"x")
    result = echo_run(tmp_path, tmp_path / "run.json", extra=["--html", blocker / "report.html"])
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "report.html" in line
    assert not (tmp_path / "run.json").exists()  # refused before the run: no paid run without its report


def test_disk_full_mid_run_keeps_a_valid_record(tmp_path, echo_reference):
    runs_start, row_sizes, tail = record_layout(echo_reference)
    assert len(row_sizes) == 40
    limit = runs_start + sum(row_sizes[:3]) + tail + row_sizes[3] // 2  # header and 3 rows fit, not 4
    neighbour = tmp_path / "notes.txt"
    neighbour.write_bytes(b"unrelated file\n")
    out = tmp_path / "run.json"

    result = echo_run(tmp_path, out, limit=limit)

    assert result.returncode == 2, result.stderr
    assert str(out) in one_error_line(result.stderr)
    record = read_json(out)  # still a complete JSON document, not a torn file
    printed = [found[:3] for found in row_lines(result.stdout)]
    assert 1 <= len(record["runs"]) < 40
    assert keys_of(record["runs"]) == printed, "every row written before the failure is kept"
    reference = {regression.row_key(row): normal(row) for row in json.loads(echo_reference)["runs"]}
    assert [normal(row) for row in record["runs"]] == [reference[key] for key in printed]
    assert record["summary"]["exit_code"] == 2 and record["summary"]["complete"] is False
    assert out.stat().st_size <= limit
    assert neighbour.read_bytes() == b"unrelated file\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt", "reference", "run.json"]


def test_disk_full_before_the_header_leaves_no_file(tmp_path, echo_reference):
    runs_start, _, _ = record_layout(echo_reference)
    out = tmp_path / "run.json"
    result = echo_run(tmp_path, out, limit=runs_start // 2)
    assert result.returncode == 2
    assert str(out) in one_error_line(result.stderr)
    assert not out.exists()


def test_disk_full_right_after_the_header_leaves_no_torn_record(tmp_path, echo_reference):
    """The header fits, its closing summary does not: no file that is not JSON may stay behind
    (it would also block the next run with the same --out)."""
    runs_start, _, _ = record_layout(echo_reference)
    out = tmp_path / "run.json"
    result = echo_run(tmp_path, out, limit=runs_start + 20)
    assert result.returncode == 2
    assert str(out) in one_error_line(result.stderr)
    if out.exists():
        record = read_json(out)  # fails today: the file ends in '"runs": ['
        assert record["runs"] == []


def test_disk_full_during_resume_leaves_the_previous_record_intact(tmp_path, echo_reference):
    runs_start, row_sizes, _ = record_layout(echo_reference)
    torn = echo_reference[:runs_start + sum(row_sizes[:5]) + row_sizes[5] // 2]  # killed mid-row 6
    out = tmp_path / "run.json"
    out.write_bytes(torn)
    os.chmod(out, 0o600)
    assert len(regression.load_record(out)["runs"]) == 5

    result = run_cli(["--provider", "echo", "--resume", out], child_env(key=None), tmp_path,
                     limits={"RLIMIT_FSIZE": len(torn) // 2})
    assert result.returncode == 2
    assert str(out) in one_error_line(result.stderr)
    assert out.read_bytes() == torn
    assert sorted(path.name for path in tmp_path.iterdir()) == ["reference", "run.json"], "no temp file left"


def test_disk_full_at_any_point_of_a_resume_leaves_a_valid_record_and_no_temp_file(tmp_path, echo_reference):
    """Sweep the file-size limit across the rewrite of a resumed record: whatever fails, the
    folder holds only the record, and it is the old bytes or valid JSON keeping the 5 old rows."""
    runs_start, row_sizes, _ = record_layout(echo_reference)
    torn = echo_reference[:runs_start + sum(row_sizes[:5]) + row_sizes[5] // 2]
    (tmp_path / "torn.json").write_bytes(torn)
    kept = [normal(row) for row in regression.load_record(tmp_path / "torn.json")["runs"]]
    assert len(kept) == 5
    problems = []
    for limit in range(len(torn) - 100, len(torn) + 700, 40):
        folder = tmp_path / f"limit-{limit}"
        folder.mkdir()
        out = folder / "run.json"
        out.write_bytes(torn)
        os.chmod(out, 0o600)
        result = run_cli(["--provider", "echo", "--resume", out], child_env(key=None), folder,
                         limits={"RLIMIT_FSIZE": limit})
        left = sorted(os.listdir(folder))
        errors = [line for line in result.stderr.splitlines() if not line.startswith("resuming ")]  # progress note
        if result.returncode != 2 or "Traceback" in result.stderr or len(errors) != 1:
            problems.append((limit, "exit/stderr", result.returncode, result.stderr[-200:]))
        if left != ["run.json"]:
            problems.append((limit, "files left", left))
        if out.read_bytes() != torn:
            try:
                rows = read_json(out)["runs"]
            except ValueError as exc:
                problems.append((limit, "record is not JSON", str(exc)))
                continue
            if [normal(row) for row in rows[:5]] != kept:
                problems.append((limit, "earlier rows lost"))
    assert not problems, problems


def test_existing_out_is_never_replaced(tmp_path):
    out = tmp_path / "run.json"
    out.write_bytes(b'{"precious": true}\n')
    os.chmod(out, 0o644)
    result = echo_run(tmp_path, out)
    assert result.returncode == 2
    assert "already exists" in one_error_line(result.stderr)
    assert out.read_bytes() == b'{"precious": true}\n'
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644


# ====================================================================== 4. hostile input (property-based)

# ---------------------------------------------------------------------- (a) rfc_document

ALLOWED_HOSTS = {"rfc-editor.org", "www.rfc-editor.org"}
URL_SHAPE = re.compile(r"(?P<scheme>[^:/?#]+)://(?P<authority>[^/?#]*)(?P<path>[^?#]*)"
                       r"(?P<query>\?[^#]*)?(?P<fragment>#.*)?", re.DOTALL)
RFC_PATH = re.compile(r"/rfc/(rfc[0-9]+)(?:\.html|\.txt)?/?")


def assert_a3(url, document):
    """SPEC A3, checked independently of regression's own parsing."""
    assert all("!" <= char <= "~" for char in url), "whitespace, control or non-ASCII character"
    match = URL_SHAPE.fullmatch(url)
    assert match, "not scheme://authority/path"
    assert match["scheme"].lower() == "https"
    authority = match["authority"]
    assert "@" not in authority, "userinfo"
    host, colon, port = authority.partition(":")
    assert host.lower() in ALLOWED_HOSTS, host
    assert not colon or port == "443", port
    assert match["query"] is None, "query string"
    path = RFC_PATH.fullmatch(match["path"])
    assert path, match["path"]
    assert document == path[1]


GOOD_PARTS = {
    "scheme": ["https"],
    "userinfo": [""],
    "host": ["rfc-editor.org", "www.rfc-editor.org", "WWW.RFC-EDITOR.ORG", "Rfc-Editor.Org"],
    "port": ["", ":443"],
    "path": ["/rfc/rfc9110", "/rfc/rfc6585", "/rfc/rfc9110.html", "/rfc/rfc9110.txt", "/rfc/rfc9110/",
             "/rfc/rfc6585.html/", "/rfc/rfc1"],
    "query": [""],
    "fragment": ["", "#", "#section-15.6.4", "#a?b=c", "#rfc6585"],
}
BAD_PARTS = {
    "scheme": ["http", "ftp", "", "https:", "httpss", "hxxps", "javascript", "https\t", "ht\ntps"],
    "userinfo": ["user@", "user:pass@", "@", ":@", "www.rfc-editor.org@", "rfc-editor.org:443@"],
    "host": ["evil.com", "rfc-editor.org.evil.com", "www.rfc-editor.org.", "rfc-editor.com", "rfc-edit0r.org",
             "xn--rfc-editor-xyz.org", "www.rfc-editor.org%2F", "www%2Erfc-editor.org", "www.rfc-editor\u3002org",
             "www.rfc-editor\uff0eorg", "www.rfc-\u0435ditor.org", "127.0.0.1", "[::1]", "", "www..rfc-editor.org",
             "sub.www.rfc-editor.org", "www.rfc-editor.org\\", "www.rfc-editor.org\\@evil.com", "www.rfc-editor.org\x00"],
    "port": [":80", ":8443", ":4430", ":443:443", ":44", ":0", ":-443", ": 443"],
    "path": ["", "/", "/rfc/rfc9110.pdf", "/info/rfc9110", "/RFC/RFC9110", "/rfc/RFC9110", "/rfc/rfc9110a",
             "/rfc//rfc9110", "/rfc/../rfc/rfc9110", "/rfc/./rfc9110", "/rfc/rfc9110%2Ehtml", "/rfc%2Frfc9110",
             "/rfc/rfc9110//", "/rfc/rfc9110\\", "/rfc/rfc 9110", "/rfc/rfc9110.html.txt", "/rfc/rfc-9110",
             "/rfc/rfc\uff19\uff11\uff11\uff10", "//rfc/rfc9110", "/rfc/rfc9110;x", "/rfc/rfc", "/rfc/rfc9110\r\n"],
    "query": ["?", "?a=1", "?rfc9110", "?#"],
    "fragment": ["#a b", "#\x00", "#\n", "#\t", "#\x7f"],
}
PART_ORDER = ["scheme", "userinfo", "host", "port", "path", "query", "fragment"]


@st.composite
def near_miss_urls(draw):
    """A URL from parts, each good or bad; (url, names of the bad parts, document of a good path)."""
    broken = draw(st.sets(st.sampled_from(PART_ORDER), max_size=3))
    parts = {name: draw(st.sampled_from(BAD_PARTS[name] if name in broken else GOOD_PARTS[name]))
             for name in PART_ORDER}
    url = (f"{parts['scheme']}://{parts['userinfo']}{parts['host']}{parts['port']}"
           f"{parts['path']}{parts['query']}{parts['fragment']}")
    match = RFC_PATH.fullmatch(parts["path"])
    return url, broken, match[1] if match else None


GOOD_URLS = ["https://www.rfc-editor.org/rfc/rfc9110", "https://rfc-editor.org/rfc/rfc6585.html",
             "https://www.rfc-editor.org:443/rfc/rfc9110.txt#section-15"]
ANY_CHAR = st.characters(exclude_categories=())  # surrogates and controls included


@st.composite
def mutated_urls(draw):
    """A good URL with a few random characters inserted, replaced or deleted."""
    url = draw(st.sampled_from(GOOD_URLS))
    for _ in range(draw(st.integers(1, 3))):
        position = draw(st.integers(0, len(url)))
        action = draw(st.sampled_from(["insert", "replace", "delete"]))
        char = draw(st.sampled_from("/\\@:.?#%&=;[] \t\n\r\x00\x0bAZaz09-_~") | ANY_CHAR)
        if action == "insert":
            url = url[:position] + char + url[position:]
        elif action == "replace":
            url = url[:position] + char + url[position + 1:]
        else:
            url = url[:position] + url[position + 1:]
    return url


def _random_char(rng):
    """Any code point (surrogates and controls included), or one of the URL-special characters."""
    if rng.random() < 0.5:
        return rng.choice("/\\@:.?#%&=;[] \t\n\r\x00\x0bAZaz09-_~")
    return chr(rng.randrange(0x110000))


def random_mutated_url(rng):
    """mutated_urls without hypothesis: thousands of them cost milliseconds."""
    url = rng.choice(GOOD_URLS)
    for _ in range(rng.randint(1, 3)):
        position = rng.randint(0, len(url))
        action = rng.choice(["insert", "replace", "delete"])
        char = _random_char(rng)
        if action == "insert":
            url = url[:position] + char + url[position:]
        elif action == "replace":
            url = url[:position] + char + url[position + 1:]
        else:
            url = url[:position] + url[position + 1:]
    return url


def random_near_miss_url(rng):
    """near_miss_urls without hypothesis: (url, names of the bad parts, document of a good path)."""
    broken = set(rng.sample(PART_ORDER, rng.randint(0, 3)))
    parts = {name: rng.choice(BAD_PARTS[name] if name in broken else GOOD_PARTS[name]) for name in PART_ORDER}
    url = (f"{parts['scheme']}://{parts['userinfo']}{parts['host']}{parts['port']}"
           f"{parts['path']}{parts['query']}{parts['fragment']}")
    match = RFC_PATH.fullmatch(parts["path"])
    return url, broken, match[1] if match else None


# Hypothesis shrinks a failure to its smallest form but costs milliseconds per example; the
# seeded loops beside each property try thousands of the same inputs in well under a second.
URL_LOOP_SEED, URL_LOOP_COUNT = 20_251_201, 5000


def test_rfc_document_never_raises_and_acceptance_implies_a3():
    accepted = []

    def check(url):
        document = regression.rfc_document(url)  # never raises
        assert document is None or isinstance(document, str)
        if document is not None:
            accepted.append(url)
            assert_a3(url, document)
            assert regression.approved_source(url, document)

    rng = random.Random(URL_LOOP_SEED)
    for _ in range(URL_LOOP_COUNT):
        url = random_mutated_url(rng)
        check(url)
        check("".join(_random_char(rng) for _ in range(rng.randint(0, 80))))

    @settings(max_examples=100, **HYPOTHESIS)
    @given(st.one_of(st.text(ANY_CHAR, max_size=80), mutated_urls(),
                     st.from_regex(r"[hH][tT][tT][pP][sS]?://[\w.:@\[\]%\\-]{0,30}/[\w./%\\-]{0,30}"
                                   r"(\?[\w=]*)?(#[^\n]*)?", fullmatch=True,
                                   # an explicit alphabet (every code point) saves the 3 s the
                                   # default one costs to set up
                                   alphabet=ANY_CHAR)))
    @example("https://www.rfc-editor.org/rfc/rfc9110")
    @example("https://www.rfc-editor.org/rfc/rfc9110\ud800")
    @example("https://[www.rfc-editor.org/rfc/rfc9110")
    @example("https://www.rfc-editor.org:99999999999999999999/rfc/rfc9110")
    def prop(url):
        check(url)

    prop()
    assert accepted, "acceptance was never exercised"


def test_rfc_document_on_near_miss_urls_built_from_parts():
    outcomes = {"accepted": 0, "rejected": 0}

    def check(drawn):
        url, broken, document = drawn
        got = regression.rfc_document(url)
        if got is not None:
            assert_a3(url, got)
        if broken:
            assert got is None, f"accepted with bad {sorted(broken)}: {url!r}"
            outcomes["rejected"] += 1
        else:
            assert got == document, f"a URL made only of good parts was rejected: {url!r}"
            outcomes["accepted"] += 1

    rng = random.Random(URL_LOOP_SEED)
    for _ in range(URL_LOOP_COUNT):
        check(random_near_miss_url(rng))
    assert outcomes["accepted"] > 200 and outcomes["rejected"] > 2000, outcomes

    @settings(max_examples=100, **HYPOTHESIS)
    @given(near_miss_urls())
    def prop(drawn):
        check(drawn)

    prop()
    assert outcomes["accepted"] > 220 and outcomes["rejected"] > 2020, outcomes


# ---------------------------------------------------------------------- shared JSON strategies

SURROGATE_TEXT = st.sampled_from(["\ud800", "a\udc80b", "\ud83d", "x\udfff"])
TEXT = st.text(max_size=12) | SURROGATE_TEXT | st.sampled_from(["", " ", "a", "\n", "rfc9110", "0" * 64])
SCALARS = (st.none() | st.booleans() | st.integers(-100, 100) | st.floats(allow_nan=True, allow_infinity=True)
           | TEXT)
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
                    max_leaves=12)


ODD = st.sampled_from([5, -1, 7.5, None, True, False, "", " ", "x", [], {}, [1], {"a": 1}, ["x"], "\ud800"])


def either(plausible):
    """A plausible value, an odd scalar or container, or any JSON value."""
    return st.one_of(plausible, ODD, JSON)


# ---------------------------------------------------------------------- (b) malformed suites

SCHEMA = st.fixed_dictionaries({}, optional={
    "type": either(st.sampled_from(["object", "array"])),
    "properties": either(st.dictionaries(st.sampled_from(["code", "next_action", "source_urls", "x"]),
                                         either(st.fixed_dictionaries({}, optional={
                                             "type": either(st.sampled_from(["string", "array", "integer"])),
                                             "items": JSON})), max_size=3)),
    "required": either(st.lists(st.sampled_from(["code", "source_urls", "zz"]), max_size=3)),
    "additionalProperties": JSON,
})
TOOL = st.fixed_dictionaries({"type": either(st.sampled_from(["function", "web_search"]))}, optional={
    "name": either(st.sampled_from(["lookup_order", "cancel_order"])),
    "function": either(st.fixed_dictionaries({}, optional={"name": either(st.sampled_from(["lookup_order"])),
                                                           "parameters": JSON})),
})
SUITE_VALUES = {
    "name": either(st.sampled_from(["suite", "x"])),
    "instructions": either(TEXT),
    "tool": either(TOOL),
    "tools": either(st.lists(either(TOOL), max_size=3)),
    "response_format": either(st.none() | st.fixed_dictionaries(
        {"type": either(st.sampled_from(["json_schema", "json_object", "text"]))},
        optional={"json_schema": either(st.fixed_dictionaries({}, optional={"name": either(TEXT),
                                                                           "schema": either(SCHEMA)}))})),
    "sources": either(st.fixed_dictionaries({}, optional={
        "field": either(st.sampled_from(["source_urls", ""])),
        "hosts": either(st.lists(st.sampled_from(["rfc-editor.org", "", " "]), max_size=2)),
        "path": either(st.sampled_from([regression.RFC_SOURCES["path"], "(", "no-group", "(x)", "a{99999999999}",
                                        "(a){4294967296}"])),
        "also_allowed": either(st.lists(TEXT, max_size=2))})),
    "notes": either(TEXT),
    "unknown": JSON, "Cases": JSON, "instruction": JSON,
}
BEHAVIOR_TEXT = st.sampled_from(["json_object", "json_object:1", "no_system_leak", "max_tool_rounds:2",
                                 "max_tool_rounds:x", "forbid_tool:lookup_order", "forbid_tool:", "forbid_tool:nope",
                                 "require_clarification:order_id", "require_clarification:a b", "unknown", ""])
CASE_VALUES = {
    "id": either(st.sampled_from(["a", "b", "a", "", " "])),
    "input": either(TEXT | st.lists(either(st.fixed_dictionaries({"role": either(st.sampled_from(["user"])),
                                                                  "content": JSON})), max_size=2)),
    "question": either(TEXT),
    "expect": either(st.dictionaries(st.sampled_from(["code", "next_action", "bad-field", "x"]), JSON, max_size=2)),
    "cite": either(st.sampled_from(["rfc9110", ""])),
    "contains": either(st.lists(TEXT, max_size=2)),
    "excludes": either(st.lists(TEXT, max_size=2)),
    "expected_text": either(TEXT),
    "min_similarity": either(st.floats(allow_nan=True) | st.integers(-1, 2)),
    "min_chars": either(st.integers(-5, 300)),
    "max_chars": either(st.integers(-5, 300)),
    "behaviors": either(st.lists(either(BEHAVIOR_TEXT), max_size=3)),
    "instructions_sha256": either(st.sampled_from(["0" * 64, "A" * 64, "x"])),
    "notes": either(TEXT),
    "inputs": JSON, "expect_text": JSON,
}
CASE = st.fixed_dictionaries({}, optional=CASE_VALUES)
SUITES = st.fixed_dictionaries({"cases": either(st.lists(either(CASE), max_size=3))}, optional=SUITE_VALUES)


REAL_SUITES = [json.loads(path.read_text(encoding="utf-8")) for path in SUITE_FILES]


@st.composite
def mutated_json(draw, bases):
    """A copy of one of `bases` with 1-3 random edits at random paths (replace, delete, duplicate)."""
    value = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 3))):
        parent, key, node = None, None, value
        for _ in range(draw(st.integers(0, 5))):
            if isinstance(node, dict) and node:
                step = draw(st.sampled_from(sorted(node)))
            elif isinstance(node, list) and node:
                step = draw(st.integers(0, len(node) - 1))
            else:
                break
            parent, key, node = node, step, node[step]
        if parent is None:
            continue
        action = draw(st.sampled_from(["replace", "replace", "delete", "duplicate", "add_key"]))
        if action == "replace":
            parent[key] = draw(JSON)
        elif action == "delete":
            del parent[key]
        elif action == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif action == "add_key" and isinstance(node, dict):
            node[draw(TEXT)] = draw(JSON)
    return value


@st.composite
def suite_files(draw):
    """The bytes of a suite file: a generated or mutated suite, random JSON, or broken text."""
    kind = draw(st.sampled_from(["generated", "one_field", "one_case_field", "mutated", "json", "bytes", "cut"]))
    if kind == "generated":
        return json.dumps(draw(SUITES)).encode()
    if kind in ("one_field", "one_case_field"):  # a valid suite with one or two odd fields
        suite = {"name": "x", "instructions": "Answer.", "cases": [{"id": "a", "input": "hi"}]}
        target, values = (suite, SUITE_VALUES) if kind == "one_field" else (suite["cases"][0], CASE_VALUES)
        for name in draw(st.lists(st.sampled_from(sorted(values)), min_size=1, max_size=2, unique=True)):
            target[name] = draw(values[name])
        return json.dumps(suite).encode()
    if kind == "mutated":
        return json.dumps(draw(mutated_json(REAL_SUITES))).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    text = GUARDRAILS.read_bytes()
    return text[:draw(st.integers(0, len(text)))]


def run_main_in_process(argv):
    """regression.main(argv) with stdout/stderr captured: (exit code, stderr text)."""
    with quiet() as (_, err):
        try:
            code = regression.main([str(arg) for arg in argv])
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def check_suite_file(path, data, expected=(0, 2)):
    """--suite FILE --dry-run: exit 0 (valid) or SystemExit(2) with exactly one line on stderr;
    `expected` pins the one exit code a known input must give."""
    path.write_bytes(data)
    code, err = run_main_in_process(["--suite", path, "--dry-run"])
    assert code in ((expected,) if isinstance(expected, int) else expected), (code, err)
    if code == 2:
        lines = err.rstrip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("regression.py: error: "), err


def test_malformed_suites_exit_2_with_one_line(monkeypatch):
    with scratch_dir() as folder:
        monkeypatch.chdir(folder)

        @settings(max_examples=100, **HYPOTHESIS)
        @given(suite_files())
        @example(b"[" * 100_000)
        @example(b"\xef\xbb\xbf{}")
        @example(json.dumps(REAL_SUITES[0]).encode())
        def prop(data):
            check_suite_file(folder / "suite.json", data)

        prop()


def _suite_with(**fields):
    suite = {"name": "x", "instructions": "Answer.", "cases": [{"id": "a", "input": "hi"}]}
    suite.update(fields)
    return json.dumps(suite).encode()


# name -> (suite file, the exit code `--suite FILE --dry-run` must give: 2 with one line, or 0)
KNOWN_HOSTILE_SUITES = {
    "non-function-tool-with-int-name": (_suite_with(tools=[{"type": "web", "name": 5}]), 2),
    "json-object-format-with-int-json-schema": (
        _suite_with(response_format={"type": "json_object", "json_schema": 5}), 2),
    "json-object-format-with-int-schema-name": (
        _suite_with(response_format={"type": "json_object", "json_schema": {"name": 7}}), 2),
    "sources-path-with-huge-repeat": (
        _suite_with(sources={"field": "u", "hosts": ["h"], "path": "(a){99999999999}"}), 2),
    # a lone surrogate anywhere in a suite is not text: bad input (a case id with one once
    # passed in-process while the real CLI printed a traceback)
    "instructions-with-lone-surrogate": (_suite_with(instructions="\ud800"), 2),
    "case-id-with-lone-surrogate": (_suite_with(cases=[{"id": "a\udc00", "input": "hi"}]), 2),
    "suite-name-with-lone-surrogate": (_suite_with(name="x\ud800"), 2),
    "deeply-nested": (b"[" * 100_000, 2),
    "utf-8-bom": (b"\xef\xbb\xbf{}", 2),
    "invalid-utf-8": (b'{"name": "\xff"}', 2),
}


@pytest.mark.parametrize("name", list(KNOWN_HOSTILE_SUITES))
def test_known_hostile_suite_exits_0_or_2_with_one_line(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    data, expected = KNOWN_HOSTILE_SUITES[name]
    check_suite_file(tmp_path / "suite.json", data, expected)


# ---------------------------------------------------------------------- (c) argument lists

def _argv_fixtures(folder):
    """Real files the generated arguments may name: suites, records (good, torn, junk), a folder."""
    (folder / "good-suite.json").write_bytes(GUARDRAILS.read_bytes())
    (folder / "bad-suite.json").write_text('{"name": "x", "cases": []}')
    (folder / "junk.bin").write_bytes(b"\x00\xff junk")
    (folder / "afolder").mkdir()
    code, err = run_main_in_process(["--provider", "echo", "--models", "echo", "--out", folder / "echo-record.json"])
    assert code == 1, err
    record = (folder / "echo-record.json").read_bytes()
    (folder / "torn-record.json").write_bytes(record[:len(record) * 2 // 3])


PATHS = st.sampled_from(["good-suite.json", "bad-suite.json", "junk.bin", "afolder", "echo-record.json",
                         "torn-record.json", "missing.json", "afolder/new.json", "junk.bin/x.json", "", "-",
                         "new-a.json", "new-b.json", "new-a.json"])
NUMBERS = st.sampled_from(["0", "1", "2", "-1", "10", "11", "64", "65", "x", "1e3", "", " 1", "9" * 30])
FLAG_VALUES = {
    "--suite": PATHS, "--out": PATHS, "--replay": PATHS, "--resume": PATHS, "--report": PATHS,
    "--markdown": PATHS, "--junit": PATHS, "--html": PATHS,
    "--models": st.lists(st.sampled_from(["m", "m", "echo", "", " ", "a/b", "--x", "-"]), min_size=1, max_size=3),
    "--repeats": NUMBERS, "--concurrency": NUMBERS, "--retries": NUMBERS,
    "--provider": st.sampled_from(["echo", "perplexity", "openai", "replay", "nope", ""]),
    "--base-url": st.sampled_from(["http://127.0.0.1:9/v1", "ftp://x", "not a url", "", "http://"]),
    "--api-key-env": st.sampled_from(["UNSET_VAR_FOR_TEST", "", "PATH"]),
    "--timeout": st.sampled_from(["0", "-1", "nan", "inf", "1e309", "0.5", "x", "1e-300"]),
    "--max-cost-usd": st.sampled_from(["0", "-1", "NaN", "sNaN", "Infinity", "1e999999999", "1e-999999999",
                                       "0.01", "x", ""]),
    "--shard": st.sampled_from(["1/2", "0/0", "3/2", "a/b", "1/" + "9" * 30, " 1 / 2 ", "2/2", ""]),
    "--merge": st.lists(PATHS, min_size=1, max_size=3),
    "--redact": st.sampled_from(["secret", "(", "[", "a{99999999999}", "(?P<x>a)(?P<x>b)", ""]),
    "--dry-run": None, "--list-checks": None, "--update-baseline": None, "--redact-pii": None, "--help": None,
}


@st.composite
def argument_lists(draw):
    argv = []
    for flag in draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=3)):
        values = FLAG_VALUES[flag]
        argv.append(flag)
        if values is not None:
            value = draw(values)
            argv.extend(value if isinstance(value, list) else [value])
    return argv + ["--provider", "echo", "--dry-run"]


def check_argv(argv):
    code, err = run_main_in_process(argv)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err
    if code == 2 and err:
        assert len(err.rstrip("\n").split("\n")) == 1, err


KNOWN_HOSTILE_ARGUMENTS = [
    ["--redact", "a{99999999999}"],
    ["--redact", "(a){4294967296}"],
    ["--max-cost-usd", "sNaN"],
    ["--shard", "1/" + "9" * 5000],
]


@pytest.mark.parametrize("argv", KNOWN_HOSTILE_ARGUMENTS, ids=lambda argv: " ".join(argv)[:40])
def test_known_hostile_arguments_exit_2_with_one_line(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    code, err = run_main_in_process([*argv, "--provider", "echo", "--dry-run"])
    assert code == 2, (code, err)
    one_error_line(err)
    assert os.listdir(tmp_path) == []


def test_known_hostile_inputs_through_the_real_cli(tmp_path):
    """Both fixed hostile tables through `python regression.py` itself, in one driver process
    (fakes.cli_table): in-process runs print into a StringIO, which once hid a traceback the
    real stdout raised. Each input pins its exit code; nothing is written but the suite."""
    runs, expected = [], []
    for name, (data, code) in KNOWN_HOSTILE_SUITES.items():
        folder = tmp_path / f"suite-{len(runs)}"
        folder.mkdir()
        (folder / "suite.json").write_bytes(data)
        runs.append((["--suite", "suite.json", "--dry-run"], folder))
        expected.append((name, code, ["suite.json"]))
    for argv in KNOWN_HOSTILE_ARGUMENTS:
        folder = tmp_path / f"argv-{len(runs)}"
        folder.mkdir()
        runs.append(([*argv, "--provider", "echo", "--dry-run"], folder))
        expected.append((" ".join(argv)[:40], 2, []))
    results = fakes.cli_table(runs, env=child_env(key=None))
    assert len(results) == len(runs)
    for (name, code, files), (_, folder), (got, out, err) in zip(expected, runs, results):
        assert "Traceback" not in err, (name, err)
        assert got == code, (name, got, err)
        if code == 2:
            one_error_line(err)
        else:
            assert err == "" and out.strip(), (name, out, err)
        assert sorted(os.listdir(folder)) == files, name


def test_generated_argument_lists_exit_0_1_or_2_without_traceback(monkeypatch):
    listing = project_listing()
    with scratch_dir() as folder:
        _argv_fixtures(folder)
        monkeypatch.chdir(folder)

        @settings(max_examples=100, **HYPOTHESIS)
        @given(argument_lists())
        @example(["--resume", "torn-record.json", "--provider", "echo", "--dry-run"])
        @example(["--merge", "new-a.json", "echo-record.json", "--provider", "echo", "--dry-run"])
        def prop(argv):
            check_argv(argv)

        prop()
        for path in files_under(folder):  # every file stays inside the scratch folder
            assert path.resolve().is_relative_to(folder.resolve())
    assert project_listing() == listing, "a file was created in the project folder"


# ---------------------------------------------------------------------- (d) compare_runs on any JSON

def _demo_records():
    with scratch_dir() as folder, quiet():
        compare_runs.demo(str(folder / "demo"))
        return [read_json(folder / "demo" / "before.json"), read_json(folder / "demo" / "after.json")]


DEMO_RECORDS = None


def demo_records():
    global DEMO_RECORDS
    if DEMO_RECORDS is None:
        DEMO_RECORDS = _demo_records()
    return copy.deepcopy(DEMO_RECORDS)


def test_index_and_compare_on_any_json_return_or_raise_value_error():
    bases = demo_records()
    records = st.one_of(JSON, mutated_json(bases), st.sampled_from(bases))

    @settings(max_examples=100, **HYPOTHESIS)
    @given(records, records)
    def prop(before, after):
        try:
            rows = compare_runs.index(before)
            assert isinstance(rows, dict)
        except ValueError:
            pass
        with quiet():
            try:
                code = compare_runs.compare(before, after)
                assert code in (0, 1)
            except ValueError:
                pass

    prop()


def test_compare_runs_main_on_arbitrary_json_files_returns_0_1_or_2():
    bases = demo_records()

    @st.composite
    def record_files(draw):
        kind = draw(st.sampled_from(["json", "mutated", "real", "cut", "bytes"]))
        if kind == "json":
            return json.dumps(draw(JSON)).encode()
        if kind == "mutated":
            return json.dumps(draw(mutated_json(bases))).encode()
        if kind == "real":
            return json.dumps(draw(st.sampled_from(bases))).encode()
        if kind == "cut":
            text = json.dumps(draw(st.sampled_from(bases))).encode()
            return text[:draw(st.integers(0, len(text)))]
        return draw(st.binary(max_size=300))

    with scratch_dir() as folder:
        @settings(max_examples=100, **HYPOTHESIS)
        @given(record_files(), record_files())
        def prop(before, after):
            (folder / "a.json").write_bytes(before)
            (folder / "b.json").write_bytes(after)
            with quiet():
                code = compare_runs.main([str(folder / "a.json"), str(folder / "b.json")])
            assert code in (0, 1, 2)

        prop()


def test_compare_with_an_absurd_repeats_count_is_not_comparable(tmp_path):
    """A record claiming a billion repeats must be refused (exit 2), not expanded in memory."""
    record = {"config": {"models": ["m"], "cases": [{"id": "a"}], "repeats": 10 ** 9}, "runs": []}
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(record))
    limit = 512 << 20
    result = subprocess.run([sys.executable, str(COMPARE), "a.json", "b.json"], cwd=tmp_path, env=child_env(key=None),
                            capture_output=True, text=True, timeout=60,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert "Traceback" not in result.stderr, result.stderr[-600:]
    assert result.returncode == 2 and result.stdout.startswith("NOT_COMPARABLE: ")


# ---------------------------------------------------------------------- (e) load_record on any bytes

def test_load_record_on_arbitrary_bytes_returns_or_raises_record_error():
    bases = [json.dumps(record, indent=None).encode() for record in demo_records()]

    @st.composite
    def record_bytes(draw):
        kind = draw(st.sampled_from(["bytes", "cut", "flipped"]))
        if kind == "bytes":
            return draw(st.binary(max_size=500))
        data = bytearray(draw(st.sampled_from(bases)))
        if kind == "flipped":
            for _ in range(draw(st.integers(1, 4))):
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data[:draw(st.integers(0, len(data)))])

    with scratch_dir() as folder:
        path = folder / "record.json"

        @settings(max_examples=100, **HYPOTHESIS)
        @given(record_bytes())
        @example(b"")
        @example(b"\xff\xfe")
        @example(b'{"runs": [')
        @example(b"[" * 100_000)
        def prop(data):
            path.write_bytes(data)
            try:
                regression.load_record(path)
            except regression.RecordError:
                pass

        prop()


def torn_record(config, rows):
    """The bytes of a record killed while appending: header, finished rows, half a row."""
    finished = "".join(json.dumps(row) + ",\n" for row in rows)
    return ('{"config": ' + json.dumps(config) + ', "runs": [\n' + finished + '{"case_id": "b", "mod').encode()


def test_load_record_of_a_torn_record_with_an_absurd_cost(tmp_path):
    row = {"model": "m", "case_id": "a", "repeat": 0, "error": None, "reasons": [], "passed": True,
           "cost_usd": "1e999999999"}
    path = tmp_path / "torn.json"
    path.write_bytes(torn_record({"models": ["m"], "cases": [{"id": "a"}, {"id": "b"}], "repeats": 1}, [row]))
    try:
        record = regression.load_record(path)
    except regression.RecordError:
        return
    assert record["runs"] == [row]


def test_load_record_of_a_torn_record_with_an_absurd_repeats_count(tmp_path):
    path = tmp_path / "torn.json"
    path.write_bytes(torn_record({"models": ["m"], "cases": [{"id": "a"}], "repeats": 10 ** 10}, []))
    probe = ("import sys, regression\n"
             "try:\n"
             "    regression.load_record(sys.argv[1])\n"
             "except regression.RecordError:\n"
             "    pass\n"
             "print('ok')\n")
    limit = 512 << 20
    result = subprocess.run([sys.executable, "-c", probe, str(path)], cwd=HERE, env=child_env(key=None),
                            capture_output=True, text=True, timeout=60,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-600:]


# ====================================================================== 5. URL tricks

RFC = "/rfc/rfc9110"
HOST = "www.rfc-editor.org"
URL_TRICKS = [
    # look-alike hosts
    f"https://rfc-editor.org.evil.com{RFC}", f"https://www.rfc-editor.org.evil.com{RFC}",
    f"https://rfc-editor.com{RFC}", f"https://www.rfc-editor.net{RFC}", f"https://rfc-edit0r.org{RFC}",
    f"https://www.rfc-editor.org-evil.com{RFC}", f"https://evilrfc-editor.org{RFC}", f"https://wwww.rfc-editor.org{RFC}",
    f"https://www.rfceditor.org{RFC}", f"https://www.rfc_editor.org{RFC}", f"https://sub.www.rfc-editor.org{RFC}",
    f"https://xn--rfc-editor-xyz.org{RFC}", f"https://www.xn--rfc-ditor-7ua.org{RFC}", f"https://www.rfc-editor.xn--org{RFC}",
    # Unicode homoglyphs and IDN hosts
    f"https://www.rfc-\u0435ditor.org{RFC}",            # Cyrillic e
    f"https://www.rf\u0441-editor.org{RFC}",            # Cyrillic es
    f"https://www.rfc-editor.\u043erg{RFC}",            # Cyrillic o
    f"https://www.rfc-editor.\u03bfrg{RFC}",            # Greek omicron
    f"https://\uff52\uff46\uff43-editor.org{RFC}",      # fullwidth rfc
    f"https://www.rfc\u2010editor.org{RFC}",            # Unicode hyphen
    f"https://www.rfc-editor.org\u200b{RFC}",           # zero-width space
    f"https://www.rfc-\u00e9ditor.org{RFC}", f"https://b\u00fccher.example{RFC}",
    # percent-encoding in host and path
    f"https://www%2Erfc-editor.org{RFC}", f"https://www.rfc-editor%2Eorg{RFC}", f"https://%77ww.rfc-editor.org{RFC}",
    f"https://www.rfc-editor.org%2F{RFC}", f"https://www.rfc-editor.org%2Fevil.com{RFC}",
    f"https://{HOST}/rfc%2Frfc9110", f"https://{HOST}/rfc/rfc9110%2Ehtml", f"https://{HOST}/rfc/%2E%2E/rfc/rfc9110",
    f"https://{HOST}/%72fc/rfc9110", f"https://{HOST}/rfc/rfc%39110", f"https://{HOST}%2Frfc%2Frfc9110",
    # backslashes
    f"https://{HOST}\\@evil.com{RFC}", f"https:\\\\{HOST}{RFC}", f"https://{HOST}\\rfc\\rfc9110",
    f"https://evil.com\\@{HOST}{RFC}", f"https://{HOST}/rfc\\rfc9110",
    # userinfo
    f"https://user@{HOST}{RFC}", f"https://user:pass@{HOST}{RFC}", f"https://@{HOST}{RFC}",
    f"https://{HOST}@evil.com{RFC}", f"https://evil.com@{HOST}{RFC}", f"https://{HOST}:443@evil.com{RFC}",
    f"https://{HOST}:@{HOST}{RFC}",
    # Unicode full stops and trailing dots
    f"https://www.rfc-editor\u3002org{RFC}", f"https://www.rfc-editor\uff0eorg{RFC}",
    f"https://www.rfc-editor\uff61org{RFC}", f"https://www\u3002rfc-editor.org{RFC}",
    f"https://{HOST}.{RFC}", f"https://rfc-editor.org.{RFC}", f"https://{HOST}.:443{RFC}", f"https://{HOST}..{RFC}",
    # IP literals
    f"https://192.0.2.1{RFC}", f"https://127.0.0.1{RFC}", f"https://3221225985{RFC}", f"https://0xC0.0.2.1{RFC}",
    f"https://[::1]{RFC}", f"https://[2001:db8::1]:443{RFC}", f"https://[::ffff:192.0.2.1]{RFC}",
    f"https://[{HOST}]{RFC}",
    # ports
    f"https://{HOST}:80{RFC}", f"https://{HOST}:8443{RFC}", f"https://{HOST}:4430{RFC}", f"https://{HOST}:443:443{RFC}",
    f"https://{HOST}:-443{RFC}", f"https://{HOST}:0{RFC}", f"https://{HOST}:99999999999999999999{RFC}",
    # scheme
    f"http://{HOST}{RFC}", f"ftp://{HOST}{RFC}", f"//{HOST}{RFC}", f"https:{HOST}{RFC}", f"https:/{HOST}{RFC}",
    f"https:///{HOST}{RFC}", f"javascript://{HOST}{RFC}", f"{HOST}{RFC}", f"https//{HOST}{RFC}",
    # queries
    f"https://{HOST}{RFC}?", f"https://{HOST}{RFC}?x=1", f"https://{HOST}{RFC}.html?", f"https://{HOST}{RFC}?#frag",
    # double slashes, dot segments, other paths
    f"https://{HOST}//rfc/rfc9110", f"https://{HOST}/rfc//rfc9110", f"https://{HOST}{RFC}//",
    f"https://{HOST}/rfc/../rfc/rfc9110", f"https://{HOST}/rfc/./rfc9110", f"https://{HOST}{RFC}/..",
    f"https://{HOST}/x/../rfc/rfc9110", f"https://{HOST}/rfc/rfc9110.pdf", f"https://{HOST}/info/rfc9110",
    f"https://{HOST}/rfc/rfc9110.html.txt", f"https://{HOST}/rfc/rfc9110;x", f"https://{HOST}/rfc/rfc9110.htm",
    f"https://{HOST}/rfc/rfc9110/x", f"https://{HOST}", f"https://{HOST}/", f"https://{HOST}/rfc/",
    # uppercase path
    f"https://{HOST}/RFC/RFC9110", f"https://{HOST}/rfc/RFC9110", f"https://{HOST}/Rfc/rfc9110",
    f"https://{HOST}/rfc/rfc9110.HTML", f"https://{HOST}/rfc/Rfc9110",
    # rfc numbers with letters or other digits
    f"https://{HOST}/rfc/rfc91l0", f"https://{HOST}/rfc/rfc9110a", f"https://{HOST}/rfc/rfcABCD",
    f"https://{HOST}/rfc/rfc0x2386", f"https://{HOST}/rfc/rfc9110e0", f"https://{HOST}/rfc/rfc",
    f"https://{HOST}/rfc/rfc-9110", f"https://{HOST}/rfc/rfc+9110", f"https://{HOST}/rfc/rfc\u0669\u0661\u0661\u0660",
    f"https://{HOST}/rfc/rfc\uff19\uff11\uff11\uff10", f"https://{HOST}/rfc/rfc\u00b9",
    # overlong paths and URLs (10 KB)
    f"https://{HOST}/rfc/rfc" + "9" * 10_000, f"https://{HOST}{RFC}" + "/" * 10_000,
    f"https://{HOST}/" + "a/" * 5_000 + "rfc/rfc9110", f"https://{'a.' * 5_000}{HOST}{RFC}",
    f"https://{HOST}{RFC}#" + "x" * 10_000, f"https://{'u' * 10_000}@{HOST}{RFC}",
    # non-strings
    None, b"https://www.rfc-editor.org/rfc/rfc9110", 9110, ["https://www.rfc-editor.org/rfc/rfc9110"],
]
# whitespace and control characters anywhere
_CONTROL = ["\t", "\n", "\r", "\x00", "\x0b", "\x0c", "\x1b", "\x7f", " ", "\x85", "\xa0", "\u2028", "\ufeff", "\u3000"]
_GOOD = f"https://{HOST}{RFC}.html#section-1"
for _char in _CONTROL:
    for _position in (0, 5, 8, 12, len(f"https://{HOST}"), len(f"https://{HOST}/rfc"), len(_GOOD) - 10, len(_GOOD)):
        URL_TRICKS.append(_GOOD[:_position] + _char + _GOOD[_position:])


def _trick_id(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:45] + f"...({len(text)} chars)"


@pytest.mark.parametrize("url", URL_TRICKS, ids=[f"{n}-{_trick_id(url)}" for n, url in enumerate(URL_TRICKS)])
def test_url_trick_is_rejected(url):
    assert regression.rfc_document(url) is None
    assert regression.approved_source(url, "rfc9110") is False


@pytest.mark.parametrize("url,document", [
    (f"https://{HOST}{RFC}", "rfc9110"), ("https://rfc-editor.org/rfc/rfc6585", "rfc6585"),
    (f"https://{HOST}{RFC}.html", "rfc9110"), (f"https://{HOST}{RFC}.txt", "rfc9110"),
    (f"https://{HOST}{RFC}/", "rfc9110"), (f"https://{HOST}:443{RFC}", "rfc9110"),
    (f"https://WWW.RFC-EDITOR.ORG{RFC}", "rfc9110"), (f"https://{HOST}{RFC}#section-15.6.4", "rfc9110"),
])
def test_url_control_cases_are_accepted(url, document):
    """The table above is not vacuous: the real shapes are accepted."""
    assert regression.rfc_document(url) == document


# ====================================================================== 6. secrets

def echo_auth_agent(request):
    auth = request.headers.get("Authorization", "")
    case = fakes.CASES_BY_QUESTION[(request.json or {})["input"]]
    url = fakes.RFC_URL.format(case["rfc"])
    return Reply(body=fakes.agent_response(f"you sent {auth}", urls=[url]))


def echo_auth_chat(request):
    auth = request.headers.get("Authorization", "")
    return Reply(body=fakes.chat_response(f"Annual plans can be refunded within 30 days; you sent {auth}"))


def echo_auth_error(status):
    def reply(request):
        auth = request.headers.get("Authorization", "")
        key = auth.split()[-1] if auth else ""
        return Reply(status, {"error": {"message": f"rejected {auth} (key {key})", "type": "fake"}})
    return reply


def reports(folder, name):
    return ["--markdown", folder / f"{name}.md", "--junit", folder / f"{name}.xml", "--html", folder / f"{name}.html"]


def test_secrets_never_written_and_outputs_are_0600_and_never_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    results = []
    openai_env = child_env(key=PPLX_KEY, OPENAI_API_KEY=OPENAI_KEY, MY_ENDPOINT_KEY=ENDPOINT_KEY)

    def perplexity(name, reply, expected):
        with FakeServer(reply) as server:
            result = run_cli(["--models", "m", "--timeout", "5", "--out", out / f"{name}.json", *reports(out, name)],
                             child_env(server, OPENAI_API_KEY=OPENAI_KEY), tmp_path)
            assert any(PPLX_KEY in request.headers.get("Authorization", "") for request in server.requests)
        assert result.returncode == expected, (name, result.stderr)
        results.append(result)

    def openai(name, reply, expected):
        with FakeServer(reply) as server:
            result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env",
                              "MY_ENDPOINT_KEY", "--models", "m", "--suite", GUARDRAILS, "--timeout", "5",
                              "--out", out / f"{name}.json", *reports(out, name)], openai_env, tmp_path)
            assert server.requests[0].headers.get("Authorization") == f"Bearer {ENDPOINT_KEY}"
        assert result.returncode == expected, (name, result.stderr)
        results.append(result)

    perplexity("pplx-echoed", echo_auth_agent, 1)
    perplexity("pplx-401", echo_auth_error(401), 2)
    perplexity("pplx-500", echo_auth_error(500), 2)
    openai("openai-echoed", echo_auth_chat, 1)
    openai("openai-401", echo_auth_error(401), 2)
    openai("openai-500", echo_auth_error(500), 2)
    for name, args, expected in (
            ("echo", ["--provider", "echo", "--models", "m"], 1),
            # a record whose responses hold a masked key is refused by replay (test_trust.py), so
            # replay the echo record: the replay run itself must still write no secret
            ("replay", ["--provider", "replay", "--replay", out / "echo.json"], 1)):
        result = run_cli([*args, "--out", out / f"{name}.json", *reports(out, name)], openai_env, tmp_path)
        assert result.returncode == expected, (name, result.stderr)
        results.append(result)

    assert "rejected" in read_json(out / "pplx-500.json")["runs"][0]["error_message"]  # the body was kept...
    files = files_under(tmp_path)
    assert len(files) == 8 * 4
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (path.name, secret)
            assert f"Bearer {secret}".encode() not in data, path.name
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path.name
    for result in results:
        for secret in SECRETS:
            assert secret not in result.stdout and secret not in result.stderr

    # a second run naming an existing record or report exits 2 and changes nothing
    snapshot = {path: path.read_bytes() for path in files}
    for reused in ("json", "md", "xml", "html"):
        fresh = {kind: out / f"again-{reused}.{kind}" for kind in ("json", "md", "xml", "html")}
        fresh[reused] = out / f"echo.{reused}"
        result = run_cli(["--provider", "echo", "--models", "m", "--out", fresh["json"], "--markdown", fresh["md"],
                          "--junit", fresh["xml"], "--html", fresh["html"]], openai_env, tmp_path)
        assert result.returncode == 2, reused
        one_error_line(result.stderr)
        assert {path: path.read_bytes() for path in files_under(tmp_path)} == snapshot, reused


def test_secret_echoed_as_a_json_object_key_is_not_stored(tmp_path):
    """The redaction masks string values; an endpoint may also put the header into an object key."""
    def agent(request):
        reply = perplexity_good(request)
        reply.body["echo"] = {request.headers.get("Authorization", ""): "seen"}
        return reply

    def chat(request):
        reply = openai_good(request)
        reply.body[request.headers.get("Authorization", "")] = 1
        return reply

    with FakeServer(agent) as server:
        first = run_cli(["--models", "m", "--out", tmp_path / "agent.json"], child_env(server), tmp_path)
    with FakeServer(chat) as server:
        second = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_ENDPOINT_KEY",
                          "--models", "m", "--suite", GUARDRAILS, "--out", tmp_path / "chat.json"],
                         child_env(key=None, MY_ENDPOINT_KEY=ENDPOINT_KEY), tmp_path)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    for path, secret in ((tmp_path / "agent.json", PPLX_KEY), (tmp_path / "chat.json", ENDPOINT_KEY)):
        assert secret.encode() not in path.read_bytes(), f"{path.name} holds the key inside an object key"


def test_secret_cut_by_the_error_message_limit_leaves_no_fragment(tmp_path):
    """error_message keeps 500 characters; a key cut at that boundary must not survive in part."""
    prefix = len("Error code: 500 - {'error': {'message': '")  # the SDK's APIStatusError text

    def reply(request):
        auth = request.headers.get("Authorization", "")
        padding = 500 - prefix - len("Bearer ") - 16  # the cut falls after 16 characters of the key
        return Reply(500, {"error": {"message": "x" * padding + auth}})

    with FakeServer(reply) as server:
        result = run_cli(["--models", "m", "--out", tmp_path / "run.json"], child_env(server), tmp_path)
    assert result.returncode == 2
    data = (tmp_path / "run.json").read_text(encoding="utf-8")
    fragments = [PPLX_KEY[start:start + 12] for start in range(len(PPLX_KEY) - 11)]
    assert not [fragment for fragment in fragments if fragment in data], \
        read_json(tmp_path / "run.json")["runs"][0]["error_message"][-60:]
