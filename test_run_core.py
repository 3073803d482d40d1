"""Run core: one frozen Settings, options re-applied on --resume, the record lock, signals,
a closed stdout, and the command that continues every kind of stop (issues 10, 11, 14).

Promises about the command line run through the real CLI (`python regression.py ...`),
signals and locks with real processes; every test is bounded and offline (127.0.0.1)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fakes
import regression
from fakes import Reply

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
COMPARE = HERE / "compare_runs.py"
# min_chars 1: an empty reply fails every case, so no run starts with a weak-case warning
SUITE = {"name": "core", "instructions": "Answer briefly.",
         "cases": [{"id": "mail", "input": "write to bob@example.com", "min_chars": 1},
                   {"id": "card", "input": "card 4111 1111 1111 1111", "min_chars": 1},
                   {"id": "plain", "input": "q3", "min_chars": 1},
                   {"id": "more", "input": "q4", "min_chars": 1}]}
KEY_VARIABLE = "CORE_TEST_KEY"
# How a printed command names the script run by its path from tmp_path (test_first_hour.py
# pastes such commands into a shell); in-process runs name regression.program_name().
PROGRAM = f"{regression._python_word()} {SCRIPT}"


def clean_env(**extra):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_", KEY_VARIABLE))
           and name.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@pytest.fixture(autouse=True)
def no_twins(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_")):
            monkeypatch.delenv(name)


def cli(args, cwd, env=None, timeout=60):
    """`python regression.py ARGS`, forked from a zygote that paid the SDK import once
    (fakes.run_script): the real CLI; the tests of signals, pipes and imports start their own."""
    return fakes.run_script(args, cwd, env or clean_env(), timeout=timeout)


def one_line(text):
    lines = text.rstrip("\n").split("\n")
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def read(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_suite(folder, suite=SUITE):
    path = Path(folder) / "suite.json"
    path.write_text(json.dumps(suite))
    return path


def main_code(argv):
    try:
        return regression.main([str(arg) for arg in argv])
    except SystemExit as exc:
        return exc.code


def cut_to(path, rows):
    """Make `path` an unfinished record holding only its first `rows` rows (as a crash would)."""
    record = read(path)
    header = {key: value for key, value in record.items() if key not in ("runs", "summary")}
    config = record["config"]
    kept = record["runs"][:rows]
    path.unlink()
    regression.create_record(str(path), header, kept,
                             regression.summary(kept, config["models"], config["repeats"], config["cases"])).close()


def temp_files(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


# ====================================================================== Settings (issue 10 item 3)

def test_settings_are_frozen_and_every_option_is_a_field():
    parser = regression.build_parser()
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    assert dests <= set(regression.Settings.FIELDS), dests - set(regression.Settings.FIELDS)
    _, settings = regression.parse_args(["--provider", "echo", "--dry-run"], env={})
    with pytest.raises(AttributeError):
        settings.retries = 3
    with pytest.raises(AttributeError):
        del settings.retries
    assert settings.replace(retries=3).retries == 3 and settings.retries == 0
    with pytest.raises(TypeError, match="no field"):
        regression.Settings(no_such_option=1)
    assert isinstance(settings.models, tuple) and isinstance(settings.redact, tuple)


def test_flags_beat_environment_twins_which_beat_defaults():
    env = {"REGRESSION_RETRIES": "4", "REGRESSION_CONCURRENCY": "3", "REGRESSION_SHARD": "2/5"}
    _, settings = regression.parse_args(["--provider", "echo", "--retries", "1", "--dry-run"], env=env)
    assert (settings.retries, settings.concurrency, settings.shard) == (1, 3, (2, 5))
    _, settings = regression.parse_args(["--dry-run"], env={"REGRESSION_PROVIDER": "echo",
                                                         "PROMPTREG_PROVIDER": "openai"})
    assert settings.provider == "echo", "the first twin in ENV_TWINS order wins"
    _, settings = regression.parse_args(["--provider", "echo", "--dry-run"], env={})
    assert (settings.retries, settings.concurrency, settings.repeats, settings.timeout) == (0, 1, 1, 180)
    assert settings.models == ("echo",) and settings.max_cost_usd is None


def test_ranges_are_checked_once_on_the_resolved_values(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--out", out]) == 0
    cut_to(out, 1)
    calls = []
    real = regression._check_ranges
    monkeypatch.setattr(regression, "_check_ranges", lambda *a: calls.append(a) or real(*a))
    _, settings = regression.parse_args(["--resume", str(out)], env={})
    assert len(calls) == 1
    assert settings.resumed_record is not None and settings.models == ("echo",)


# ====================================================================== messages through the real CLI

FORK_RUNNER = r"""
import json, os, runpy, sys, tempfile
sys.path.insert(0, os.path.dirname(SCRIPT))
import regression  # warm the imports once; every child still runs the script itself
with open(SCRIPT, encoding="utf-8") as handle:
    program = compile(handle.read(), SCRIPT, "exec")
