"""Checks that mean what they say (issue 13) and one descriptor per check (issue 10 item 2).

Offline: checks run on hand-built traces; the CLI runs in-process or as one subprocess per
table. Every crafted answer of issue 13 is a row of a table below, with the reasons it must
(and must not) give.
"""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

import regression

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
README = (HERE / "README.md").read_text(encoding="utf-8")
AGENT_TOOLS = json.loads((HERE / "suites" / "agent-tools.json").read_text(encoding="utf-8"))
SECRET_ENV = ("PERPLEXITY_", "OPENAI_", "REGRESSION_")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(SECRET_ENV):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def trace(text="", calls=(), rounds=None, urls=(), status="completed"):
    tool_calls = [{"name": name, "arguments": arguments} for name, arguments in calls]
    return {"final_text": text, "tool_calls": tool_calls,
            "tool_rounds": len(tool_calls) if rounds is None else rounds,
            "search_urls": list(urls), "status": status, "cost_usd": "0"}


def run_main(argv, capsys):
    try:
        code = regression.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def offline_env():
    return {name: value for name, value in os.environ.items() if not name.startswith(SECRET_ENV)}


def run_script(args, cwd, timeout=60):
    return subprocess.run([sys.executable, "-W", "error", str(SCRIPT), *args], cwd=cwd, env=offline_env(),
                          capture_output=True, text=True, timeout=timeout)


def write_suite(directory, data, name="suite.json"):
    path = directory / name
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


@contextlib.contextmanager
def registered(name, run, **spec):
    """A check registered for the duration of a test; every derived table restored after."""
    saved = (list(regression.CHECK_TABLE), dict(regression.CHECKS), dict(regression.BEHAVIORS),
             set(regression.CASE_KEYS), dict(regression.CASE_KEY_RULES))
    try:
        regression.register_check(name, run, **spec)
        yield
    finally:
        regression.CHECK_TABLE[:] = saved[0]
        for table, old in zip((regression.CHECKS, regression.BEHAVIORS, regression.CASE_KEYS,
                               regression.CASE_KEY_RULES), saved[1:]):
            table.clear()
            table.update(old)


# ====================================================================== one descriptor per check (issue 10.2)

