"""The check table is the one source of what a check is, and every behaviour entry has its own
verdict (issue 20 items 1 and 5, issue 21 item 7).

In-process: the views derived from the table, grading that runs each active check once, and the
per-entry verdicts on hand-built traces (a property test over which entries each side failed).
Through the real CLI (fakes.run_script): a two-model run whose models break different entries of
one behaviour, read by compare --matrix, plain compare and its report, from a record with
verdicts, from an older one without them, and from a masked older one; and a forged record.
"""

import contextlib
import json

import pytest
from hypothesis import given, settings, strategies as st

import compare_runs
import fakes
import regression
from testkit import clean_env, cli_env, read_record, run_main, write_suite  # noqa: F401 (fixture)


@contextlib.contextmanager
def registered(name, run, **spec):
    """A check registered for one test; every table derived from the check table restored."""
    tables = (regression.CHECKS, regression.BEHAVIORS, regression.CASE_KEYS,
              regression.CASE_KEY_RULES, regression.CHECK_KEYS)
    saved = list(regression.CHECK_TABLE), [table.copy() for table in tables]
    try:
        regression.register_check(name, run, **spec)
        yield
    finally:
        regression.CHECK_TABLE[:] = saved[0]
        for table, old in zip(tables, saved[1]):
            table.clear()
            table.update(old)


def check_shout(case, trace):
    """`shout_word`: the answer says the word in capitals."""
    # No guard for an absent key: the table runs a check only where its key is.
    if case["shout_word"].upper() not in trace.final_text:
        return [regression.Fail("not_shouted", f"no {case['shout_word'].upper()}")]
    return []


SHOUT = dict(keys=("shout_word",), text_only=True,
             rule="the word in capitals, anywhere in the answer",
             details=lambda case, trace, failed: {"shouted": not failed},
             short=lambda case, reasons, details: ["not shouted"] if reasons else [],
             reasons={"not_shouted": ("the word was not shouted", "shout")})


def trace(text="", calls=(), rounds=None):
    tool_calls = [{"name": name, "arguments": arguments} for name, arguments in calls]
    return regression.Trace(final_text=text, tool_calls=tool_calls,
                            tool_rounds=len(tool_calls) if rounds is None else rounds,
                            search_urls=[], status="completed", cost_usd="0")


TOOLS = ["lookup_order", "cancel_order", "refund_order", "t1", "t2", "t3", "t4"]
TOOL_SUITE = {"name": "tools", "instructions": "Help.", "tools": [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in TOOLS]}


def graded_row(case, trace_, model="m"):
    """The row run_row would store for a case answered with trace_ (grading only)."""
    suite = regression.validate_suite({**TOOL_SUITE, "cases": [case]})
    graded = regression.grading(regression.compile_case(suite, suite["cases"][0]), trace_)
    row = {"model": model, "case_id": case["id"], "repeat": 0, "reasons": graded.reasons,
           "passed": not graded.reasons, "error": None}
    return {**row, "verdicts": graded.verdicts} if graded.verdicts else row


# ====================================================================== the table is the one source

def test_a_registered_check_reaches_every_view_the_table_derives():
    case = {"id": "a", "input": "q", "shout_word": "hey"}
    assert "shout_word" not in regression.CHECK_KEYS
    with registered("shout", check_shout, **SHOUT):
        assert "shout_word" in regression.CHECK_KEYS  # a changed word: REGRADE, not NOT_COMPARABLE
        assert "shout_word" not in compare_runs._config_view({"cases": [case]}, True)["cases"][0]
        assert "shout_word" in regression.promptreg_case_keys()
        regression.promptreg_suite({"name": "p", "cases": [
            {"id": "a", "prompt": "q", "shout_word": "x"}]})
        rules = regression.catalogue().split("\nRules:\n", 1)[1].splitlines()
        assert f"  {'shout':<22} the word in capitals, anywhere in the answer" in rules
        # the lint grades an empty reply with the real grader: the new check makes a case strong
        lint_suite = regression.validate_suite({"name": "s", "instructions": "", "cases": [
            {"id": "w", "input": "q", "max_chars": 9}, {"id": "s", "input": "q", "max_chars": 9,
                                                       "shout_word": "hey"}]})
        weak, strong = (regression.lint_case(lint_suite, case) for case in lint_suite["cases"])
        assert "an empty answer with no tool call passes" in weak and strong is None
        suite = regression.validate_suite({"name": "s", "instructions": "", "cases": [case]})
        row = regression.run_row(regression.EchoProvider(), suite, case, "m")
        assert row["reasons"] == ["not_shouted"] and row["details"]["shouted"] is False
        assert regression.failure_lines(case, row) == ["    score n/a: not shouted"]
    assert "shout_word" not in regression.CHECK_KEYS | regression.promptreg_case_keys()


