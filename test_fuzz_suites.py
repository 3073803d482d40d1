"""Suite input, fuzzed: any JSON value at any key of any suite format reads as a suite or as one
line and exit 2 before any request, never a traceback; reading stays linear in the suite's size."""

import json
import types

import regression
from testkit import clean_env, run_main  # noqa: F401 (clean_env: autouse fixture)


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
