"""Suite input, fuzzed: any JSON value at any key of any suite format reads as a suite or as one
line and exit 2 before any request, never a traceback; reading stays linear in the suite's size."""

import contextlib
import io
import json
import math
import types

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fakes
import regression
from testkit import clean_env, cli_env, run_main  # noqa: F401 (clean_env: autouse fixture)


def run_unsent(folder, answer):
    """(exit code, stdout, stderr) of a real run of FOLDER/s.json against a loopback model that
    answers `answer`, asserting that the server received no request."""
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response(answer))) as server:
        [(code, out, err)] = fakes.cli_table([(
            ["--suite", "s.json", "--provider", "openai", "--base-url", server.url + "/v1",
             "--models", "m", "--out", "r.json"], folder)], env=cli_env(), flags=("-W", "error"))
        assert server.count == 0
    return code, out, err


def tools(count):
    return [{"type": "function", "function": {"name": f"t{n}", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}} for n in range(count)]


def counting_tool_name(monkeypatch):
    """Count regression._tool_name calls (each suite, case or row that reads the tools calls it)."""
    calls, real = [0], regression._tool_name

    def counted(tool):
        calls[0] += 1
        return real(tool)
    monkeypatch.setattr(regression, "_tool_name", counted)
    return calls


# ---------------------------------------------------------------------- linear in the tools
# A suite's tools were read again for every tool_args / when entry and for every case (compile_case,
# the dry-run lint): 2,000 tools with a tool_results entry each took 9 s to read, 1,000 cases of
# 1,000 tools 8 s to run; and the plan compared every tool with every sent one (4,000: 0.5 s).

def test_the_tools_are_read_a_bounded_number_of_times_per_tool(monkeypatch, tmp_path):
    count = 150
    cases = [{"id": f"c{n}", "input": "q", "contains": ["a"], "tool_args": {f"t{n}": {"a": "x"}},
              "tool_results": {f"t{n}": [{"when": {"a": "x"}, "result": 1}, {"result": 2}]}}
             for n in range(count)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "s", "instructions": "Be brief.", "tools": tools(count),
                                "cases": cases}), encoding="utf-8")
    calls = counting_tool_name(monkeypatch)
    assert run_main(["--suite", path, "--dry-run"]) == 0
    assert calls[0] < 30 * count, calls[0]  # it was about 8 * count * count


class Tool(dict):
    """A tool object that counts how often it is compared."""

    compared = 0

    def __eq__(self, other):
        Tool.compared += 1
        return dict.__eq__(self, other)

    __hash__ = None


def test_the_plan_names_the_sent_tools_without_comparing_every_pair():
    Tool.compared = 0
    suite = {"tools": [Tool(tool) for tool in tools(300)], "request": {}}
    settings = types.SimpleNamespace(provider="echo")
    lines = regression._wire_lines(suite, settings, {})
    assert lines[0] == "tools: " + ", ".join(f"t{n}" for n in range(300))
    assert Tool.compared < 3 * 300, Tool.compared


# ---------------------------------------------------------------------- NaN and Infinity
# Python reads NaN, Infinity and 1e400 in a suite file; none is JSON. Put in a tool's schema, a tool
# result or an expect value, it went out as a bare NaN (invalid JSON to the server) and the record
# kept the string "nan": the evidence said the model was told what it was not, and a replay of the
# same suite refused the run because "the suite now answers NaN".

def sink_suite():
    """A valid suite using every key whose value may be any JSON."""
    schema = {"type": "object", "properties": {"code": {"type": "integer", "maximum": 999}}}
    return {"name": "s", "instructions": "Be brief.", "tools": tools(2),
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "a", "schema": schema}},
            "request": {"seed": 7, "options": {"top_k": [1, 2.5]}},
            "cases": [{"id": "c", "input": "q", "expect": {"code": 1.5},
                       "tool_results": {"t0": [{"when": {"a": 2.0}, "result": {"n": 0.5}},
                                               {"result": [1.0]}]},
                       "tool_args": {"t1": {"a": 3.0}},
                       "messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "tool_calls": [{
                                        "id": "k", "type": "function",
                                        "function": {"name": "t0", "arguments": {"a": 4.0}}}]},
                                    {"role": "tool", "tool_call_id": "k", "content": "r"}]}]}


