"""Issue 16: suites written for the two earlier designs run unmodified.

- prompt-regression suites (one JSON file, `prompt` / `system` / `expected` per case),
- golden-behaviour case folders (one JSON file per case, SYSTEM.txt pinned by `system_sha256`),
- and the golden harness's model-swap view, `compare_runs.py --matrix`.

The published examples live under suites/ (promptreg-support.json, golden-support/); every
run goes through the real CLI with the echo provider or a loopback chat endpoint."""

import hashlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compare_runs
import fakes
import regression
from testkit import model_echo  # noqa: F401 (a fixture: a model's evidence, which baselines need)

HERE = pathlib.Path(__file__).resolve().parent
PROMPTREG = HERE / "suites" / "promptreg-support.json"
GOLDENS = HERE / "suites" / "golden-support"
SYSTEM_TEXT = (GOLDENS / "SYSTEM.txt").read_text(encoding="utf-8")
SYSTEM_SHA = hashlib.sha256((GOLDENS / "SYSTEM.txt").read_bytes()).hexdigest()
ENV_NAMES = ("PERPLEXITY_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL") + tuple(
    variable for _, variable, _ in regression.ENV_TWINS) + ("PROMPTREG_BASE_URL",)


def clean_env(**extra):
    env = {key: value for key, value in os.environ.items() if key not in ENV_NAMES}
    env.update(extra)
    return env


def cli(args, env=None, cwd=None, script="regression.py"):
    return subprocess.run([sys.executable, str(HERE / script), *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=cwd or HERE, env=env or clean_env())


def one_error_line(result, code=2, prog="regression.py"):
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), result.stderr
    return lines[0]


def read(path):
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))


def rows_by_case(record):
    return {row["case_id"]: row for row in record["runs"]}


def copy_goldens(tmp_path):
    folder = tmp_path / "goldens"
    shutil.copytree(GOLDENS, folder)
    return folder


def system_of(body):
    return next((m["content"] for m in body.get("messages", []) if m.get("role") == "system"), None)


def user_of(body):
    return [m["content"] for m in body.get("messages", []) if m.get("role") == "user"][-1]


# ====================================================================== prompt-regression suites

def test_promptreg_example_runs_unmodified_with_echo_and_reads_out_failing_rules(tmp_path):
    out = tmp_path / "run.json"
    result = cli(["--suite", PROMPTREG, "--provider", "echo", "--out", out])
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    rows = rows_by_case(read(out))
    assert list(rows) == ["refund-policy", "card-number-not-echoed", "password-reset"]
    assert rows["refund-policy"]["reasons"] == ["missing_required_text", "below_min_similarity"]
    assert rows["card-number-not-echoed"]["reasons"] == ["forbidden_text_present"]
    assert rows["password-reset"]["passed"] is True
    lines = result.stdout.splitlines()
    card = next(n for n, line in enumerate(lines) if line.split()[:4] == ["echo", "card-number-not-echoed", "r0", "FAIL"])
    assert "contains forbidden text: '4'" in lines[card + 1] and "score" in lines[card + 1]
    refund = next(n for n, line in enumerate(lines) if line.split()[:4] == ["echo", "refund-policy", "r0", "FAIL"])
    score = rows["refund-policy"]["details"]["similarity"]
    assert lines[refund + 1] == (f"    score {score:.2f}: missing required text: '30 days'; "
                                 f"similarity {score:.2f} below min_similarity 0.8")
    # the unified diff expected -> actual, under the row line
    assert lines[refund + 2:refund + 7] == [
        "    --- expected", "    +++ actual", "    @@ -1 +1 @@",
        "    -Annual plans can be refunded within 30 days of purchase.",
        "    +What is the refund window for annual plans?"]
    password = next(n for n, line in enumerate(lines) if line.split()[:4] == ["echo", "password-reset", "r0", "PASS"])
    assert lines[password + 1].startswith("{")  # a passing row has no detail lines


def _row_for(case, answer):
    """A graded row of `case` on `answer`, as run_row() stores it."""
    compiled = regression.compile_case({"instructions": "", "tools": []}, case)
    trace = regression.Trace(final_text=answer, tool_calls=[], tool_rounds=0, search_urls=[],
                             status="completed", cost_usd=None)
    graded = regression.grading(compiled, trace)
    return {"error": None, "passed": not graded.reasons, "reasons": graded.reasons,
            "details": graded.details}


FAILURE_LINES = [  # (case, answer, the detail lines under the row line)
    ({"excludes": ["4"]}, "card 4111", ["    score n/a: contains forbidden text: '4'"]),
    ({"contains": ["30 days", "refund"]}, "a refund", ["    score n/a: missing required text: '30 days'"]),
    ({"min_chars": 20}, "short", ["    score n/a: 5 chars, fewer than min_chars 20"]),
    ({"max_chars": 3}, "longer", ["    score n/a: 6 chars, more than max_chars 3"]),
    ({"expected_text": "alpha", "min_similarity": 0.9}, "omega",
     ["    score 0.20: similarity 0.20 below min_similarity 0.9", "    --- expected", "    +++ actual",
      "    @@ -1 +1 @@", "    -alpha", "    +omega"]),
    ({"expected_text": "alpha beta", "contains": ["beta"]}, "alpha",
     ["    score 0.67: missing required text: 'beta'"]),  # the score is shown even without a threshold
    ({"contains": ["x"]}, "x", []),  # a pass: nothing under the row line
    ({"behaviors": ["json_object"]}, "not json", []),  # no text rule failed: the row line says it all
]


@pytest.mark.parametrize("rules, answer, lines", FAILURE_LINES)
def test_failure_lines_read_out_each_failed_text_rule(rules, answer, lines):
    case = {"id": "c", "input": "q", **rules}
    assert regression.failure_lines(case, _row_for(case, answer)) == lines


def test_failure_lines_and_matrix_never_print_a_control_sequence():
    case = {"id": "c", "input": "q", "expected_text": "ok", "min_similarity": 0.9, "excludes": ["\x1b[2J"]}
    lines = regression.failure_lines(case, _row_for(case, "\x1b[2J\u202ebad"))
    assert lines and not any("\x1b" in line or "\u202e" in line for line in lines)
    assert any("\\x1b" in line for line in lines)  # shown as an escape, not sent to the terminal
    row = {"model": "m", "case_id": "c\x1b[31m", "repeat": 0, "reasons": ["x\x1b"], "passed": False}
    text, code = compare_runs.render_matrix("t", [(None, compare_runs.behaviour_matrix(
        [{"id": "c\x1b[31m"}], {"c\x1b[31m": [row]}, {"c\x1b[31m": [row]}))])
    assert "\x1b" not in text and code == 0