def test_check_keys_are_the_regrade_keys_of_the_table():
    # The built-in cases' own keys count, for the check keys they become; played keys are input.
    assert {"expected", "rfc", "action", "expect", "cite", "behaviors"} <= regression.CHECK_KEYS
    assert not {"tool_results", "max_rounds", "input", "id"} & regression.CHECK_KEYS
    with registered("budget", lambda case, trace: [], keys=("budget_x",), regrade=False,
                    reasons={"over": ("", "")}):
        assert "budget_x" in regression.CASE_KEYS and "budget_x" not in regression.CHECK_KEYS


def test_grading_runs_each_active_check_once_and_a_behaviour_once_per_entry(monkeypatch):
    calls = []
    for check in regression.CHECK_TABLE:
        def counted(*args, check=check, run=check.run):
            calls.append((check.name, *args[2:]))
            return run(*args)
        monkeypatch.setattr(check, "run", counted)
        monkeypatch.setitem(regression.CHECKS, check.name, counted)
    suite = regression.validate_suite({**TOOL_SUITE, "cases": [
        {"id": "text", "input": "Refunds take 30 days.", "contains": ["30 days"]},
        {"id": "tools", "input": "q",
         "behaviors": ["forbid_tool:t1", "forbid_tool:t2", "no_system_leak"]}]})
    row = regression.run_row(regression.EchoProvider(), suite, suite["cases"][0], "m")
    # tool_call_as_text judges every answer (a call written as text is no call)
    assert row["passed"] and calls == [("completed",), ("contains",), ("tool_call_as_text",)]
    calls.clear()
    regression.run_row(regression.EchoProvider(), suite, suite["cases"][1], "m")
    assert calls == [("completed",), ("no_system_leak", None), ("forbid_tool", "t1"),
                     ("forbid_tool", "t2"), ("tool_call_as_text",)]


def test_a_check_without_a_guard_fails_only_the_rows_that_hold_its_key(tmp_path):
    # The trap of issue 20: grade() called every check on every case, so a check that reads its
    # key without an `if key in case` guard made every other row an execution_error (exit 2).
    suite = write_suite(tmp_path / "suite.json", {"name": "s", "instructions": "", "cases": [
        {"id": "quiet", "input": "hey", "shout_word": "hey"}, {"id": "plain", "input": "hello"}]})
    with registered("shout", check_shout, **SHOUT):
        code = run_main(["--suite", suite, "--provider", "echo", "--out", tmp_path / "r.json"])
    rows = {row["case_id"]: row for row in read_record(tmp_path / "r.json")["runs"]}
    assert code == 1
    assert rows["quiet"]["reasons"] == ["not_shouted"] and rows["plain"]["passed"] is True


def test_the_old_names_and_the_test_hooks_are_gone():
    for name in ("execute", "execute_steps", "send", "send_steps", "run_steps", "builtin_grader",
                 "execute_run", "run_jobs",
                 "explain"):
        assert not hasattr(regression, name), name


# ====================================================================== 21.7 one verdict per entry

def played(*calls):
    """A played trace: calls (name, round) in order, each given a result, with one order id."""
    tool_calls = [{"name": name, "arguments": {"order_id": "o1"}, "round": number,
                   "result": {"ok": True}} for name, number in calls]
    return regression.Trace(final_text="Done.", tool_calls=tool_calls, tool_rounds=len(calls),
                            search_urls=[], status="completed", cost_usd="0",
                            rounds=len(calls) + 1, final=True)