def float_paths(value, path=()):
    """The path of every float inside a JSON value."""
    if isinstance(value, float):
        yield path
    for key, inner in (value.items() if isinstance(value, dict) else
                       enumerate(value) if isinstance(value, list) else ()):
        yield from float_paths(inner, path + (key,))


def put(value, path, new):
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("path", list(float_paths(sink_suite())), ids=str)
def test_nan_or_infinity_anywhere_in_a_suite_is_refused(path, bad):
    regression.validate_suite(sink_suite())  # valid as written
    data = sink_suite()
    put(data, path, bad)
    with pytest.raises(regression.SuiteError, match="NaN or Infinity|not plain JSON"):
        regression.validate_suite(json.loads(json.dumps(data)))


def test_a_tool_result_of_nan_is_one_line_and_nothing_is_sent(tmp_path):
    text = json.dumps({"name": "s", "instructions": "Be brief.", "tools": tools(1), "cases": [
        {"id": "c", "input": "q", "contains": ["q"], "tool_results": {"t0": 1e400}}]})
    (tmp_path / "s.json").write_text(text.replace("Infinity", "1e400"), encoding="utf-8")
    code, out, err = run_unsent(tmp_path, "q")
    assert (code, err) == (2, "regression.py: error: s.json: case 'c': tool_results.t0 holds NaN "
                              "or Infinity (1e400 reads as Infinity), which is not JSON; write a "
                              "finite number or a string\n"), out
    assert not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------------- tool and format fields
# A function tool's description, parameters and strict (and a json_schema format's description and
# strict) went out as written: a description of true or parameters of 1e-300 was refused by every
# server, and by the perplexity SDK before it sent anything, as an execution error of every row
# (exit 2 after a record was made, "continue with --resume", which failed the same way).

def suite_with_tool(tool, **keys):
    return {"name": "s", "instructions": "Be brief.", "tools": [tool],
            "cases": [{"id": "c", "input": "q", "contains": ["q"]}], **keys}


@pytest.mark.parametrize("field, value, said", [
    ("description", True, "description must be a string"),
    ("description", ["x"], "description must be a string"),
    ("parameters", 1e-300, "parameters must be an object (the JSON schema of its arguments)"),
    ("parameters", "{}", "parameters must be an object (the JSON schema of its arguments)"),
    ("strict", "yes", "strict must be true or false"),
    ("strict", 1, "strict must be true or false")])
@pytest.mark.parametrize("form", ["chat", "flat"])
def test_a_function_tool_field_of_another_type_is_refused(form, field, value, said):
    tool = {"type": "function", "function": {"name": "t0", field: value}} if form == "chat" else \
        {"type": "function", "name": "t0", field: value}
    with pytest.raises(regression.SuiteError) as refused:
        regression.validate_suite(suite_with_tool(tool))
    assert str(refused.value) == f"suite: function tool 't0': {said}"


@pytest.mark.parametrize("field, value, said", [
    ("description", 5, "description must be a string"),
    ("strict", "no", "strict must be true or false")])
def test_a_json_schema_format_field_of_another_type_is_refused(field, value, said):
    spec = {"name": "a", "schema": {"type": "object"}, field: value}
    data = suite_with_tool(tools(1)[0],
                           response_format={"type": "json_schema", "json_schema": spec})
    with pytest.raises(regression.SuiteError) as refused:
        regression.validate_suite(data)
    assert str(refused.value) == f"suite: response_format.json_schema: {said}"


def test_null_fields_are_as_good_as_none():
    tool = {"type": "function", "function": {"name": "t0", "description": None, "parameters": None,
                                             "strict": None}}
    assert regression.validate_suite(suite_with_tool(tool))["tools"] == [tool]