def test_failure_lines_never_for_an_execution_error():
    row = {"error": "TimeoutError", "passed": False, "reasons": ["execution_error"], "details": None}
    assert regression.failure_lines({"id": "c", "excludes": ["x"]}, row) == []


def test_promptreg_config_pins_each_case_prompt(tmp_path):
    out = tmp_path / "run.json"
    cli(["--suite", PROMPTREG, "--provider", "echo", "--out", out])
    config = read(out)["config"]
    suite = read(PROMPTREG)
    for theirs, ours in zip(suite["cases"], config["cases"]):
        assert ours["id"] == theirs["id"] and ours["input"] == theirs["prompt"]
        assert ours["instructions_sha256"] == hashlib.sha256(theirs["system"].encode()).hexdigest()
        assert ours.get("expected_text") == theirs.get("expected")
        assert "prompt" not in ours and "system" not in ours and "instructions" not in ours
    assert config["instructions"] == {case["id"]: case["system"] for case in suite["cases"]}


def test_promptreg_dry_run_is_their_check(tmp_path):
    result = cli(["--suite", PROMPTREG, "--dry-run", "--provider", "echo"])
    assert result.returncode == 0, result.stderr
    assert "instructions sha256: per case (2 distinct)" in result.stdout
    assert "plan: 3 cases x 1 model x 1 repeat = 3 requests" in result.stdout


def test_promptreg_each_case_sends_its_own_system_prompt(tmp_path):
    suite = read(PROMPTREG)
    answers = {"What is the refund window for annual plans?":
               "Annual plans can be refunded within 30 days of purchase.",
               suite["cases"][1]["prompt"]: "I have asked billing to refund the duplicate charge.",
               "How do I reset my password?": "Use the reset link on the sign-in page to set a new one."}
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response(answers[user_of(body)]))) as server:
        out = tmp_path / "run.json"
        result = cli(["--suite", PROMPTREG, "--provider", "openai", "--base-url", f"{server.url}/v1",
                      "--models", "m", "--out", out])
        sent = {user_of(request.json): system_of(request.json) for request in server.requests}
    assert result.returncode == 0, result.stdout + result.stderr
    assert sent == {case["prompt"]: case["system"] for case in suite["cases"]}
    assert read(out)["summary"]["exit_code"] == 0


def test_system_leak_check_reads_the_case_own_system_prompt():
    """no_system_leak compares the answer with the case's own instructions, not the suite's."""
    case = {"id": "a", "input": "hi", "instructions": "alpha beta gamma delta epsilon zeta eta theta iota",
            "behaviors": ["no_system_leak"]}
    compiled = regression.compile_case({"instructions": "", "tools": []}, case)
    trace = regression.Trace(final_text="Sure: alpha beta gamma delta epsilon zeta eta theta.",
                             tool_calls=[], tool_rounds=0, search_urls=[], status="completed",
                             cost_usd=None)
    assert regression.grade(compiled, trace) == ["system_leak"]
    assert regression.OpenAIProvider("http://127.0.0.1:1/v1").body("m", {"instructions": "", "tools": []},
                                                                   case)["messages"][0] == {
        "role": "system", "content": case["instructions"]}
    assert regression.PerplexityProvider().body("m", {"instructions": "x"}, case)["instructions"] == \
        case["instructions"]


def _promptreg(*cases, **top):
    return {"name": "their-suite", "cases": list(cases), **top}


PROMPTREG_BAD = {  # name -> (suite, a fragment of the one error line)
    "duplicate-id": (_promptreg({"id": "a", "prompt": "hi"}, {"id": "a", "prompt": "ho"}),
                     "case 'a': duplicate id"),
    "min-similarity-not-a-number": (_promptreg({"id": "a", "prompt": "hi", "expected": "x", "min_similarity": "0.8"}),
                                    "case 'a': min_similarity must be a number from 0 to 1 (got '0.8')"),
    "min-similarity-above-1": (_promptreg({"id": "a", "prompt": "hi", "expected": "x", "min_similarity": 1.5}),
                               "min_similarity must be a number from 0 to 1"),
    "min-similarity-without-baseline": (_promptreg({"id": "a", "prompt": "hi", "min_similarity": 0.8}),
                                        "case 'a': min_similarity needs an expected baseline"),
    "empty-expected-without-update": (_promptreg({"id": "a", "prompt": "hi", "expected": "", "min_similarity": 0.8}),
                                      "case 'a': expected is empty; fill it with --update-baseline"),
    "max-chars-not-a-number": (_promptreg({"id": "a", "prompt": "hi", "max_chars": "240"}),
                               "case 'a': max_chars must be a whole number"),
    "min-chars-negative": (_promptreg({"id": "a", "prompt": "hi", "min_chars": -1}),
                           "case 'a': min_chars must be a whole number"),
    "min-above-max": (_promptreg({"id": "a", "prompt": "hi", "min_chars": 9, "max_chars": 3}),
                      "min_chars is larger than max_chars"),
    "unknown-key-typo": (_promptreg({"id": "a", "prompt": "hi", "expeted": "x"}),
                         "case 'a': unknown key 'expeted' (did you mean 'expected'?)"),
    "prompt-missing": (_promptreg({"id": "a", "system": "Be brief."}), "case 'a': prompt must be a non-empty string"),
    "prompt-not-text": (_promptreg({"id": "a", "prompt": ["hi"]}), "case 'a': prompt must be a non-empty string"),
    "system-not-text": (_promptreg({"id": "a", "prompt": "hi", "system": 3}), "case 'a': system must be a string"),
    "expected-not-text": (_promptreg({"id": "a", "prompt": "hi", "expected": 3}), "case 'a': expected must be a string"),
    "contains-not-a-list": (_promptreg({"id": "a", "prompt": "hi", "contains": "x"}),
                            "case 'a': contains must be a list of non-empty strings"),
    "id-missing": (_promptreg({"prompt": "hi"}), "case #1: id must be a non-empty string"),
    "no-name": ({"cases": [{"id": "a", "prompt": "hi"}]}, "suite: name must be a non-empty string"),
    "unknown-top-key": (_promptreg({"id": "a", "prompt": "hi"}, model="gpt"), "suite: unknown key 'model'"),
}