# Each behaviour that takes an argument: two entries; model A's answer, model B's answer, and the
# matrix's delta for each entry. B always breaks an entry A kept, with the same reason as A's.
ENTRY_TABLE = {
    "forbid_tool": (["forbid_tool:cancel_order", "forbid_tool:refund_order"],
                    trace("Done.", [("cancel_order", {})]), trace("Done.", [("refund_order", {})]),
                    ["GAIN", "REGRESS"]),
    "require_tool": (["require_tool:lookup_order", "require_tool:refund_order"],
                     trace("Done.", [("refund_order", {})]), trace("Done.", [("lookup_order", {})]),
                     ["GAIN", "REGRESS"]),
    "max_tool_rounds": (["max_tool_rounds:1", "max_tool_rounds:3"],
                        trace("Done.", [("lookup_order", {})], rounds=2),
                        trace("Done.", [("lookup_order", {})], rounds=4), ["same", "REGRESS"]),
    "require_clarification": (["require_clarification:email", "require_clarification:order_id"],
                              trace("What is your order id?"), trace("What is your email?"),
                              ["GAIN", "REGRESS"]),
    "tool_order": (["tool_order:refund_order,lookup_order", "tool_order:lookup_order,refund_order"],
                   played(("lookup_order", 1), ("refund_order", 2)),
                   played(("refund_order", 1), ("lookup_order", 2)), ["GAIN", "REGRESS"]),
}


@pytest.mark.parametrize("name", ENTRY_TABLE)
def test_each_entry_of_a_behaviour_has_its_own_verdict(name):
    entries, answer_a, answer_b, deltas = ENTRY_TABLE[name]
    case = {"id": "c", "input": "Please help with my order.", "behaviors": entries,
            **({"max_rounds": 3} if name == "tool_order" else {})}  # an order needs a played case
    row_a, row_b = graded_row(case, answer_a, "A"), graded_row(case, answer_b, "B")
    assert list(row_a["verdicts"]) == [entries[0]]
    assert entries[1] in row_b["verdicts"] and row_b["reasons"] == row_a["reasons"]
    table = compare_runs.behaviour_matrix([case], {"c": [row_a]}, {"c": [row_b]})
    # was "same" (a played case's no_final_answer rule passes on both sides)
    assert [(row[1], row[4]) for row in table if row[1] != "no_final_answer"] == list(
        zip(entries, deltas))


def test_every_failing_entry_keeps_its_evidence():
    case = {"id": "c", "input": "q",
            "behaviors": ["forbid_tool:cancel_order", "forbid_tool:refund_order"]}
    suite = regression.validate_suite({**TOOL_SUITE, "cases": [case]})
    graded = regression.grading(regression.compile_case(suite, case), trace(
        "Done.", [("cancel_order", {"order_id": "o1"}), ("refund_order", {"order_id": "o2"})]))
    assert graded.verdicts == {entry: ["forbidden_tool_called"] for entry in case["behaviors"]}
    evidence = graded.details["evidence"]["forbidden_tool_called"]
    assert evidence["note"] == "called cancel_order(order_id=o1); called refund_order(order_id=o2)"
    assert evidence["tools"] == ["cancel_order"]
    assert evidence["also"] == [{"entry": "forbid_tool:refund_order", "tools": ["refund_order"],
                                 "note": "called refund_order(order_id=o2)"}]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(TOOLS[3:]), unique=True, min_size=1, max_size=4),
       st.lists(st.sampled_from(TOOLS[3:]), unique=True, max_size=4),
       st.lists(st.sampled_from(TOOLS[3:]), unique=True, max_size=4), st.booleans())