def test_suites_every_provider_refuses_are_one_line_before_any_request(tmp_path):
    """Through the real CLI, against one fake serving every API: nothing sent, no record."""
    tool = {"type": "function", "function": {"name": "t0", "description": True}}
    (tmp_path / "tool.json").write_text(json.dumps(suite_with_tool(tool)), encoding="utf-8")
    (tmp_path / "jo.json").write_text(json.dumps({
        "name": "s", "instructions": "JSON.", "response_format": {"type": "json_object"},
        "cases": [{"id": "c", "input": "q", "expect": {"k": "v"}}]}), encoding="utf-8")
    with fakes.FakeServer(lambda request: fakes.Reply(body=fakes.agent_response("q"))) as server:
        openai = ["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m"]
        runs = [(["--suite", "tool.json", *openai, "--out", "a.json"], tmp_path),
                (["--suite", "jo.json", "--models", "m", "--out", "b.json"], tmp_path)]
        env = cli_env(PERPLEXITY_API_KEY="pplx-test-0123456789", PERPLEXITY_BASE_URL=server.url)
        results = fakes.cli_table(runs, env=env, flags=("-W", "error"))
        assert server.count == 0
    assert [(code, err) for code, _, err in results] == [
        (2, "regression.py: error: tool.json: suite: function tool 't0': description must be a "
            "string\n"),
        (2, "regression.py: error: --provider perplexity: the Agent API takes a json_schema "
            "response_format only; give one (or check the answer with the json_object "
            "behaviour)\n")]
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


def test_a_golden_folder_of_many_tools_matches_each_case_by_name(monkeypatch, tmp_path):
    """A golden case is offered the tools its file names: they were found by matching every tool
    of the folder, for every case and row (2,000 files naming 5 tools each: 19 s to run)."""
    count = 150
    (tmp_path / "SYSTEM.txt").write_text("Be brief.\n", encoding="utf-8")
    sha = regression.instructions_sha256("Be brief.\n")
    for n in range(count):
        (tmp_path / f"c{n:03}.json").write_text(json.dumps({
            "id": f"g{n}", "user": "u", "system_sha256": sha, "tools": [f"t{n}", "shared"],
            "behaviors": [f"forbid_tool:t{n}"]}), encoding="utf-8")
    calls = counting_tool_name(monkeypatch)
    assert run_main(["--suite", tmp_path, "--dry-run"]) == 0
    suite = regression.load_suite(str(tmp_path))
    assert regression.case_suite(suite, suite["cases"][7])["tools"] == [
        {"type": "function", "function": {"name": "shared"}},  # in the folder's order: c000 has it
        {"type": "function", "function": {"name": "t7"}}]
    assert calls[0] < 30 * count, calls[0]


# ---------------------------------------------------------------------- the judge's key variable
# judge.api_key_env was checked as str(value): true read as "True", a valid NAME, and then looking
# it up in the environment raised TypeError (a traceback from --dry-run and every run).

def judged_suite(**judge):
    return {"name": "s", "instructions": "Be brief.",
            "judge": {"provider": "openai", "model": "j", **judge},
            "cases": [{"id": "c", "input": "q", "rubric": "It is short."}]}


@pytest.mark.parametrize("value", [True, False, 0, ["JUDGE_KEY"], {"name": "JUDGE_KEY"}, "1X"])
def test_a_judge_api_key_env_that_is_no_name_is_refused(value):
    with pytest.raises(regression.SuiteError) as refused:
        regression.validate_suite(judged_suite(api_key_env=value))
    assert str(refused.value) == \
        "suite: judge api_key_env must be the NAME of an environment variable"


def test_a_judge_api_key_env_of_true_is_one_line_through_the_cli(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(judged_suite(api_key_env=True)), encoding="utf-8")
    [(code, out, err)] = fakes.cli_table([(["--suite", "s.json", "--dry-run"], tmp_path)],
                                         env=cli_env(), flags=("-W", "error"))
    assert (code, err) == (2, "regression.py: error: s.json: suite: judge api_key_env must be the "
                              "NAME of an environment variable\n"), out


