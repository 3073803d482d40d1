"""A record's fields of the wrong JSON type are one line and exit 2 in every reader, never a
traceback: a provider name that is a list or an object (it cannot be looked up), a superseded
field that is not a list (it was walked even after it was found wrong)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from testkit import ROOT, cli_env

GUARDRAILS = ROOT / "suites" / "support-guardrails.json"
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
HOSTILE = [("provider", {"name": []}, "provider.name is not the name of a provider"),
           ("provider", {"name": {"a": 1}}, "provider.name is not the name of a provider"),
           ("superseded", 1.5, "superseded is not a list"),
           ("superseded", True, "superseded is not a list")]


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """A real record of the echo provider (a passing run, written by the CLI)."""
    folder = tmp_path_factory.mktemp("record")
    argv = ["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "--out", "run.json"]
    code, _, err = fakes.cli_table([(argv, folder)], env=cli_env())[0]
    assert code in (0, 1), err
    return json.loads((folder / "run.json").read_text(encoding="utf-8"))


def test_a_real_record_is_usable(record):
    assert regression.record_problem(record) is None


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(sorted(regression.RECORD_FIELDS)), value=JSON, name=JSON)
def test_a_field_of_any_json_type_is_a_problem_or_none_never_a_raise(record, field, value, name):
    """Any JSON value in a header field, and any provider name, gives a verdict on the record."""
    for edited in ({**record, field: value}, {**record, "provider": {"name": name}}):
        problem = regression.record_problem(edited)
        assert problem is None or isinstance(problem, str)


@pytest.mark.parametrize("field, value, said", HOSTILE)
def test_record_problem_names_the_field(record, field, value, said):
    assert regression.record_problem({**record, field: value}) == said


def test_every_reader_refuses_a_mistyped_field_in_one_line(record, tmp_path):
    """--report and compare_runs.py: exit 2, one line naming the field, no traceback."""
    runs = []
    for number, (field, value, said) in enumerate(HOSTILE):
        paths = [tmp_path / f"bad{number}-{side}.json" for side in ("a", "b")]
        for path in paths:
            path.write_text(json.dumps({**record, field: value}), encoding="utf-8")
        runs.append(("regression.py", ["--report", paths[0], "--markdown", tmp_path / "r.md"], said))
        runs.append(("compare_runs.py", paths, said))
    for script, argv, said in runs:
        code, out, err = fakes.cli_table([(argv, tmp_path)], env=cli_env(), script=script)[0]
        said_lines = (out + err).strip().splitlines()
        assert (code, len(said_lines), "Traceback" in err) == (2, 1, False), (script, out, err)
        assert said in said_lines[0]


# ------------------------------------------------------------ attempts: retries, not requests

def _failing_in_turn_two(failures):
    """A chat endpoint: "t one" and the first round of "go" answer (a call), then `failures`
    HTTP 500s for each later request (turn "t two", round 2 of "go"), then "ok"."""
    seen = {}

    def reply(request):
        messages = request.json["messages"]
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        later = user == "t two" or user == "go" and messages[-1]["role"] == "tool"
        seen[user] = seen.get(user, 0) + later
        if later and seen[user] <= failures:
            return fakes.Reply(500, {"error": {"message": "boom"}})
        made = [("lookup_order", {})] if user == "go" and not later else []
        return fakes.Reply(body=fakes.chat_response(None if made else "ok", tool_calls=made))
    return reply


@pytest.mark.parametrize("shape", ["conversation", "played"])
@pytest.mark.parametrize("retries, stored, said", [
    (0, 2, None), (1, 3, "(after 3 attempts for 2 requests)")])
def test_a_row_that_failed_in_a_later_request_claims_no_retry_it_did_not_make(
        tmp_path, shape, retries, stored, said):
    """With --retries 0, a conversation whose turn 2 failed (and a played row whose round 2
    did) printed "(after 2 attempts)": the failed request left no response, so it was counted as
    a retry. attempts still counts every request of the row (docs/records.md); the console
    says "(after N attempts ...)" only when a request was retried."""
    case = {"id": "conv", "turns": ["t one", "t two"], "contains": ["ok"]} \
        if shape == "conversation" else \
        {"id": "played", "input": "go", "contains": ["ok"],
         "tool_results": {"lookup_order": {"ok": True}}}
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps({
        "name": "later", "instructions": "Be nice.", "tools": [{"type": "function", "function": {
            "name": "lookup_order", "parameters": {"type": "object", "properties": {}}}}],
        "cases": [case]}), encoding="utf-8")
    with fakes.FakeServer(_failing_in_turn_two(retries + 1)) as server:
        argv = ["--suite", suite, "--provider", "openai", "--base-url", server.url + "/v1",
                "--models", "m", "--retries", retries, "--out", "run.json"]
        code, out, err = fakes.cli_table([(argv, tmp_path)], env=cli_env())[0]
    assert code == 2, err
    row, = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))["runs"]
    assert (row["error"], row["attempts"]) == ("HTTPError", stored)
    line, = [line for line in out.splitlines() if "ERROR HTTPError 500" in line]
    assert ("(after" in line, said is None or said in line) == (said is not None, True), line