# One interpreter runs the whole table through the real CLI entry point (cli(): SystemExit codes).
LOOP = """
import contextlib, io, json, sys
import regression
results = {}
for name, path in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    sys.argv = ["regression.py", "--suite", path, "--dry-run", "--provider", "echo"]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            regression.cli()
        except SystemExit as exc:
            results[name] = [exc.code, err.getvalue()]
print(json.dumps(results))
"""


def run_table(tmp_path, table, write):
    paths = {name: str(write(tmp_path / name, value)) for name, value in table.items()}
    result = subprocess.run([sys.executable, "-c", LOOP, json.dumps(paths)], capture_output=True, text=True,
                            timeout=60, cwd=HERE, env=clean_env())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def write_json(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def test_promptreg_bad_suites_exit_2_with_their_rules_in_one_line(tmp_path):
    results = run_table(tmp_path, {name: suite for name, (suite, _) in PROMPTREG_BAD.items()}, write_json)
    for name, (_, fragment) in PROMPTREG_BAD.items():
        code, err = results[name]
        lines = err.rstrip("\n").split("\n")
        assert code == 2 and len(lines) == 1 and lines[0].startswith("regression.py: error: "), (name, err)
        assert fragment in lines[0], (name, lines[0])


def test_promptreg_duplicate_id_through_the_real_cli(tmp_path):
    path = write_json(tmp_path / "s.json", PROMPTREG_BAD["duplicate-id"][0])
    line = one_error_line(cli(["--suite", path, "--provider", "echo", "--out", tmp_path / "r.json"]))
    assert line == f"regression.py: error: {path}: case 'a': duplicate id"
    assert not (tmp_path / "r.json").exists()


PROMPTREG_VALUES = {
    "id": st.one_of(st.text(max_size=4), st.integers(), st.none()),
    "prompt": st.one_of(st.text(max_size=8), st.integers(), st.lists(st.text(max_size=3), max_size=2)),
    "system": st.one_of(st.text(max_size=8), st.none(), st.integers()),
    "expected": st.one_of(st.text(max_size=8), st.none()),
    "contains": st.one_of(st.lists(st.text(max_size=3), max_size=2), st.text(max_size=3)),
    "excludes": st.one_of(st.lists(st.text(max_size=3), max_size=2), st.text(max_size=3)),
    "min_similarity": st.one_of(st.floats(allow_nan=True), st.integers(-1, 2), st.text(max_size=3)),
    "min_chars": st.one_of(st.integers(-3, 50), st.text(max_size=3), st.floats()),
    "max_chars": st.one_of(st.integers(-3, 50), st.text(max_size=3), st.booleans()),
    "promt": st.text(max_size=3),
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({"prompt": st.text(min_size=1, max_size=8) | PROMPTREG_VALUES["prompt"]},
                                      optional={k: v for k, v in PROMPTREG_VALUES.items() if k != "prompt"}),
                min_size=1, max_size=3))
def test_any_promptreg_suite_is_valid_or_one_line_exit_2(capsys, cases):
    """Whatever the cases hold, a prompt-regression suite validates or is one line and exit 2."""
    data = {"name": "s", "cases": cases}
    try:
        suite = regression.validate_suite(data)
    except regression.SuiteError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert [case["input"] for case in suite["cases"]] == [case["prompt"] for case in cases]
    for theirs, ours in zip(cases, suite["cases"]):
        assert ours["instructions"] == theirs.get("system", "")
        assert ours["instructions_sha256"] == regression.instructions_sha256(theirs.get("system", ""))


def test_update_baseline_fills_their_empty_expected(tmp_path, model_echo):
    text = PROMPTREG.read_text(encoding="utf-8").replace(
        '"prompt": "How do I reset my password?",', '"prompt": "How do I reset my password?",\n'
        '      "expected": "",\n      "min_similarity": 0.9,')
    data = json.loads(text)
    suite = tmp_path / "suite.json"
    suite.write_text(text, encoding="utf-8")
    os.chmod(suite, 0o640)
    first = cli(["--suite", suite, *model_echo, "--update-baseline", "--out", tmp_path / "a.json"])
    assert first.returncode == 1, first.stderr
    assert "baselines filled: password-reset" in first.stdout
    filled = read(suite)
    assert filled["cases"][2]["expected"] == "How do I reset my password?"  # the echo answer
    assert filled["cases"][0] == data["cases"][0]  # a baseline holding text is never replaced
    assert "expected_text" not in json.dumps(filled)  # their key names stay theirs
    assert suite.read_text(encoding="utf-8") == text.replace(  # only the baseline string changed
        '"expected": "",', '"expected": "How do I reset my password?",')
    assert stat.S_IMODE(os.stat(suite).st_mode) == 0o640
    again = cli(["--suite", suite, "--provider", "echo", "--out", tmp_path / "b.json"])
    assert rows_by_case(read(tmp_path / "b.json"))["password-reset"]["passed"] is True, again.stdout


def test_promptreg_resume_rebuilds_per_case_prompts_from_the_record(tmp_path):
    """An interrupted run of a suite with a prompt per case resumes from its record alone."""
    suite = read(PROMPTREG)
    state = {"fail": True}

    def answer(body):
        return fakes.chat_response("Use the reset link to reset it; 30 days.")

    def reply(request):
        if state["fail"] and user_of(request.json or {}) == suite["cases"][1]["prompt"]:
            return fakes.Reply(500, {"error": {"message": "down"}})
        return fakes.chat(answer)(request)

    out = tmp_path / "run.json"
    with fakes.FakeServer(reply) as server:
        args = ["--provider", "openai", "--base-url", f"{server.url}/v1"]
        first = cli(["--suite", PROMPTREG, *args, "--models", "m", "--out", out])
        assert first.returncode == 2, first.stderr
        state["fail"] = False
        resumed = cli(["--resume", out, *args])
        systems = [system_of(request.json) for request in server.requests]
    assert resumed.returncode == 1, resumed.stderr  # the canned answer misses the refund baseline
    record = read(out)
    assert record["summary"]["complete"] is True
    assert [row["case_id"] for row in record["runs"]] == [case["id"] for case in suite["cases"]]
    assert systems[-2:] == [suite["cases"][1]["system"], suite["cases"][2]["system"]]