# ---------------------------------------------------------------------- any value at any key
# The class these defects belong to: a value of a type or size the code did not expect, at any key
# of any suite format. Any one mutation of a valid suite (a key of any object set to any JSON value,
# deleted, or added with a name some suite object knows) is a suite or one SuiteError line; an
# accepted suite is plain JSON, its Agent API bodies are ones the perplexity SDK sends, and its
# --dry-run exits 0 (or refuses in one line).

KNOWN_KEYS = sorted(set(regression.SUITE_KEYS) | set(regression.CASE_KEYS) | regression.JUDGE_KEYS
                    | regression.EXAMPLE_KEYS | regression.SOURCES_KEYS | {
                        "role", "content", "tool_calls", "tool_call_id", "type", "function", "name",
                        "arguments", "when", "result", "parameters", "description", "strict",
                        "json_schema", "schema", "properties", "required", "user"})
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from([10**400, -0.0, 1e308, 0.5]) |
    st.floats(allow_nan=True) | st.text(max_size=6) | st.sampled_from(
        ["", " ", "\u200b", "a\nb", "t0", "t1", "forbid_tool:t0", "tool_order:t0,t1", "user",
         "assistant", "tool", "function", "json_object", "json_schema", "openai", "pass", "fail"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(KNOWN_KEYS) | st.text(max_size=3), inner, max_size=3), max_leaves=6)


def full_suite():
    """sink_suite with a judge, its examples, a played and judged case, a conversation."""
    data = sink_suite()
    data.update(judge={"provider": "openai", "model": "j", "repeats": 1, "prompt": "Grade it."},
                judge_examples=[{"rubric": "r", "answer": "a", "verdict": "pass", "input": "i"},
                                {"rubric": "r", "answer": "b", "verdict": "fail"}],
                prices={"m": "0.1/0.2"}, max_rounds=3, allow_extra_fields=True, notes="n")
    data["cases"] += [
        {"id": "d", "question": "q?", "rubric": ["It is short.", "It is kind."],
         "claims": {"refunded": "t1"}, "behaviors": ["tool_order:t0,t1", "grounded"],
         "tool_results": {"t1": {"ok": True}}, "max_rounds": 2},
        {"id": "e", "turns": ["hi", {"user": "more", "contains": ["x"], "behaviors": [
            "forbid_tool:t1"]}], "expected_text": "x", "min_similarity": 0.5, "min_chars": 1}]
    return data


@st.composite
def mutated(draw):
    data = full_suite()
    nodes = [path for path in mut_paths(data) if isinstance(get(data, path), dict)]
    path = draw(st.sampled_from(nodes))
    node, action = get(data, path), draw(st.sampled_from(["set", "delete", "add"]))
    if action != "add" and node:
        key = draw(st.sampled_from(sorted(node)))
        if action == "delete":
            del node[key]
            return data
    else:
        key = draw(st.sampled_from(KNOWN_KEYS))
    node[key] = draw(JSON_VALUES)
    return data


def mut_paths(value, path=()):
    yield path
    for key, inner in (value.items() if isinstance(value, dict) else
                       enumerate(value) if isinstance(value, list) else ()):
        yield from mut_paths(inner, path + (key,))


def get(value, path):
    for key in path:
        value = value[key]
    return value


def test_the_full_suite_is_valid():
    suite = regression.validate_suite(full_suite())
    assert [case["id"] for case in suite["cases"]] == ["c", "d", "e"]