def test_the_matrix_shows_exactly_the_entries_each_side_broke(forbidden, called_a, called_b, older):
    case = {"id": "c", "input": "q", "behaviors": [f"forbid_tool:{name}" for name in forbidden]}
    rows = [graded_row(case, trace("ok", [(name, {}) for name in called]), model)
            for model, called in (("A", called_a), ("B", called_b))]
    if older:  # a record graded before verdicts were kept: told from the reasons, or refused
        rows = [{key: value for key, value in row.items() if key != "verdicts"} for row in rows]
    try:
        table = compare_runs.behaviour_matrix([case], {"c": [rows[0]]}, {"c": [rows[1]]})
    except ValueError as exc:  # never a guess: only when a failing row has several candidates
        assert older and len(forbidden) > 1 and "per-entry verdicts" in str(exc)
        assert not all(row["passed"] for row in rows)
        return
    delta = {row[1].partition(":")[2]: row[4] for row in table}
    broke_a, broke_b = set(forbidden) & set(called_a), set(forbidden) & set(called_b)
    assert {name for name, d in delta.items() if d == "REGRESS"} == broke_b - broke_a
    assert {name for name, d in delta.items() if d == "GAIN"} == broke_a - broke_b
    assert set(delta) == set(forbidden)


FAILED_ROW = {"reasons": ["too_long"], "passed": False}
RECORD_PROBLEMS = [  # (the row's fields, a fragment of the problem)
    ({"verdicts": {"forbid_tool:t1": ["forbidden_tool_called"]}}, "verdicts disagrees"),  # passing
    ({**FAILED_ROW, "verdicts": {"length": ["too_short"]}}, "verdicts disagrees"),
    ({**FAILED_ROW, "reasons": ["too_long", "x"], "verdicts": {"length": ["too_long"]}},
     "disagrees"),
    ({**FAILED_ROW, "error": "TimeoutError", "verdicts": {"length": ["too_long"]}}, "disagrees"),
    ({**FAILED_ROW, "verdicts": {"length": []}}, "is not an object of rule"),
    ({**FAILED_ROW, "verdicts": {"length": "too_long"}}, "is not an object of rule"),
    ({**FAILED_ROW, "verdicts": ["length"]}, "verdicts is not an object"),
]


@pytest.mark.parametrize("row, fragment", RECORD_PROBLEMS)
def test_the_record_validator_refuses_verdicts_that_disagree_with_the_reasons(row, fragment):
    record = {"config": {"models": ["m"], "cases": [{"id": "c"}], "repeats": 1}, "runs": [
        {"model": "m", "case_id": "c", "repeat": 0, "error": None, "reasons": [], "passed": True,
         **row}]}
    assert fragment in regression.record_problem(record)


# ---------------------------------------------------------------------- through the real CLI

TWO_TOOLS_SUITE = {**TOOL_SUITE, "cases": [
    {"id": "cancel-or-refund", "input": "Cancel or refund ord_1?",
     "behaviors": ["forbid_tool:cancel_order", "forbid_tool:refund_order"]}]}


def tool_callers(request):
    """A chat endpoint whose model A calls cancel_order and model B refund_order."""
    tool = {"A": "cancel_order", "B": "refund_order"}[request.json["model"]]
    return fakes.Reply(body=fakes.chat_response(None, [(tool, {"order_id": "ord_1"})]))


def cli(argv, cwd, script="regression.py"):
    return fakes.run_script(argv, cwd, cli_env(), script=script)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """(folder, the run's flags): two.json, one run of the suite with models A and B (exit 1)."""
    folder = tmp_path_factory.mktemp("two-models")
    suite = write_suite(folder / "suite.json", TWO_TOOLS_SUITE)
    with fakes.FakeServer(tool_callers) as server:
        run = ["--suite", suite, "--provider", "openai", "--base-url", f"{server.url}/v1",
               "--models", "A", "B"]
        assert cli([*run, "--out", "two.json"], folder).returncode == 1
    return folder, run


def older(path, target, **header):
    """The record at `path` as an older version wrote it (no verdicts), with `header` added."""
    record = read_record(path)
    for row in record["runs"]:
        row.pop("verdicts", None)
    target.write_text(json.dumps({**header, **record}), encoding="utf-8")
    return target