# ---------------------------------------------------------------------- their environment variables

def test_promptreg_variables_select_a_compatible_endpoint(tmp_path):
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("Use the reset link."))) as server:
        env = clean_env(PROMPTREG_PROVIDER="compatible", PROMPTREG_MODEL="their-model",
                        PROMPTREG_BASE_URL=f"{server.url}/v1")
        result = cli(["--suite", PROMPTREG, "--out", tmp_path / "run.json"], env=env)
        models = {request.json["model"] for request in server.requests}
    assert result.returncode == 1, result.stderr  # the canned answer fails two cases' rules
    record = read(tmp_path / "run.json")
    assert record["provider"] == {"name": "openai", "base_url": f"{server.url}/v1"}
    assert record["config"]["models"] == ["their-model"] and models == {"their-model"}


ECHO = {"PROMPTREG_PROVIDER": "echo"}
URL_A, URL_B, URL_C = "http://127.0.0.1:9/a", "http://127.0.0.1:9/b", "http://127.0.0.1:9/c"
THEIRS_OPENAI = {"PROMPTREG_PROVIDER": "openai", "PROMPTREG_MODEL": "m", "PROMPTREG_BASE_URL": URL_B}


@pytest.mark.parametrize("env, flags, expected", [
    (ECHO, [], ("echo", ("echo",), None)),
    ({**THEIRS_OPENAI, "PROMPTREG_PROVIDER": "compatible"}, [], ("openai", ("m",), URL_B)),
    ({"PROMPTREG_PROVIDER": "openai", "REGRESSION_PROVIDER": "echo"}, [], ("echo", ("echo",), None)),
    ({"PROMPTREG_PROVIDER": "openai"}, ["--provider", "echo"], ("echo", ("echo",), None)),
    ({**ECHO, "PROMPTREG_MODEL": "theirs"}, [], ("echo", ("theirs",), None)),
    ({**ECHO, "PROMPTREG_MODEL": "theirs", "REGRESSION_MODELS": "ours"}, [], ("echo", ("ours",), None)),
    ({**ECHO, "PROMPTREG_MODEL": "theirs"}, ["--models", "flag"], ("echo", ("flag",), None)),
    (THEIRS_OPENAI, [], ("openai", ("m",), URL_B)),
    ({**THEIRS_OPENAI, "OPENAI_BASE_URL": URL_A}, [], ("openai", ("m",), URL_A)),
    ({**THEIRS_OPENAI, "OPENAI_BASE_URL": URL_A}, ["--base-url", URL_C], ("openai", ("m",), URL_C)),
    ({**THEIRS_OPENAI, "REGRESSION_PROVIDER": "echo", "REGRESSION_MODELS": "ours"}, [], ("echo", ("ours",), None)),
])
def test_our_variables_and_flags_win_over_theirs(env, flags, expected):
    _, settings_ = regression.parse_args(flags, env=env)
    assert (settings_.provider, tuple(settings_.models), settings_.base_url) == expected


def test_our_base_url_wins_over_theirs(tmp_path):
    hits = {}

    def counting(name):
        def reply(request):
            hits[name] = hits.get(name, 0) + 1
            return fakes.chat(lambda body: fakes.chat_response("Use the reset link."))(request)
        return reply

    with fakes.FakeServer(counting("ours")) as ours, fakes.FakeServer(counting("theirs")) as theirs:
        env = clean_env(PROMPTREG_PROVIDER="openai", PROMPTREG_MODEL="m", OPENAI_BASE_URL=f"{ours.url}/v1",
                        PROMPTREG_BASE_URL=f"{theirs.url}/v1")
        result = cli(["--suite", PROMPTREG, "--out", tmp_path / "run.json"], env=env)
    assert result.returncode == 1, result.stderr
    assert hits == {"ours": 3}


def test_an_unknown_promptreg_provider_is_one_line_exit_2():
    line = one_error_line(cli(["--suite", PROMPTREG, "--dry-run"], env=clean_env(PROMPTREG_PROVIDER="cohere")))
    assert "unknown provider 'cohere'" in line


# ====================================================================== golden case folders

def golden_reply(tool_happy=False):
    """A chat endpoint answering the two goldens: asks for the order id, states the cutoff;
    with tool_happy, it cancels a guessed order instead."""
    def answer(body):
        if "cancel" in user_of(body):
            if tool_happy:
                return fakes.chat_response(None, tool_calls=[("cancel_order", {"order_id": "A1001"})])
            return fakes.chat_response("I can cancel it for you: what is your order id?")
        return fakes.chat_response("Orders placed after 2 pm ship the next working day.")
    return fakes.chat(answer)


def golden_run(folder, server, out, *extra, models=("m",)):
    return cli(["--suite", folder, "--provider", "openai", "--base-url", f"{server.url}/v1",
                "--models", *models, "--out", out, *extra])