@settings(max_examples=35, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutated())
def test_any_value_at_any_key_is_a_suite_or_one_line(tmp_path, data):
    from perplexity.generated.api import ResponsesRequestInput
    data = json.loads(json.dumps(data))  # as a file gives it: NaN stays NaN
    try:
        suite = regression.validate_suite(data)
    except regression.SuiteError as exc:
        assert str(exc) and "\n" not in regression.safe_text(str(exc))
        return
    json.dumps(suite["definition"], allow_nan=False)  # a record keeps what was sent
    if regression.PerplexityProvider.suite_problem(suite) is None:
        for case in (case for case in suite["cases"] if "turns" not in case):
            body = regression.PerplexityProvider().body("m", suite, case)
            ResponsesRequestInput.model_validate(
                {key: value for key, value in body.items() if key != "extra_body"})
    (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
    quiet = contextlib.redirect_stdout(io.StringIO())
    with quiet, contextlib.redirect_stderr(io.StringIO()) as err:
        code = run_main(["--suite", tmp_path / "s.json", "--dry-run", "--provider", "openai",
                         "--models", "m", "--base-url", "http://127.0.0.1:9/v1",
                         "--judge-base-url", "http://127.0.0.1:9/v1"])
    refusals = [line for line in err.getvalue().splitlines() if not line.startswith("warning: ")]
    assert code == 0 or (code, len(refusals)) == (2, 1) and "judge" in refusals[0], err.getvalue()


# ---------------------------------------------------------------------- found by the property above
# A conversation (turns) case has no input of its own: --dry-run's cost estimate, made when a model
# has a price, read it and raised TypeError (a traceback, exit 1).

def test_a_priced_conversation_is_estimated_from_its_turns_through_the_cli(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps({
        "name": "s", "instructions": "Be brief.", "prices": {"m": "0.1/0.2"},
        "cases": [{"id": "e", "turns": ["hi", {"user": "more"}], "contains": ["x"]}]}),
        encoding="utf-8")
    [(code, out, err)] = fakes.cli_table([(
        ["--suite", "s.json", "--dry-run", "--provider", "openai", "--base-url",
         "http://127.0.0.1:9/v1", "--models", "m"], tmp_path)],
        env=cli_env(), flags=("-W", "error"))
    assert (code, err) == (0, ""), err
    assert "estimated cost: at most $0.0016 for output (up to 2 requests x 4,096 output tokens " \
           "each, the output cap)" in out


# A chat-form function tool whose function object holds its own "type" went to the Agent API with
# that type (null, "web_search") over "function": the SDK refused every row as an execution error.

@pytest.mark.parametrize("inner", [None, "web_search", "mcp"])
def test_a_function_objects_own_type_never_replaces_function(inner):
    tool = {"type": "function", "function": {"name": "t0", "type": inner}}
    suite = regression.validate_suite(suite_with_tool(tool))
    body = regression.PerplexityProvider().body("m", suite, suite["cases"][0])
    assert body["tools"][0]["type"] == "function" and body["tools"][0]["name"] == "t0"


# A response_format schema property's "type" was never checked: a type name no JSON type has
# ("intger") let every value pass the type check (a false pass of expect's types), and a dict
# raised TypeError while grading, an execution error of a row already paid for.

def schema_suite(spec):
    schema = {"type": "object", "properties": {"code": spec}}
    return {"name": "s", "instructions": "JSON.", "cases": [{"id": "c", "input": "q",
                                                             "expect": {"code": 1}}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "a", "schema": schema}}}


@pytest.mark.parametrize("spec", [
    {"type": "intger"}, {"type": {"a": 1}}, {"type": []}, {"type": ["integer", 5]}, {"type": 5},
    {"type": None}, {"type": "array", "items": {"type": "strng"}},
    {"type": "array", "items": {"type": "array", "items": {"type": ["x"]}}}])
def test_a_schema_type_that_is_no_json_type_is_refused(spec):
    with pytest.raises(regression.SuiteError) as refused:
        regression.validate_suite(schema_suite(spec))
    assert str(refused.value) == (
        "suite: response_format schema property 'code': type must be one of string, integer, "
        "number, boolean, array, object, null or a list of them")


@pytest.mark.parametrize("spec", [{}, {"type": "integer"}, {"type": ["integer", "null"]},
                                  {"type": "array", "items": {"type": "integer"}},
                                  {"type": "array", "items": True}])