def readme_reason_rows():
    """(reason, meaning, what to do) of each row of the README's reason table."""
    section = README.split("## Failure reasons and what to do", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = re.fullmatch(r"\| `([^`]+)` \| (.*) \| (.*) \|", line)
        if match:
            rows.append(match.groups())
    return rows


def test_readme_reason_table_is_the_check_table():
    # The README lists exactly the descriptors' reasons, in check order, word for word,
    # and then execution_error (which no check gives: the runner does).
    rows = readme_reason_rows()
    assert rows[:-1] == regression.reason_table()
    assert rows[-1][0] == "execution_error"


def test_derived_views_follow_the_descriptors():
    table = regression.CHECK_TABLE
    assert list(regression.CHECKS) == [check.name for check in table]
    assert all(regression.CHECKS[check.name] is check.run for check in table)
    assert regression.BEHAVIORS == {check.name: check.arg for check in table if check.behavior}
    assert regression.CASE_KEYS == (regression.CORE_CASE_KEYS | {key for check in table for key in check.keys}
                                    | set(regression.CASE_KEY_RULES))
    assert [check.name for check in table][:4] == ["completed", "search_observed", "expect", "cite"]  # SPEC A4


def test_every_case_key_switches_on_the_check_named_for_it():
    # Check names and the keys that switch them on line up: a case holding one check key
    # lists that check (and only checks that read the key) in --dry-run.
    for check in regression.CHECK_TABLE:
        for key in check.keys:
            readers = [other.name for other in regression.CHECK_TABLE if key in other.keys]
            assert check.name in regression._checks_of({"id": "x", key: "v"}), key
            assert regression._checks_of({"id": "x", key: "v"}) == readers
        if check.behavior:
            entry = check.name + (":NAME" if check.arg else "")
            assert regression._checks_of({"id": "x", "behaviors": [entry]}) == [entry]


def test_every_check_has_a_one_line_doc_and_declares_its_reasons():
    for check in regression.CHECK_TABLE:
        assert check.doc and "\n" not in check.doc, check.name
        assert check.reasons, check.name
        assert check.always or check.behavior or check.keys, check.name


def test_registering_a_check_is_one_call_and_reaches_every_view(tmp_path, capsys):
    def check_shouts(case, trace_):
        """`shout_word`: the answer says the word in capitals."""
        word = case.get("shout_word")
        if word and word.upper() not in (trace_["final_text"] or ""):
            return [regression.Fail("not_shouted", f"no {word.upper()}", word=word)]
        return []

    def validate(case, where, context):
        if not isinstance(case["shout_word"], str):
            raise regression.SuiteError(f"{where}: shout_word must be a string")

    with registered("shout", check_shouts, keys=("shout_word",), validate=validate,
                    reasons={"not_shouted": ("the word was not shouted", "shout")}):
        assert "shout_word" in regression.CASE_KEYS and regression.CHECKS["shout"] is check_shouts
        case = regression.compile_case({"name": "s", "instructions": ""}, {"id": "a", "input": "q",
                                                                          "shout_word": "hey"})
        assert regression.grade(case, trace("hey")) == ["not_shouted"]
        assert regression.explain(case, trace("hey"))["evidence"]["not_shouted"] == {"note": "no HEY", "word": "hey"}
        assert regression._checks_of(case) == ["shout"]
        assert "shout" in regression.catalogue() and "not_shouted" in regression.catalogue()
        assert ("not_shouted", "the word was not shouted", "shout") in regression.reason_table()
        bad = {"name": "s", "instructions": "", "cases": [{"id": "a", "input": "q", "shout_word": 3}]}
        with pytest.raises(regression.SuiteError, match="'a': shout_word must be a string"):
            regression.validate_suite(bad)
        with pytest.raises(ValueError):
            regression.register_check("shout", check_shouts)
    assert "shout" not in regression.CHECKS and "shout_word" not in regression.CASE_KEYS


def test_registering_a_behaviour_with_tool_names_validates_them():
    def check_require(case, trace_):
        """behavior needs_tools:A,B: each named tool was called."""
        return []

    with registered("needs_tools", check_require, behavior=True, arg="tools",
                    reasons={"tool_missing": ("a tool was not called", "")}):
        good = dict(AGENT_TOOLS, cases=[{"id": "a", "input": "q", "behaviors": ["needs_tools:lookup_order,cancel_order"]}])
        regression.validate_suite(good)
        for entry, fragment in [("needs_tools:lookup_order,nope", "names no function tool"),
                                ("needs_tools", "needs tool names"), ("needs_tools:a,,b", "needs tool names")]:
            bad = dict(AGENT_TOOLS, cases=[{"id": "a", "input": "q", "behaviors": [entry]}])
            with pytest.raises(regression.SuiteError, match=fragment):
                regression.validate_suite(bad)


def test_register_case_key_adds_a_validated_key_that_runs_no_check():
    saved = (set(regression.CASE_KEYS), dict(regression.CASE_KEY_RULES))

    def validate(case, where, context):
        if not isinstance(case["budget"], int):
            raise regression.SuiteError(f"{where}: budget must be a whole number")
    try:
        regression.register_case_key("budget", validate)
        regression.validate_suite({"name": "s", "instructions": "", "cases": [{"id": "a", "input": "q", "budget": 2}]})
        with pytest.raises(regression.SuiteError, match="budget must be a whole number"):
            regression.validate_suite({"name": "s", "instructions": "",
                                       "cases": [{"id": "a", "input": "q", "budget": "2"}]})
    finally:
        regression.CASE_KEYS.clear()
        regression.CASE_KEYS.update(saved[0])
        regression.CASE_KEY_RULES.clear()
        regression.CASE_KEY_RULES.update(saved[1])


def test_list_checks_shows_switches_reasons_and_the_normal_form(capsys):
    code, out, err = run_main(["--list-checks"], capsys)
    assert code == 0 and err == ""
    for check in regression.CHECK_TABLE:
        assert check.doc in out
        for reason in check.reasons:
            assert reason in out
    assert "NFKC" in out and "zero-width" in out