def test_golden_examples_run_unmodified_against_a_loopback_chat_endpoint(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(golden_reply()) as server:
        result = golden_run(GOLDENS, server, out)
        bodies = [request.json for request in server.requests]
    assert result.returncode == 0, result.stdout + result.stderr
    record = read(out)
    assert [row["case_id"] for row in record["runs"]] == ["cancel_without_order_id", "shipping_cutoff_faq"]
    tools = [{"type": "function", "function": {"name": "lookup_order"}},
             {"type": "function", "function": {"name": "cancel_order"}}]
    for body, name in zip(bodies, ["cancel_without_order_id", "shipping_cutoff_faq"]):
        case = read(GOLDENS / f"{name}.json")
        assert system_of(body) == SYSTEM_TEXT and user_of(body) == case["user"]
        # function tools without parameters, each case its own: an empty object schema on the wire
        # (a strict server refuses a function without one), the config keeps them as written
        assert body["tools"] == [{"type": "function", "function": {"name": tool, "parameters": {
            "type": "object", "properties": {}}}} for tool in case["tools"]]
    config = record["config"]
    assert config["instructions"] == SYSTEM_TEXT and config["tools"] == tools
    assert [case["tools"] for case in config["cases"]] == [["lookup_order", "cancel_order"], ["lookup_order"]]
    assert all(case["instructions_sha256"] == SYSTEM_SHA for case in config["cases"])
    assert config["cases"][0]["behaviors"] == read(GOLDENS / "cancel_without_order_id.json")["behaviors"]
    assert record["suite"] == {"name": "golden-support", "builtin": False, "file": str(GOLDENS)}


def test_golden_behaviours_fail_a_model_that_guesses_the_order_id(tmp_path):
    out = tmp_path / "run.json"
    with fakes.FakeServer(golden_reply(tool_happy=True)) as server:
        result = golden_run(GOLDENS, server, out)
    assert result.returncode == 1, result.stderr
    rows = rows_by_case(read(out))
    assert rows["cancel_without_order_id"]["reasons"] == ["forbidden_tool_called", "invented_field",
                                                         "clarification_missing"]
    assert rows["shipping_cutoff_faq"]["passed"] is True


def test_golden_prompt_drift_stops_before_any_request(tmp_path):
    folder = copy_goldens(tmp_path)
    with open(folder / "SYSTEM.txt", "a", encoding="utf-8") as handle:
        handle.write("Always offer a discount.\n")
    drifted = hashlib.sha256((folder / "SYSTEM.txt").read_bytes()).hexdigest()
    out = tmp_path / "run.json"
    with fakes.FakeServer(golden_reply()) as server:
        result = golden_run(folder, server, out)
        assert server.count == 0
    line = one_error_line(result)
    assert "prompt drift" in line and "'cancel_without_order_id'" in line
    assert SYSTEM_SHA in line and drifted in line
    assert not out.exists()


def test_golden_hash_is_the_file_sha256_even_with_crlf_line_ends(tmp_path):
    folder = copy_goldens(tmp_path)
    (folder / "SYSTEM.txt").write_bytes(SYSTEM_TEXT.replace("\n", "\r\n").encode())
    line = one_error_line(cli(["--suite", folder, "--dry-run", "--provider", "echo"]))
    assert hashlib.sha256((folder / "SYSTEM.txt").read_bytes()).hexdigest() in line


def placeholder_in(path):
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(SYSTEM_SHA, regression.GOLDEN_PLACEHOLDER), encoding="utf-8")
    return path.read_text(encoding="utf-8")


def test_golden_placeholder_is_filled_by_update_baseline_keeping_the_file(tmp_path):
    folder = copy_goldens(tmp_path)
    case_file = folder / "shipping_cutoff_faq.json"
    before = placeholder_in(case_file)
    os.chmod(case_file, 0o640)
    other = (folder / "cancel_without_order_id.json").read_bytes()
    with fakes.FakeServer(golden_reply()) as server:
        refused = golden_run(folder, server, tmp_path / "a.json")
        assert server.count == 0
        line = one_error_line(refused)
        assert "'shipping_cutoff_faq'" in line and "--update-baseline" in line and SYSTEM_SHA in line
        filled = golden_run(folder, server, tmp_path / "b.json", "--update-baseline")
        assert filled.returncode == 0, filled.stdout + filled.stderr
        assert f"baselines filled: shipping_cutoff_faq ({folder})" in filled.stdout
        assert case_file.read_text(encoding="utf-8") == before.replace(
            f'"{regression.GOLDEN_PLACEHOLDER}"', f'"{SYSTEM_SHA}"')  # only the placeholder changed
        assert stat.S_IMODE(os.stat(case_file).st_mode) == 0o640
        assert (folder / "cancel_without_order_id.json").read_bytes() == other
        again = golden_run(folder, server, tmp_path / "c.json")
    assert again.returncode == 0, again.stderr
    assert read(tmp_path / "b.json")["config"] == read(tmp_path / "c.json")["config"]


def test_update_baseline_never_repins_a_drifted_case(tmp_path):
    folder = copy_goldens(tmp_path)
    (folder / "SYSTEM.txt").write_text(SYSTEM_TEXT + "New rule.\n", encoding="utf-8")
    kept = {path.name: path.read_bytes() for path in folder.glob("*.json")}
    line = one_error_line(cli(["--suite", folder, "--provider", "echo", "--update-baseline",
                               "--out", tmp_path / "r.json"]))
    assert "prompt drift" in line
    assert {path.name: path.read_bytes() for path in folder.glob("*.json")} == kept


def test_fill_golden_pin_edits_only_the_top_level_pin(tmp_path):
    path = tmp_path / "case.json"
    look_alike = 'say "system_sha256": "compute-from-SYSTEM.txt"'
    text = '{"id": "a",\n  "user": %s,\n  "system_sha256" :  "compute-from-SYSTEM.txt"}' % json.dumps(look_alike)
    path.write_text(text)
    assert regression.fill_golden_pin(str(path), SYSTEM_SHA) is True
    assert path.read_text() == text.replace('"compute-from-SYSTEM.txt"}', f'"{SYSTEM_SHA}"}}')
    assert json.loads(path.read_text())["user"] == look_alike
    assert regression.fill_golden_pin(str(path), "f" * 64) is False  # a pin holding a hash is never touched
    path.write_text(text.replace('"id": "a"', '"id": "a", "system_sha256": "x"'))
    with pytest.raises(regression.SuiteError, match="cannot fill system_sha256"):
        regression.fill_golden_pin(str(path), SYSTEM_SHA)


def test_system_txt_in_the_parent_folder_and_system_flag(tmp_path):
    parent = tmp_path / "goldens"
    cases = parent / "cases"
    cases.mkdir(parents=True)
    shutil.copy(GOLDENS / "SYSTEM.txt", parent / "SYSTEM.txt")
    for path in GOLDENS.glob("*.json"):
        shutil.copy(path, cases / path.name)
    (cases / "README.txt").write_text("not a case")
    result = cli(["--suite", cases, "--dry-run", "--provider", "echo"])
    assert result.returncode == 0, result.stderr
    assert f"instructions sha256: {SYSTEM_SHA}" in result.stdout and "2 cases" in result.stdout
    other = tmp_path / "prompt.txt"
    shutil.copy(GOLDENS / "SYSTEM.txt", other)
    os.remove(parent / "SYSTEM.txt")
    line = one_error_line(cli(["--suite", cases, "--dry-run", "--provider", "echo"]))
    assert "no SYSTEM.txt" in line and "--system FILE" in line
    named = cli(["--suite", cases, "--system", other, "--dry-run", "--provider", "echo"])
    assert named.returncode == 0, named.stderr
    line = one_error_line(cli(["--suite", PROMPTREG, "--system", other, "--dry-run", "--provider", "echo"]))
    assert "--system" in line and "--suite DIR" in line
    line = one_error_line(cli(["--system", other, "--dry-run", "--provider", "echo"]))
    assert line == "regression.py: error: --system FILE goes with --suite DIR, a folder of golden case files"