def test_a_violation_of_another_entry_is_a_regress_through_the_cli(two_models, tmp_path):
    folder, _ = two_models
    # B stopped calling the tool A called: a GAIN there is marked * (it may be no call at all).
    expected = ["cancel-or-refund  forbid_tool:cancel_order  FAIL  PASS  GAIN*",
                "cancel-or-refund  forbid_tool:refund_order  PASS  FAIL  REGRESS",
                "verdict: 1 REGRESS, 1 GAIN (1 marked *: may come only from calling nothing), "
                "0 same -> exit 1"]
    older(folder / "two.json", tmp_path / "older.json")  # no verdicts: its responses graded again
    for record in (folder / "two.json", tmp_path / "older.json"):
        result = cli(["--matrix", "--models", "A", "B", record], tmp_path, "compare_runs.py")
        assert result.returncode == 1, result.stdout + result.stderr  # was FAIL FAIL same, exit 0
        assert [line for line in result.stdout.splitlines() if line in expected] == expected
    record = read_record(folder / "two.json")
    assert record["runs"][1]["verdicts"] == {"forbid_tool:refund_order": ["forbidden_tool_called"]}
    junit = regression.junit_run(record)  # the reports name the failing entry too
    assert "failed: forbid_tool:refund_order (forbidden_tool_called)" in junit
    plain = cli(["--models", "A", "B", folder / "two.json", "--markdown", "diff.md"], tmp_path,
                "compare_runs.py")
    assert plain.returncode == 0  # no row flipped to failing (SPEC A9); the entries say what moved
    assert ("REGRESS        A -> B  cancel-or-refund  "
            "+forbidden_tool_called[forbid_tool:refund_order] 0->1") in plain.stdout.splitlines()
    report = (tmp_path / "diff.md").read_text()
    assert "| forbidden_tool_called\\[forbid_tool:refund_order\\] 0-&gt;1 |" in report


def test_an_older_masked_record_refuses_the_matrix_and_compare_says_so(two_models, tmp_path):
    masked = {"pii": True, "patterns": 0}
    path = older(two_models[0] / "two.json", tmp_path / "masked.json", redaction=masked)
    record = read_record(path)  # a masked row counts only with its digest: attest these rows
    cases = {case["id"]: case for case in record["config"]["cases"]}
    for row in record["runs"]:  # masked where its checks read (a row without a mask is regraded)
        call = row["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
        call["arguments"] = call["arguments"].replace("ord_1", "[REDACTED]")
        row["verdict_sha256"] = regression.verdict_sha256(cases[row["case_id"]], row)
    path.write_text(json.dumps(record), encoding="utf-8")
    matrix = cli(["--matrix", "--models", "A", "B", "masked.json"], tmp_path, "compare_runs.py")
    assert matrix.returncode == 2
    assert matrix.stdout.startswith("NOT_COMPARABLE: row A / cancel-or-refund / repeat 0 was "
                                    "graded before per-entry verdicts were kept")
    assert len(matrix.stdout.splitlines()) == 1
    swap = cli(["--models", "A", "B", "masked.json"], tmp_path, "compare_runs.py")
    assert swap.returncode == 0
    assert ("note: per-entry verdicts unknown for 1 model/case pair (A -> B cancel-or-refund)"
            in swap.stdout)


def test_resume_refuses_a_verdict_moved_to_another_entry(two_models, tmp_path):
    folder, run = two_models
    record = read_record(folder / "two.json")
    record["runs"] = record["runs"][1:]  # B's row kept, A's to run again
    record["runs"][0]["verdicts"] = {"forbid_tool:cancel_order": ["forbidden_tool_called"]}
    (tmp_path / "forged.json").write_text(json.dumps(record), encoding="utf-8")
    result = cli([*run[:-3], "--resume", "forged.json"], tmp_path)  # refused before any request
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("B / cancel-or-refund / repeat 0 is stored as FAIL "
            "(forbidden_tool_called[forbid_tool:cancel_order]) but its stored response now grades "
            "FAIL (forbidden_tool_called[forbid_tool:refund_order])") in result.stderr
    assert len(read_record(tmp_path / "forged.json")["runs"]) == 1