def test_json_types_are_kept(spec):
    assert regression.validate_suite(schema_suite(spec))["cases"][0]["id"] == "c"


def test_a_schema_type_of_an_object_is_one_line_and_nothing_is_sent(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(schema_suite({"type": {"a": 1}})), encoding="utf-8")
    code, out, err = run_unsent(tmp_path, '{"code": 1}')
    assert (code, err) == (2, "regression.py: error: s.json: suite: response_format schema "
                              "property 'code': type must be one of string, integer, number, "
                              "boolean, array, object, null or a list of them\n"), out
    assert not (tmp_path / "r.json").exists()


# Two function tools of one name (in tools, or as tool and in tools) were sent as both: the APIs
# refuse the request (every row an execution error) and the checks read one of their schemas.

@pytest.mark.parametrize("keys", [{"tools": tools(1) + tools(1)},
                                  {"tool": tools(1)[0], "tools": tools(2)},
                                  {"tools": [tools(1)[0], {"type": "function", "name": "t0"}]}])
def test_a_function_tool_declared_twice_is_refused(keys):
    data = {**suite_with_tool(tools(1)[0]), **keys}
    with pytest.raises(regression.SuiteError) as refused:
        regression.validate_suite(data)
    assert str(refused.value) == "suite: function tool 't0' is declared twice"


def test_a_function_tool_declared_twice_is_one_line_through_the_cli(tmp_path):
    data = {**suite_with_tool(tools(1)[0]), "tools": tools(1) * 2}
    (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
    [(code, out, err)] = fakes.cli_table([(["--suite", "s.json", "--dry-run"], tmp_path)],
                                         env=cli_env(), flags=("-W", "error"))
    assert (code, err) == (2, "regression.py: error: s.json: suite: function tool 't0' is declared "
                              "twice\n"), out


# tools of another shape (not a list, an item not an object, a lone tool not an object) is one
# line and exit 2, checked once where the suite's tools are read.

@pytest.mark.parametrize("keys, said", [
    ({"tools": "lookup"}, "suite: tools must be a list of objects"),
    ({"tools": ["lookup"]}, "suite: tools must be a list of objects"),
    ({"tools": [tools(1)[0], None]}, "suite: tools must be a list of objects"),
    ({"tool": ["lookup"]}, "suite: tool must be an object (use tools for a list)")])
def test_tools_of_another_shape_are_one_line_through_the_cli(tmp_path, keys, said):
    data = {**suite_with_tool(tools(1)[0]), **keys}
    (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
    [(code, out, err)] = fakes.cli_table([(["--suite", "s.json", "--dry-run"], tmp_path)],
                                         env=cli_env(), flags=("-W", "error"))
    assert (code, err) == (2, f"regression.py: error: s.json: {said}\n"), out


# A function tool named with a line break, a space or an invisible character was sent as
# written: the APIs refuse such a name on every row, and --dry-run printed it over two lines.

@pytest.mark.parametrize("name", ["look\nup", "look up", "\tlookup", "lookup\u202e", "look\x1b[2Jup",
                                  "look\u200bup", "lookup\u3000"])
def test_a_function_tool_name_with_a_space_or_an_unprintable_character_is_refused(tmp_path, name):
    data = suite_with_tool({"type": "function", "function": {"name": name}})
    (tmp_path / "s.json").write_text(json.dumps(data), encoding="utf-8")
    [(code, out, err)] = fakes.cli_table([(["--suite", "s.json", "--dry-run"], tmp_path)],
                                         env=cli_env(), flags=("-W", "error"))
    assert code == 2 and err.count("\n") == 1 and err.startswith(
        f"regression.py: error: s.json: suite: function tool {name!r} has a space or an "
        "unprintable character in its name"), err
    assert not out


def test_a_tool_name_of_letters_digits_dots_and_dashes_still_loads():
    for name in ("lookup", "look_up-2", "ns.lookup", "ns:lookup", "búsqueda_pedido"):
        regression.validate_suite(suite_with_tool({"type": "function", "function": {"name": name}}))