def golden_folder(root, files, system=SYSTEM_TEXT):
    root.mkdir()
    (root / "SYSTEM.txt").write_text(system, encoding="utf-8")
    for name, value in files.items():
        (root / name).write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return root


def _golden(**fields):
    case = {"id": "g", "user": "Cancel my order.", "system_sha256": SYSTEM_SHA, "tools": ["cancel_order"],
            "behaviors": ["forbid_tool:cancel_order"]}
    case.update(fields)
    return {"g.json": {key: value for key, value in case.items() if value is not None}}


GOLDEN_BAD = {  # name -> (files, fragment of the one error line)
    "empty-folder": ({}, "no *.json case files"),
    "not-json": ({"g.json": "{"}, "g.json: not valid JSON"),
    "not-an-object": ({"g.json": "[]"}, "g.json: a golden case must be a JSON object"),
    "unknown-key": (_golden(behaviours=[]), "case 'g': unknown key 'behaviours' (did you mean 'behaviors'?)"),
    "user-missing": (_golden(user=None), "case 'g': user must be a non-empty string"),
    "tools-not-a-list": (_golden(tools="cancel_order"), "case 'g': tools must be a list of non-empty strings"),
    "tool-name-with-space": (_golden(tools=["cancel order"]), "tool name 'cancel order'"),
    "tool-twice": (_golden(tools=["cancel_order", "cancel_order"]), "tools lists a name twice"),
    "pin-missing": (_golden(system_sha256=None), "system_sha256 must be 64 hex digits"),
    "pin-malformed": (_golden(system_sha256="abc"), "system_sha256 must be 64 hex digits"),
    "pin-drifted": (_golden(system_sha256="0" * 64), "prompt drift: case 'g' pins system_sha256 " + "0" * 64),
    "placeholder-without-update": (_golden(system_sha256="compute-from-SYSTEM.txt"),
                                   "system_sha256 is still 'compute-from-SYSTEM.txt'"),
    "unknown-behaviour": (_golden(behaviors=["forbid_tools:cancel_order"]), "unknown behavior 'forbid_tools'"),
    "forbid-undeclared-tool": (_golden(behaviors=["forbid_tool:refund"]), "names no function tool"),
    "duplicate-id": ({**_golden(), "h.json": _golden()["g.json"]}, "case 'g': duplicate id (also in"),
    "duplicate-key": ({"g.json": '{"id": "g", "id": "h"}'}, "duplicate key 'id'"),
    "lone-surrogate": ({"g.json": '{"id": "g", "user": "hi \\ud800"}'}, "holds a lone surrogate escape"),
}


def test_bad_golden_folders_exit_2_with_one_line_naming_the_file(tmp_path):
    results = run_table(tmp_path, {name: files for name, (files, _) in GOLDEN_BAD.items()}, golden_folder)
    for name, (_, fragment) in GOLDEN_BAD.items():
        code, err = results[name]
        lines = err.rstrip("\n").split("\n")
        assert code == 2 and len(lines) == 1 and lines[0].startswith("regression.py: error: "), (name, err)
        assert fragment in lines[0], (name, lines[0])
        if name not in ("empty-folder",):
            assert str(tmp_path / name) in lines[0], (name, lines[0])


def test_golden_resume_rebuilds_the_suite_from_the_record(tmp_path):
    state = {"fail": True}

    def reply(request):
        if state["fail"] and "ship" in user_of(request.json or {}):
            return fakes.Reply(503, {"error": {"message": "busy"}})
        return golden_reply()(request)

    out = tmp_path / "run.json"
    with fakes.FakeServer(reply) as server:
        first = golden_run(GOLDENS, server, out)
        assert first.returncode == 2
        state["fail"] = False
        resumed = cli(["--resume", out, "--provider", "openai", "--base-url", f"{server.url}/v1"])
        assert system_of(server.requests[-1].json) == SYSTEM_TEXT
        sent = server.requests[-1].json["tools"]  # an empty object schema on the wire only
        assert sent == [{"type": "function", "function": {
            "name": "lookup_order", "parameters": {"type": "object", "properties": {}}}}]
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert read(out)["summary"]["complete"] is True


# ====================================================================== the behaviour matrix

def matrix_lines(stdout):
    """The table rows of --matrix output, split into their five columns."""
    return [line.split() for line in stdout.splitlines() if len(line.split()) == 5 and line.split()[4] in
            ("same", "REGRESS", "GAIN", "GAIN*")]


def test_matrix_of_two_golden_runs_shows_every_case_and_behaviour(tmp_path):
    with fakes.FakeServer(golden_reply()) as server:
        assert golden_run(GOLDENS, server, tmp_path / "before.json").returncode == 0
    with fakes.FakeServer(golden_reply(tool_happy=True)) as server:
        assert golden_run(GOLDENS, server, tmp_path / "after.json").returncode == 1
    result = cli(["--matrix", tmp_path / "before.json", tmp_path / "after.json"], script="compare_runs.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "case_id  " in result.stdout and ["case_id", "behavior", "A", "B", "delta"] in [
        line.split() for line in result.stdout.splitlines()]  # after the cautions (two servers)
    assert matrix_lines(result.stdout) == [
        ["cancel_without_order_id", "no_system_leak", "PASS", "PASS", "same"],
        ["cancel_without_order_id", "max_tool_rounds:1", "PASS", "PASS", "same"],
        ["cancel_without_order_id", "require_clarification:order_id", "PASS", "FAIL", "REGRESS"],
        ["cancel_without_order_id", "forbid_tool:cancel_order", "PASS", "FAIL", "REGRESS"],
        ["shipping_cutoff_faq", "no_system_leak", "PASS", "PASS", "same"],
        ["shipping_cutoff_faq", "max_tool_rounds:0", "PASS", "PASS", "same"],
        ["shipping_cutoff_faq", "forbid_tool:lookup_order", "PASS", "PASS", "same"],
    ]
    assert "verdict: 2 REGRESS, 0 GAIN, 5 same -> exit 1" in result.stdout
    back = cli(["--matrix", tmp_path / "after.json", tmp_path / "before.json"], script="compare_runs.py")
    assert back.returncode == 0
    # B made no tool call at all: its GAINs may come only from calling nothing, and are marked
    assert [row[4] for row in matrix_lines(back.stdout)].count("GAIN*") == 2


