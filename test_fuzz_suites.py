"""Suite input, fuzzed: any JSON value at any key of any suite format reads as a suite or as one
line and exit 2 before any request, never a traceback; reading stays linear in the suite's size."""

import json
import math
import types

import pytest

import fakes
import regression
from testkit import clean_env, cli_env, run_main  # noqa: F401 (clean_env: autouse fixture)


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
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
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
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("q"))) as server:
        [(code, out, err)] = fakes.cli_table([(
            ["--suite", "s.json", "--provider", "openai", "--base-url", server.url + "/v1",
             "--models", "m", "--out", "r.json"], tmp_path)], env=cli_env(), flags=("-W", "error"))
        assert server.count == 0
    assert (code, err) == (2, "regression.py: error: s.json: case 'c': tool_results.t0 holds NaN or "
                              "Infinity (1e400 reads as Infinity), which is not JSON; write a finite "
                              "number or a string\n"), out
    assert not (tmp_path / "r.json").exists()