cases = json.load(sys.stdin)
results = []
for argv, env in cases:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        os.environ.update(env)
        sys.argv = ["regression.py", *argv]
        try:
            exec(program, {"__name__": "__main__", "__file__": SCRIPT})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    out.seek(0); err.seek(0)
    results.append([os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()])
print(json.dumps(results))
"""


def fork_cli(cases, cwd):
    """Run `python regression.py ARGV` for every (argv, env) in one child that forks per case:
    the real script entry point, a fraction of the start-up cost."""
    code = FORK_RUNNER.replace("SCRIPT", repr(str(SCRIPT)))
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(cases), cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


MESSAGE_TABLE = [
    # (argv, environment, exit code, a piece of the one stderr line)
    (["--concurency", "3"], {}, 2, "did you mean --concurrency?"),
    (["--concurrency", "2", "--retrys", "1"], {}, 2, "did you mean --retries?"),
    (["--no-such-flag"], {}, 2, "unrecognized arguments: --no-such-flag"),
    (["--provider", "replay"], {}, 2, "--provider replay needs --replay RECORD"),
    ([], {"REGRESSION_REPEATS": "two"}, 2,
     "REGRESSION_REPEATS='two' is not valid: use a whole number from 1 to 100"),
    ([], {"REGRESSION_REPEATS": "101"}, 2,
     "REGRESSION_REPEATS=101: must be a whole number from 1 to 100"),
    ([], {"REGRESSION_CONCURRENCY": "x"}, 2, "use a whole number from 1 to 64"),
    ([], {"REGRESSION_RETRIES": "-1"}, 2, "REGRESSION_RETRIES=-1: must be a whole number from 0 to 10"),
    (["--timeout", "1e12"], {}, 2, "--timeout: must be a number from 0.1 to 3600 seconds"),
    (["--timeout", "0"], {}, 2, "--timeout: must be a number from 0.1 to 3600 seconds"),
    (["--timeout", "nan"], {}, 2, "--timeout: must be a number from 0.1 to 3600 seconds"),
    (["--timeout", "inf"], {}, 2, "--timeout: must be a number from 0.1 to 3600 seconds"),
    (["--timeout", "0.05"], {}, 2, "--timeout: must be a number from 0.1 to 3600 seconds"),
    (["--timeout", "3600.5"], {}, 2, "--timeout: must be a number from 0.1 to 3600 seconds"),
    (["--timeout", "0.1"], {}, 0, None),
    (["--timeout", "3600"], {}, 0, None),
    (["--repeats", "0"], {}, 2, "--repeats: must be a whole number from 1 to 100"),
    (["--concurrency", "65"], {}, 2, "--concurrency: must be a whole number from 1 to 64"),
]


def test_cli_messages_table(tmp_path):
    cases = [[[*argv, "--provider", "echo", "--dry-run"] if "--provider" not in argv else [*argv, "--dry-run"], env]
             for argv, env, _, _ in MESSAGE_TABLE]
    for (argv, env, code, piece), (got, out, err) in zip(MESSAGE_TABLE, fork_cli(cases, tmp_path)):
        assert got == code, (argv, env, got, err)
        assert "Traceback" not in err, (argv, err)
        if code == 2:
            line = one_line(err)
            assert piece is None or piece in line, (argv, line)
    assert os.listdir(tmp_path) == []


def test_help_documents_the_timeout_range(tmp_path):
    text = regression.build_parser().format_help()
    assert "0.1-3600 seconds" in " ".join(text.split())


def test_existing_out_is_refused_before_the_sdk_is_imported(tmp_path):
    out = tmp_path / "results.json"
    out.write_text("precious")
    env = clean_env(PERPLEXITY_API_KEY="pplx-test-key-0123456789")
    proc = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPT), "--out", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert len(lines) == 1 and "already exists" in lines[0], proc.stderr
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert not any(name.startswith("perplexity") or name.startswith("httpx") for name in imported)
    assert out.read_text() == "precious"


# ====================================================================== --resume re-applies run options

def test_resume_reapplies_pii_redaction_and_patterns(tmp_path):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--redact-pii", "--redact", "q[0-9]",
                      "--out", out]) == 0
    record = read(out)
    assert record["run_options"]["redact_pii"] is True
    # A pattern can be the secret itself: the record keeps its hash, never the pattern.
    assert record["run_options"]["redact"] == [regression.pattern_digest("q[0-9]")]
    assert b"q[0-9]" not in out.read_bytes()
    cut_to(out, 1)
    before = out.read_bytes()
    proc = cli(["--resume", out], tmp_path)  # the patterns must be given again, and are checked
    assert proc.returncode == 2 and "same --redact flags" in one_line(proc.stderr)
    assert out.read_bytes() == before
    assert main_code(["--resume", out, "--redact", "q[0-9]"]) == 0
    resumed = read(out)
    text = json.dumps(resumed["runs"])
    assert "bob@example.com" not in text and "4111 1111 1111 1111" not in text
    assert "q3" not in text and "q4" not in text
    assert "[REDACTED:email]" in text and "[REDACTED:card]" in text and "[REDACTED]" in text
    assert resumed["run_options"] == record["run_options"]
    assert resumed["summary"]["complete"] is True


@pytest.mark.parametrize("flags, key", [
    (["--redact-pii", "--redact", "q[0-9]"], "redact_pii"),
    (["--redact", "other"], "redact"),
])
def test_resume_refuses_a_different_redaction_naming_the_key(tmp_path, flags, key):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--redact", "q[0-9]", "--out", out]) == 0
    cut_to(out, 1)
    before = out.read_bytes()
    proc = cli(["--resume", out, *flags], tmp_path)
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert f"'{key}'" in line and "differs from the record" in line
    assert out.read_bytes() == before


def test_resume_of_an_older_record_reapplies_its_pii_marker(tmp_path):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--redact-pii", "--out", out]) == 0
    record = read(out)
    del record["run_options"]  # as written before run options were stored
    header = {key: value for key, value in record.items() if key not in ("runs", "summary")}
    out.unlink()
    regression.create_record(str(out), header, [], regression.summary([], ["echo"], 1, record["config"]["cases"])).close()
    assert main_code(["--resume", out]) == 0
    assert "bob@example.com" not in json.dumps(read(out)["runs"])


def test_resume_reapplies_the_cost_cap(tmp_path, monkeypatch):
    """Every fake reply costs $0.0012: a $0.002 cap stops after 2 rows. A resume that forgot the
    cap would pay for the rest; with it, no new request starts until the cap is raised."""
    out = tmp_path / "run.json"
    with fakes.FakeServer(fakes.advisor()) as server:
        monkeypatch.setenv("PERPLEXITY_BASE_URL", server.url)
        monkeypatch.setenv("PERPLEXITY_API_KEY", "pplx-test-key-0123456789")
        assert main_code(["--models", "m", "--max-cost-usd", "0.002", "--out", out]) == 2
        assert len(read(out)["runs"]) == 2 and server.count == 2
        assert main_code(["--resume", out]) == 2
        assert server.count == 2, "the resumed run must not spend past the record's cap"
        record = read(out)
        assert "--max-cost-usd reached" in record["summary"]["stopped"]
        assert record["run_options"]["max_cost_usd"] == "0.002"
        assert main_code(["--resume", out, "--max-cost-usd", "1"]) == 0
        assert server.count == 4 and read(out)["run_options"]["max_cost_usd"] == "1"


STORED_OPTIONS = [
    ("retries", "x"), ("retries", 99), ("retries", True), ("concurrency", 0), ("concurrency", [2]),
    ("redact", "q"), ("redact", [1]), ("redact", {"a": 1}), ("redact_pii", "yes"), ("redact_pii", None),
    ("max_cost_usd", 5), ("max_cost_usd", "-1"), ("max_cost_usd", "NaN"), ("max_cost_usd", ["1"]),
]


def test_a_crafted_run_options_header_is_one_line_and_exit_2(tmp_path):
    """What --resume re-applies is checked like the flag it stands for, through the real CLI."""
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--out", out]) == 0
    record = read(out)
    cases = []
    for n, (name, value) in enumerate([*STORED_OPTIONS, (None, None)]):
        crafted = dict(record, run_options=dict(record["run_options"], **{name: value}) if name else [1])
        crafted["runs"] = record["runs"][:1]
        path = tmp_path / f"crafted-{n}.json"
        path.write_text(json.dumps(crafted))
        cases.append([["--resume", str(path)], {}])
    for (name, value), (code, _, err) in zip([*STORED_OPTIONS, (None, None)], fork_cli(cases, tmp_path)):
        assert code == 2, (name, value, err)
        line = one_line(err)
        assert (f"run_options.{name}" if name else "run_options") in line, line  # the record validator or resume
    assert temp_files(tmp_path) == []


def test_resume_takes_limits_from_the_record_unless_given(tmp_path):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--retries", "2", "--concurrency", "3",
                      "--out", out]) == 0
    cut_to(out, 1)
    _, settings = regression.parse_args(["--resume", str(out)], env={})
    assert (settings.retries, settings.concurrency) == (2, 3)
    _, settings = regression.parse_args(["--resume", str(out), "--retries", "5"], env={})
    assert (settings.retries, settings.concurrency) == (5, 3)
    assert main_code(["--resume", out, "--retries", "5"]) == 0
    assert read(out)["run_options"]["retries"] == 5


def test_stale_temp_files_never_block_a_resume(tmp_path):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--out", out]) == 0
    cut_to(out, 2)
    stale = [tmp_path / f"run.json.{os.getpid()}.tmp", tmp_path / f"run.json.{os.getpid() + 1}.tmp",
             tmp_path / ".run.json.abcdefgh.tmp"]
    for path in stale:
        path.write_text("stale")
    assert main_code(["--resume", out]) == 0
    assert read(out)["summary"]["complete"] is True
    assert sorted(temp_files(tmp_path)) == sorted(path.name for path in stale)  # untouched, not ours


# ====================================================================== checkpoints and signals

def test_a_signal_during_a_checkpoint_is_deferred_until_the_row_is_durable(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    real, calls = regression._pwrite_all, []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 4:  # header+summary, row 1, then in the middle of row 2's checkpoint
            os.kill(os.getpid(), signal.SIGINT)
        return real(fd, data, offset)

    monkeypatch.setattr(regression, "_pwrite_all", pwrite)
    with pytest.raises(KeyboardInterrupt) as caught:
        regression.main(["--provider", "echo", "--suite", str(suite), "--out", str(out)])
    record = read(out)
    assert record["summary"]["rows"] == len(record["runs"])
    assert record["summary"]["stopped"] == "interrupted" and record["summary"]["exit_code"] == 2
    assert caught.value.code == 130
    assert f"{len(record['runs'])} finished row(s) saved in {out}" in caught.value.message
    assert temp_files(tmp_path) == []


def test_sigterm_during_a_checkpoint_is_terminated_and_never_counts_a_missing_row(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    real, calls = regression._pwrite_all, []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(fd, data, offset)

    monkeypatch.setattr(regression, "_pwrite_all", pwrite)
    with pytest.raises(regression.Terminated) as caught:
        regression.main(["--provider", "echo", "--suite", str(suite), "--out", str(out)])
    record = read(out)
    assert record["summary"]["rows"] == len(record["runs"]) >= 1
    assert record["summary"]["stopped"] == "terminated"
    assert caught.value.code == 143 and caught.value.message.startswith("terminated: ")


def test_interrupt_during_the_reorder_is_one_true_line_and_leaves_no_temp(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    real_run, real_start = regression.run_rows, regression._start_record

    def out_of_order(*args):
        stopped, _, last = real_run(*args)
        return stopped, False, last  # as after --concurrency: the rows get reordered

    def start(fd, path, *args):
        if path != str(out):
            os.kill(os.getpid(), signal.SIGINT)  # inside the temp file's writing
        return real_start(fd, path, *args)

    monkeypatch.setattr(regression, "run_rows", out_of_order)
    monkeypatch.setattr(regression, "_start_record", start)
    with pytest.raises(KeyboardInterrupt) as caught:
        regression.main(["--provider", "echo", "--suite", str(suite), "--out", str(out)])
    assert caught.value.message == f"interrupted after the run ended: {out} holds its 4 row(s) and summary (exit code 0)"
    assert temp_files(tmp_path) == []
    record = read(out)
    assert record["summary"]["complete"] is True and len(record["runs"]) == 4


def test_interrupt_while_writing_reports_names_the_reports_still_to_write(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    out, md, html = tmp_path / "run.json", tmp_path / "r.md", tmp_path / "r.html"
    real = regression.write_reports

    def reports(record, targets):
        if "html" in targets:
            raise KeyboardInterrupt
        return real(record, targets)

    monkeypatch.setattr(regression, "write_reports", reports)
    with pytest.raises(KeyboardInterrupt) as caught:
        regression.main(["--provider", "echo", "--suite", str(suite), "--out", str(out), "--markdown", str(md),
                         "--html", str(html)])
    assert caught.value.message == (f"interrupted while writing reports; {out} is complete; write the rest with: "
                                    f"{regression.program_name()} --report {out} --html {html}")
    assert md.exists() and not html.exists()
    monkeypatch.setattr(regression, "write_reports", real)
    assert main_code(["--report", out, "--html", html]) == 0 and html.exists()


def test_interrupt_after_a_merge_created_its_record_never_says_it_was_not_created(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    shards = [tmp_path / f"shard{n}.json" for n in (1, 2)]
    for n, shard in enumerate(shards, 1):
        assert main_code(["--provider", "echo", "--suite", suite, "--shard", f"{n}/2", "--out", shard]) == 0
    out = tmp_path / "merged.json"
    real = regression.load_record

    def load(path, *args, **kwargs):
        if str(path) == str(out):  # the merged record exists: read back for its reports
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(regression, "load_record", load)
    with pytest.raises(KeyboardInterrupt) as caught:
        regression.main(["--merge", str(out), *map(str, shards), "--markdown", str(tmp_path / "r.md")])
    assert caught.value.message == f"interrupted after merging; {out} is complete"
    assert read(out)["summary"]["complete"] is True


def test_interrupt_during_a_resume_rewrite_leaves_the_record_unchanged(tmp_path, monkeypatch):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--out", out]) == 0
    cut_to(out, 2)
    before = out.read_bytes()
    real = regression._start_record

    def start(fd, path, *args):
        os.kill(os.getpid(), signal.SIGINT)
        return real(fd, path, *args)

    monkeypatch.setattr(regression, "_start_record", start)
    with pytest.raises(KeyboardInterrupt) as caught:
        regression.main(["--resume", str(out)])
    assert caught.value.message == f"interrupted before the first request; {out} is unchanged"
    assert out.read_bytes() == before and temp_files(tmp_path) == []


def test_a_failure_after_the_response_arrived_keeps_the_row(tmp_path, monkeypatch):
    """RecursionError while masking (or any failure after the reply) is an execution_error row."""
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"

    def broken(row, mask):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(regression, "redact_row", broken)
    assert main_code(["--provider", "echo", "--suite", suite, "--redact-pii", "--out", out]) == 2
    record = read(out)
    assert len(record["runs"]) == 1
    row = record["runs"][0]
    assert row["error"] == "RecursionError" and row["reasons"] == ["execution_error"] and row["passed"] is False
    assert row["answer_text"] == "write to [REDACTED:email]"
    assert "could not be stored" in row["error_message"]
    assert record["summary"]["rows"] == 1 and record["summary"]["exit_code"] == 2


def deep_reply(request):
    """A 200 reply nested 900 levels deep: json parses it, recursive masking cannot."""
    nested = '{"k": [' * 450 + '"end"' + "]}" * 450
    body = json.dumps(fakes.chat_response("plain answer"))
    return Reply(raw=(body[:-1] + ', "extra": ' + nested + "}").encode())


def test_a_900_deep_reply_is_an_execution_error_row_through_the_cli(tmp_path):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    with fakes.FakeServer(deep_reply) as server:
        proc = cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m", "--suite", suite,
                    "--redact-pii", "--out", out], tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    record = read(out)
    assert len(record["runs"]) == 1
    assert record["runs"][0]["reasons"] == ["execution_error"]
    assert record["runs"][0]["answer_text"] == "plain answer"
    assert f"continue with: {PROGRAM} --resume" in proc.stderr


# ====================================================================== real processes: lock, SIGINT, SIGTERM

def slow_after_first(request):
    """First reply at once, then slow ones: the run is mid-flight long enough to poke at it."""
    return Reply(body=fakes.chat_response("answer"), delay=0 if request.number == 1 else 8)


def start_slow_run(tmp_path, server, *extra):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    env = clean_env(**{KEY_VARIABLE: "local-test-key-0123456789"})
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--provider", "openai", "--base-url", server.url + "/v1",
                             "--api-key-env", KEY_VARIABLE, "--models", "m", "--suite", str(suite), "--out", str(out),
                             *map(str, extra)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if out.exists() and server.count >= 2 and b'"case_id"' in out.read_bytes():
            return proc, out, env
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"the slow run did not get going: {proc.communicate()}")


def test_a_record_being_written_refuses_resume_and_merge_then_sigterm_saves_it(tmp_path):
    with fakes.FakeServer(slow_after_first) as server:
        proc, out, env = start_slow_run(tmp_path, server)
        try:
            second = cli(["--resume", out, "--api-key-env", KEY_VARIABLE], tmp_path, env=env, timeout=30)
            merged = cli(["--merge", tmp_path / "merged.json", out], tmp_path, env=env, timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert second.returncode == 2
    assert "is being written by another process" in one_line(second.stderr)
    assert merged.returncode == 2
    assert "is being written by another process" in one_line(merged.stderr)
    assert not (tmp_path / "merged.json").exists()
    assert proc.returncode == 143
    line = one_line(err)
    assert line.startswith("terminated: 1 finished row(s) saved in ")
    assert line.endswith(f"continue with: {PROGRAM} --resume {out} --api-key-env {KEY_VARIABLE}")
    record = read(out)
    assert record["summary"]["stopped"] == "terminated" and record["summary"]["rows"] == len(record["runs"]) == 1
    assert temp_files(tmp_path) == []


def test_ctrl_c_prints_the_full_command_and_that_command_finishes_the_run(tmp_path):
    import shlex
    md = tmp_path / "r.md"
    with fakes.FakeServer(slow_after_first) as server:
        proc, out, env = start_slow_run(tmp_path, server, "--markdown", md, "--redact", "ans[a-z]+")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130
        line = one_line(err)
        command = line.split("continue with: ", 1)[1]
        # A --redact pattern can be the secret itself: the command names how many to give again.
        assert command == (f"{PROGRAM} --resume {out} --api-key-env {KEY_VARIABLE} "
                           f"--markdown {md} plus the same 1 --redact flag(s) it was made with")
        assert "ans[a-z]+" not in err
        command = command.split(" plus the same ")[0] + " --redact 'ans[a-z]+'"
        server.reply = lambda request: Reply(body=fakes.chat_response("answer"))
        # the resume is forked (not about signals): the printed command's arguments, as run
        finished = fakes.run_script(shlex.split(command)[2:], tmp_path, env)
    assert finished.returncode == 0, finished.stderr
    assert read(out)["summary"]["complete"] is True and md.exists()
    # every row, before and after the interruption, is masked alike
    assert [row["answer_text"] for row in read(out)["runs"]] == ["[REDACTED]"] * len(SUITE["cases"])


# ====================================================================== the next step is always printed

def test_execution_error_prints_the_resume_command_with_retries_when_transient(tmp_path):
    suite = write_suite(tmp_path)
    for status, flags in ((503, " --retries 3"), (400, "")):
        out = tmp_path / f"run-{status}.json"
        failing = fakes.failing(status, after=1, then=lambda request: Reply(body=fakes.chat_response("ok")))
        with fakes.FakeServer(failing) as server:
            proc = cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m", "--suite", suite,
                        "--out", out], tmp_path)
        assert proc.returncode == 2
        line = one_line(proc.stderr)
        assert line.startswith("stopped early: execution error on m / card / repeat 0")
        assert line.endswith(f"; continue with: {PROGRAM} --resume {out}{flags}"), line


def test_an_error_on_the_last_row_still_prints_the_resume_command(tmp_path):
    suite = write_suite(tmp_path, dict(SUITE, cases=SUITE["cases"][:1]))
    out = tmp_path / "run.json"
    with fakes.FakeServer(fakes.failing(502)) as server:
        proc = cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m", "--suite", suite,
                    "--out", out], tmp_path)
    assert proc.returncode == 2
    assert one_line(proc.stderr).endswith(f"; continue with: {PROGRAM} --resume {out} --retries 3")
    assert read(out)["summary"]["complete"] is True  # every row is there, one of them an error


def test_budget_stop_prints_the_resume_command_with_a_higher_cap(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run.json"
    with fakes.FakeServer(fakes.advisor()) as server:
        monkeypatch.setenv("PERPLEXITY_BASE_URL", server.url)
        monkeypatch.setenv("PERPLEXITY_API_KEY", "pplx-test-key-0123456789")
        assert main_code(["--models", "m", "--max-cost-usd", "0.002", "--out", out]) == 2
    line = one_line(capsys.readouterr().err)
    assert "--max-cost-usd reached" in line
    program = regression.program_name()  # in-process: the script file itself
    # the spend so far ($0.0024) plus the cap again (twice the cap left less than the cap to spend)
    assert line.endswith(f"continue with: {program} --resume {out} --max-cost-usd 0.0044"), line
    assert len(read(out)["runs"]) == 2


def test_existing_unfinished_out_names_the_resume_command(tmp_path):
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--out", out]) == 0
    done = cli(["--provider", "echo", "--suite", suite, "--out", out], tmp_path)
    assert done.returncode == 2 and "continue" not in one_line(done.stderr)
    cut_to(out, 1)
    proc = cli(["--provider", "echo", "--suite", suite, "--out", out], tmp_path)
    assert proc.returncode == 2
    assert one_line(proc.stderr).endswith(
        f"already exists (records and reports never overwrite a file); it holds an unfinished record "
        f"(1 row(s) saved); continue it with: {PROGRAM} --resume {out}")
    masked = tmp_path / "masked.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--redact", "q[0-9]", "--out", masked]) == 0
    cut_to(masked, 1)
    proc = cli(["--provider", "echo", "--suite", suite, "--out", masked], tmp_path)
    assert one_line(proc.stderr).endswith(
        f"continue it with: {PROGRAM} --resume {masked} plus the same 1 --redact flag(s) it was "
        "made with")


def test_incomplete_merge_names_missing_shards_rows_and_unfinished_shards(tmp_path):
    suite = write_suite(tmp_path)
    one, two = tmp_path / "s1.json", tmp_path / "s2.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--shard", "1/3", "--out", one]) == 0
    assert main_code(["--provider", "echo", "--suite", suite, "--shard", "2/3", "--out", two]) == 0
    cut_to(two, 0)
    proc = cli(["--merge", tmp_path / "all.json", one, two], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.rstrip("\n").split("\n")
    assert lines[0].startswith("merged record is incomplete: 2 of 4 rows; missing or errored: echo / card / 0")
    assert "no record of shard(s) 3/3" in lines[1]
    assert lines[2] == (f"{two} is unfinished: continue it with: {PROGRAM} --resume {two}, then "
                        "merge again")
    assert "Traceback" not in proc.stderr


def test_complete_merge_with_an_errored_row_says_why_it_exits_2(tmp_path):
    suite = write_suite(tmp_path)
    one, two = tmp_path / "s1.json", tmp_path / "s2.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--shard", "1/2", "--out", one]) == 0
    assert main_code(["--provider", "echo", "--suite", suite, "--shard", "2/2", "--out", two]) == 0
    record = read(two)
    record["runs"][0].update(error="HTTPError", error_status=503, reasons=["execution_error"], passed=False)
    two.write_text(json.dumps(record))
    proc = cli(["--merge", tmp_path / "all.json", one, two], tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.rstrip("\n").split("\n")
    assert lines[0].startswith("merged record holds execution errors: 4 of 4 rows"), proc.stderr
    assert lines[-1] == (f"{two} is unfinished: continue it with: {PROGRAM} --resume {two}, then "
                         "merge again")


# ====================================================================== a closed stdout

def closed_pipe():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line, like `| head -0`
    return write_end


def test_closed_stdout_never_stops_a_run_or_changes_its_exit_code(tmp_path):
    suite = write_suite(tmp_path)
    out, html = tmp_path / "run.json", tmp_path / "r.html"
    write_end = closed_pipe()
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), "--provider", "echo", "--suite", str(suite),
                               "--out", str(out), "--html", str(html)], cwd=tmp_path, env=clean_env(),
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    record = read(out)
    assert record["summary"]["complete"] is True and len(record["runs"]) == 4
    assert html.exists()


def test_closed_stdout_keeps_compare_exit_code(tmp_path):
    suite = write_suite(tmp_path)
    before, after = tmp_path / "a.json", tmp_path / "b.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--out", before]) == 0
    changed = dict(SUITE, cases=[dict(case, contains=["zzz"]) if case["id"] == "plain" else case
                                 for case in SUITE["cases"]])
    changed_suite = tmp_path / "changed.json"
    changed_suite.write_text(json.dumps(changed))
    assert main_code(["--provider", "replay", "--replay", before, "--suite", changed_suite, "--out", after]) == 1
    open_proc = subprocess.run([sys.executable, str(COMPARE), str(before), str(after)], cwd=tmp_path,
                               env=clean_env(), capture_output=True, text=True, timeout=60)
    write_end = closed_pipe()
    try:
        closed = subprocess.run([sys.executable, str(COMPARE), str(before), str(after)], cwd=tmp_path,
                                env=clean_env(), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert closed.returncode == open_proc.returncode
    assert "Traceback" not in closed.stderr and "BrokenPipe" not in closed.stderr


def test_a_redact_pattern_never_reaches_the_continue_command(tmp_path):
    """A pattern can be the secret itself: the record keeps its hash, and the printed command
    says how many --redact flags to give again, never the patterns."""
    suite = write_suite(tmp_path)
    out = tmp_path / "run.json"
    pattern = "sk-live-SECRET123"
    with fakes.FakeServer(fakes.failing(503)) as server:
        proc = cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m", "--suite", suite,
                    "--redact", pattern, "--out", out], tmp_path)
    assert proc.returncode == 2
    assert pattern not in proc.stderr + proc.stdout
    assert f"continue with: {PROGRAM} --resume {out} --retries 3 plus the same 1 --redact flag(s)" \
        in proc.stderr
    assert pattern.encode() not in out.read_bytes()


def test_merge_refuses_shards_masked_differently(tmp_path):
    suite = write_suite(tmp_path)
    one, two = tmp_path / "s1.json", tmp_path / "s2.json"
    assert main_code(["--provider", "echo", "--suite", suite, "--shard", "1/2", "--redact", "q[0-9]",
                      "--out", one]) == 0
    assert main_code(["--provider", "echo", "--suite", suite, "--shard", "2/2", "--out", two]) == 0
    proc = cli(["--merge", tmp_path / "all.json", one, two], tmp_path)
    assert proc.returncode == 2
    assert "differs from" in one_line(proc.stderr) and "redaction" in proc.stderr
    assert not (tmp_path / "all.json").exists()


# ---------------------------------------------------------------------- what a saved record is trusted with
FAILING_SUITE = {"name": "trust", "instructions": "Answer briefly.",
                 "cases": [{"id": "ok", "input": "say hello", "contains": ["hello"]},
                           {"id": "bad", "input": "say bye", "contains": ["never said"]}]}


def failing_record(folder, name="run.json"):
    """A finished echo record whose "bad" row failed (exit 1 when made)."""
    out = Path(folder) / name
    assert main_code(["--provider", "echo", "--suite", write_suite(folder, FAILING_SUITE), "--out", out]) == 1
    return out


@pytest.mark.parametrize("command", ["resume", "merge", "replay"])
def test_a_row_marked_passed_that_holds_reasons_is_refused_not_counted_as_a_pass(tmp_path, command):
    """The verdict counts only `passed`: a hand-edited row that failed (reasons kept) but says
    passed: true made --resume and --merge print exit_code 0. Every reader refuses it, naming it."""
    out = failing_record(tmp_path)
    record = json.loads(out.read_text())
    row = next(row for row in record["runs"] if row["case_id"] == "bad")
    assert row["reasons"] and row["passed"] is False
    row["passed"] = True
    out.write_text(json.dumps(record))
    args = {"resume": ["--resume", out], "merge": ["--merge", tmp_path / "all.json", out],
            "replay": ["--provider", "replay", "--replay", out, "--out", tmp_path / "again.json"]}[command]
    proc = cli(args, tmp_path)
    assert proc.returncode == 2
    assert "runs[1].passed is true but the row holds reasons or an error" in one_line(proc.stderr)
    assert '"exit_code": 0' not in proc.stdout


def test_report_recounts_the_verdict_from_the_rows_not_a_stored_summary(tmp_path):
    """A summary edited to say exit 0 and qualified over failed rows made --report write
    "PASS: every row passed" above its own failure table: the report recounts the rows."""
    out = failing_record(tmp_path)
    record = json.loads(out.read_text())
    record["summary"].update(exit_code=0)
    record["summary"]["models"]["echo"].update(passed=2, qualified=True)
    out.write_text(json.dumps(record))
    markdown, junit = tmp_path / "run.md", tmp_path / "run.xml"
    proc = cli(["--report", out, "--markdown", markdown, "--junit", junit], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = markdown.read_text()
    assert "**FAIL: at least one check failed** (exit 1)" in text and "PASS" not in text
    assert "| echo | 1/2 = 0.50 \\[0.09, 0.91\\] | 0 | no |" in text
    assert "<failure" in junit.read_text()


@pytest.mark.parametrize("command", ["resume", "merge"])
def test_resume_regrades_kept_rows_and_refuses_a_stored_pass_the_checks_now_fail(tmp_path, command):
    """--resume and --merge kept a finished row's stored verdict without grading it: a row
    edited to passed: true with no reasons (or graded by older, weaker code) over an answer
    that fails its checks was counted a pass, and they printed exit_code 0 and exited 0."""
    out = failing_record(tmp_path)
    record = json.loads(out.read_text())
    row = next(row for row in record["runs"] if row["case_id"] == "bad")
    row.update(passed=True, reasons=[], details={})
    row.pop("verdicts")  # kept, they would no longer agree with its reasons (refused as well)
    record["summary"]["complete"] = False
    out.write_text(json.dumps(record))
    merged = tmp_path / "all.json"
    proc = cli(["--resume", out] if command == "resume" else ["--merge", merged, out], tmp_path)
    assert proc.returncode == 2
    where = "--resume: " if command == "resume" else f"--merge: {out}: "
    assert (f"{where}echo / bad / repeat 0 is stored as PASS but its stored response now grades FAIL "
            "(missing_required_text)") in one_line(proc.stderr)
    assert '"exit_code": 0' not in proc.stdout
    assert json.loads(out.read_text()) == record and not merged.exists()  # refused before a file is touched