def test_matrix_with_models_compares_two_models_of_one_run(tmp_path):
    def reply(request):
        return golden_reply(tool_happy=request.json["model"] == "b")(request)

    with fakes.FakeServer(reply) as server:
        run = golden_run(GOLDENS, server, tmp_path / "run.json", models=("a", "b"))
    assert run.returncode == 1
    result = cli(["--matrix", "--models", "a", "b", tmp_path / "run.json"], script="compare_runs.py")
    assert result.returncode == 1, result.stdout
    assert "A = a, B = b" in result.stdout
    deltas = {(row[0], row[1]): row[2:] for row in matrix_lines(result.stdout)}
    assert len(deltas) == 7
    assert deltas[("cancel_without_order_id", "forbid_tool:cancel_order")] == ["PASS", "FAIL", "REGRESS"]
    swapped = cli(["--matrix", "--models", "b", "a", tmp_path / "run.json"], script="compare_runs.py")
    assert swapped.returncode == 0 and "GAIN" in swapped.stdout


def _row(case_id, reasons, model="m", repeat=0):
    return {"model": model, "case_id": case_id, "repeat": repeat, "reasons": reasons, "passed": not reasons}


def test_behaviour_matrix_rates_over_repeats_and_never_hides_an_unexplained_reason():
    cases = [{"id": "c", "input": "x", "behaviors": ["forbid_tool:t"], "contains": ["y"]}]
    side_a = {"c": [_row("c", []), _row("c", [], repeat=1)]}
    side_b = {"c": [_row("c", ["forbidden_tool_called"]), _row("c", ["response_not_completed"], repeat=1)]}
    assert compare_runs.behaviour_matrix(cases, side_a, side_b) == [
        ["c", "forbid_tool:t", "PASS", "1/2", "REGRESS"],
        ["c", "contains", "PASS", "PASS", "same"],
        ["c", "response_not_completed", "PASS", "1/2", "REGRESS"],
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["forbidden_tool_called", "missing_required_text", "too_long", "system_leak",
                                 "response_not_completed", "wrong_code"]), max_size=4),
       st.lists(st.sampled_from(["forbidden_tool_called", "missing_required_text", "too_long", "system_leak",
                                 "response_not_completed", "wrong_code"]), max_size=4))
def test_matrix_a_failing_side_always_shows_a_fail(reasons_a, reasons_b):
    """No reason of either side goes unseen: a side with a reason has a non-PASS cell."""
    cases = [{"id": "c", "input": "x", "behaviors": ["forbid_tool:t", "no_system_leak"], "max_chars": 5,
              "expect": {"code": "1"}}]
    table = compare_runs.behaviour_matrix(cases, {"c": [_row("c", reasons_a)]}, {"c": [_row("c", reasons_b)]})
    for column, reasons in ((2, reasons_a), (3, reasons_b)):
        assert any(row[column] == "FAIL" for row in table) == bool(reasons)
    regress = any(row[4] == "REGRESS" for row in table)
    assert regress == any(row[2] == "PASS" and row[3] == "FAIL" for row in table)


def test_matrix_refuses_incomparable_records_and_report_flags(tmp_path):
    with fakes.FakeServer(golden_reply()) as server:
        golden_run(GOLDENS, server, tmp_path / "goldens.json")
    cli(["--suite", PROMPTREG, "--provider", "echo", "--out", tmp_path / "promptreg.json"])
    result = cli(["--matrix", tmp_path / "goldens.json", tmp_path / "promptreg.json"], script="compare_runs.py")
    assert result.returncode == 2 and result.stdout.startswith("NOT_COMPARABLE: models differs: ")  # names the path
    flags = cli(["--matrix", tmp_path / "goldens.json", tmp_path / "goldens.json", "--html", tmp_path / "m.html"],
                script="compare_runs.py")
    assert flags.returncode == 2 and "--matrix prints its table only" in flags.stderr
    assert not (tmp_path / "m.html").exists()
    missing = cli(["--matrix", "--models", "a", "z", tmp_path / "goldens.json"], script="compare_runs.py")
    assert missing.returncode == 2 and "NOT_COMPARABLE: model 'a' is not in this run" in missing.stdout


GOLDEN_VALUES = {
    "id": st.one_of(st.text(max_size=4), st.integers(), st.none()),
    "user": st.one_of(st.text(max_size=8), st.integers(), st.lists(st.text(max_size=3), max_size=2)),
    "system_sha256": st.one_of(st.just(SYSTEM_SHA), st.just(regression.GOLDEN_PLACEHOLDER), st.text(max_size=5),
                               st.just(SYSTEM_SHA.upper()), st.integers()),
    "tools": st.one_of(st.lists(st.sampled_from(["cancel_order", "lookup_order", "bad name", ""]), max_size=3),
                       st.text(max_size=3)),
    "behaviors": st.one_of(st.lists(st.sampled_from(["no_system_leak", "forbid_tool:cancel_order", "max_tool_rounds:x",
                                                     "require_clarification:order_id", "json_object:1", 3]),
                                    max_size=3), st.text(max_size=3)),
    "notes": st.one_of(st.text(max_size=3), st.integers()),
    "extra": st.integers(),
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({}, optional=GOLDEN_VALUES), min_size=1, max_size=3), st.booleans())
def test_any_golden_folder_loads_or_is_one_line(tmp_path_factory, cases, update):
    """Whatever the case files hold, a golden folder loads as a suite or is one SuiteError line."""
    folder = tmp_path_factory.mktemp("golden")
    (folder / "SYSTEM.txt").write_text(SYSTEM_TEXT, encoding="utf-8")
    for n, case in enumerate(cases):
        (folder / f"{n}.json").write_text(json.dumps(case), encoding="utf-8")
    try:
        suite = regression.load_suite(str(folder), allow_empty_baseline=update)
    except regression.SuiteError as exc:
        assert "\n" not in str(exc) and str(folder) in str(exc)
        return
    assert [case["input"] for case in suite["cases"]] == [case["user"] for case in cases]
    assert all(case["instructions_sha256"] == SYSTEM_SHA for case in suite["cases"])
    placeholders = [case["id"] for case in cases if case["system_sha256"] == regression.GOLDEN_PLACEHOLDER]
    assert update or not placeholders  # a placeholder runs only while --update-baseline fills it
    assert list(suite["placeholders"]) == placeholders


def test_matrix_after_a_system_prompt_edit_and_repin(tmp_path):
    """Edit SYSTEM.txt, repin the goldens, run again: the two runs compare (pins follow the prompt)."""
    folder = copy_goldens(tmp_path)
    with fakes.FakeServer(golden_reply()) as server:
        assert golden_run(folder, server, tmp_path / "before.json").returncode == 0
    (folder / "SYSTEM.txt").write_text(SYSTEM_TEXT + "Offer to cancel any order right away.\n", encoding="utf-8")
    new_sha = hashlib.sha256((folder / "SYSTEM.txt").read_bytes()).hexdigest()
    for path in folder.glob("*.json"):
        path.write_text(path.read_text(encoding="utf-8").replace(SYSTEM_SHA, new_sha), encoding="utf-8")
    with fakes.FakeServer(golden_reply(tool_happy=True)) as server:
        assert golden_run(folder, server, tmp_path / "after.json").returncode == 1
    result = cli(["--matrix", tmp_path / "before.json", tmp_path / "after.json"], script="compare_runs.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ["cancel_without_order_id", "forbid_tool:cancel_order", "PASS", "FAIL", "REGRESS"] in \
        matrix_lines(result.stdout)


def test_promptreg_runs_compare_across_a_system_prompt_edit(tmp_path):
    """Edit one case's system prompt: the two records compare, and the case whose prompt lost its
    rule is a NEW_FAILURE (each case's prompt and pin may differ, as the suite-level ones may)."""
    data = read(PROMPTREG)
    card = data["cases"][1]

    def answer(body):
        if user_of(body) == card["prompt"]:
            safe = "Never repeat a card number" in (system_of(body) or "")
            return fakes.chat_response("I have asked billing to refund the duplicate charge." if safe
                                       else f"Refunding the charge on card {card['prompt'][8:27]}.")
        return fakes.chat_response("Annual plans can be refunded within 30 days of purchase; use the reset link.")

    suite = write_json(tmp_path / "suite.json", data)
    with fakes.FakeServer(fakes.chat(answer)) as server:
        args = ["--suite", suite, "--provider", "openai", "--base-url", f"{server.url}/v1", "--models", "m"]
        assert cli([*args, "--out", tmp_path / "before.json"]).returncode == 0
        card["system"] = "You are a support agent for Acme Cloud. Answer in one sentence."
        write_json(suite, data)
        assert cli([*args, "--out", tmp_path / "after.json"]).returncode == 1
    before, after = read(tmp_path / "before.json"), read(tmp_path / "after.json")
    assert before["config"]["instructions"] != after["config"]["instructions"]  # per case, then shared
    compared = cli([tmp_path / "before.json", tmp_path / "after.json"], script="compare_runs.py")
    assert compared.returncode == 1, compared.stdout
    new = [line for line in compared.stdout.splitlines() if line.startswith("NEW_FAILURE")]
    assert len(new) == 1 and "card-number-not-echoed" in new[0]


@pytest.mark.parametrize("odd", ["dangling-link", "upper-case-name", "folder-named-json"])
def test_a_golden_case_file_that_cannot_run_is_refused_never_left_out(tmp_path, odd):
    # A dangling link, a "*.JSON" file or a folder named "*.json" was skipped without a word:
    # the run passed (exit 0) with that case never sent.
    folder = golden_folder(tmp_path / "goldens", _golden())
    odd_path = folder / ("h.JSON" if odd == "upper-case-name" else "h.json")
    if odd == "dangling-link":
        odd_path.symlink_to(tmp_path / "moved-away.json")
    elif odd == "upper-case-name":
        odd_path.write_text(json.dumps(_golden(id="h")["g.json"]), encoding="utf-8")
    else:
        odd_path.mkdir()
    line = one_error_line(cli(["--suite", folder, "--provider", "echo", "--out", tmp_path / "run.json"]))
    assert f"{odd_path}: not a case file" in line
    assert not (tmp_path / "run.json").exists()


def test_ids_that_read_alike_are_one_id_twice_in_either_format(tmp_path):
    # "refund" and "refund<ZWSP>" ran as two rows under one printed name.
    promptreg = write_json(tmp_path / "promptreg.json", {"name": "t", "cases": [
        {"id": "refund", "prompt": "hi", "system": "Be brief.", "contains": ["hi"]},
        {"id": "refund\u200b", "prompt": "hi", "system": "Be brief.", "contains": ["absent"]}]})
    line = one_error_line(cli(["--suite", promptreg, "--provider", "echo", "--out", tmp_path / "a.json"]))
    assert "case 'refund\\u200b': duplicate id (it reads as the earlier 'refund'" in line
    folder = golden_folder(tmp_path / "goldens",
                           {**_golden(id="caf\u00e9"), "h.json": _golden(id="cafe\u0301")["g.json"]})
    line = one_error_line(cli(["--suite", folder, "--provider", "echo", "--out", tmp_path / "b.json"]))
    assert f"{folder / 'h.json'}: case 'cafe\u0301': duplicate id (it reads as the earlier 'caf\u00e9'" in line
    assert f"(also in {folder / 'g.json'})" in line
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


def test_promptreg_dry_run_warns_in_their_key_names(tmp_path):
    # expected without min_similarity judges nothing; the warning names their key, not ours.
    suite = write_json(tmp_path / "promptreg.json", {"name": "t", "cases": [
        {"id": "soft", "prompt": "hi", "system": "Be brief.", "expected": "A reviewed reply."}]})
    result = cli(["--suite", suite, "--dry-run"])
    assert result.returncode == 0, result.stderr
    assert ("warning: case 'soft' has no rule beyond completion: any answer passes "
            "(expected alone judges nothing)") in result.stdout
    assert "expected_text" not in result.stdout
