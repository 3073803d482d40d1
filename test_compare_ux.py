"""What a comparison shows besides its rows (issues 22.2, 22.9, 21.13).

- the set-up that changed: the instructions (sha256 prefixes and a bounded, escaped diff), each
  case's system prompt, the pins and the endpoint, before the rows and in every report;
- every CAUTION line in the console and in the Markdown, HTML and JUnit reports;
- a capability that vanished is not a gain: a side that made no tool call (or stopped calling the
  other side's tools) gets a CAUTION, and the GAINs of call-caused reasons there are marked *;
- rough edges: the file of an unusable record is named, --merge names the differing key, the
  label lines are column-aligned, a demo folder that exists is one error line (exit 2).

Records are made by the real runner (echo provider, or openai against loopback fakes); every
command's exit code is pinned through the real CLI (fakes.cli_table runs a table in one child)."""

import hashlib
import json
import re
import unicodedata
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings, strategies as st

import compare_runs
import fakes
from regression import md_text, xml_text
from testkit import cli_env, clean_env  # noqa: F401  (autouse: scrubbed environment)

SYSTEM_V1 = "You are the Acme support agent.\nNever cancel an order without its order id.\n"
SYSTEM_V2 = SYSTEM_V1 + "Always answer in one sentence.\n"
GOLDEN_CASES = {
    "cancel": {"user": "Please cancel my order, I don't need it anymore.",
               "tools": ["lookup_order", "cancel_order"],
               "behaviors": ["no_system_leak", "max_tool_rounds:1",
                             "require_clarification:order_id", "forbid_tool:cancel_order"]},
    "shipping": {"user": "If I order at 3 pm today, when does it ship?", "tools": ["lookup_order"],
                 "behaviors": ["no_system_leak", "forbid_tool:lookup_order"]},
}
# Instructions a hostile suite author could write: a terminal escape, a bidi override, a fence
# breaker for the Markdown diff, markup for the HTML one.
HOSTILE = "Answer briefly.\x1b[2J\u202egnp.exe ```` </pre><script>alert(1)</script>"


def golden(folder, system):
    """A golden folder: SYSTEM.txt and one pinned file per case."""
    folder.mkdir()
    (folder / "SYSTEM.txt").write_text(system, encoding="utf-8")
    pin = hashlib.sha256(system.encode()).hexdigest()
    for case_id, case in GOLDEN_CASES.items():
        case_file = {"id": case_id, "system_sha256": pin, **case}
        (folder / f"{case_id}.json").write_text(json.dumps(case_file))
    return folder


def agent(calls):
    """A chat endpoint for the goldens: `calls(model)` is the cancel case's tool calls (or none)."""
    def answer(body):
        if "cancel" in body["messages"][-1]["content"]:
            made = calls(body["model"])
            return fakes.chat_response(None if made else "I will take care of it.", tool_calls=made)
        return fakes.chat_response("Orders placed after 2 pm ship the next working day.")
    return fakes.chat(answer)


CANCEL = [("cancel_order", {"order_id": "A1001"})]  # forbidden, with an invented id
LOOKUP = [("lookup_order", {})]  # a tool call still made, but to no tool the other side used


def suite_file(path, instructions, cases):
    pin = hashlib.sha256(instructions.encode()).hexdigest()
    path.write_text(json.dumps({"name": "s", "instructions": instructions, "cases": [
        {"id": case_id, "input": f"say {word}", "contains": [word], "instructions_sha256": pin}
        for case_id, word in cases]}))
    return path


def promptreg_file(path, systems):
    path.write_text(json.dumps({"name": "p", "cases": [
        {"id": case_id, "prompt": f"say {case_id}", "system": system, "contains": [case_id]}
        for case_id, system in systems.items()]}))
    return path


def openai_runs(folder):
    """The golden runs against loopback chat endpoints, one per agent behaviour, as argv lists."""
    v1, v2 = golden(folder / "golden-v1", SYSTEM_V1), golden(folder / "golden-v2", SYSTEM_V2)
    mixed = {"x": CANCEL, "y": []}  # model y of two stopped calling
    servers = {name: fakes.FakeServer(agent(behaviour)) for name, behaviour in {
        "calls": lambda model: CANCEL, "silent": lambda model: [], "lookup": lambda model: LOOKUP,
        "mixed": lambda model: mixed[model]}.items()}

    def run(out, suite, server, models=("m",), repeats="3"):
        return ["--suite", suite, "--provider", "openai", "--base-url", f"{servers[server].url}/v1",
                "--models", *models, "--repeats", repeats, "--out", folder / out]
    return servers, [run("calls.json", v1, "calls"), run("silent.json", v1, "silent"),
                     run("edit.json", v2, "calls"), run("lookup.json", v1, "lookup"),
                     run("two-calls.json", v1, "calls", ("x", "y"), "1"),
                     run("two-mixed.json", v1, "mixed", ("x", "y"), "1")]


def echo_runs(folder):
    """Echo runs of suites whose instructions or system prompts differ, then two shards of "one"
    run whose suites differ in one case, and their --merge."""
    table = []
    for name, text in (("plain", "Answer briefly."), ("hostile", HOSTILE),
                       ("long", "\n".join(f"rule {n}" for n in range(100)))):
        suite = suite_file(folder / f"{name}.suite.json", text, [("a", "hello"), ("a-long", "bye")])
        table.append(["--suite", suite, "--provider", "echo", "--out", folder / f"{name}.json"])
    for name, systems in (("shared", {"a": "S", "b": "S", "c": "S"}),
                          ("per-case", {"a": "S", "b": "S, and be brief", "c": "S"})):
        suite = promptreg_file(folder / f"{name}.suite.json", systems)
        table.append(["--suite", suite, "--provider", "echo", "--out", folder / f"{name}.json"])
    for shard, word in (("1", "hello"), ("2", "hullo")):
        suite = suite_file(folder / f"shard{shard}.suite.json", "Answer briefly.",
                           [("a", word), ("b", "bye")])
        table.append(["--suite", suite, "--provider", "echo", "--shard", f"{shard}/2",
                      "--out", folder / f"shard{shard}.json"])
    shards = [folder / "shard1.json", folder / "shard2.json"]
    return table + [["--merge", folder / "merged.json", *shards]]


def records(folder):
    """Every record the comparisons read, made by the real runner (each run forked from the test
    zygote), then the hand-edited ones (by the record format's rules); returns the --merge result."""
    servers, table = openai_runs(folder)
    for server in servers.values():
        server.__enter__()
    try:
        table += echo_runs(folder)
        results = fakes.cli_table([(argv, folder) for argv in table], env=cli_env())
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)
    assert [code for code, _, _ in results][:6] == [1, 1, 1, 1, 1, 1], results
    edit(folder, "edit.json", "edit-other-code.json",
         lambda record: record.update(sdk_version="9.9.9", code_sha256="f" * 64))
    gone = edit(folder, "calls.json", "torn-after.json", lambda record: record["runs"].pop(1))
    (folder / "torn-gone.json").write_text(json.dumps(gone))
    edit(folder, "plain.json", "plain-failing.json", lambda record: [  # evidence and verdict
        row.update(reasons=["missing_required_text"], passed=False, answer_text="no",
                   response={**row["response"], "output_text": "no"}) for row in record["runs"]])
    (folder / "offline-demo").mkdir()
    for name in ("before.json", "after.json"):  # an earlier demo's records, edited by the user
        (folder / "offline-demo" / name).write_text("mine")
    return results[-1]


def edit(folder, source, target, change):
    """A copy of a record changed by hand; returns what `change` returned."""
    record = json.loads((folder / source).read_text())
    returned = change(record)
    (folder / target).write_text(json.dumps(record))
    return returned


def reports(name):
    return ["--markdown", f"{name}.md", "--html", f"{name}.html", "--junit", f"{name}.xml"]


COMPARES = {  # name -> compare_runs.py argv, run in the records' folder
    "golden-edit": ["calls.json", "edit.json"],
    "per-case": ["shared.json", "per-case.json"],
    "hostile": ["plain.json", "hostile.json", *reports("hostile")],
    "long": ["plain.json", "long.json"],
    "caution": ["calls.json", "edit-other-code.json", *reports("caution")],
    "vanished": ["calls.json", "silent.json", *reports("vanished")],
    "appeared": ["silent.json", "calls.json"],
    "other-tool": ["calls.json", "lookup.json"],
    "one-of-two": ["two-calls.json", "two-mixed.json"],
    "one-of-two-matrix": ["--matrix", "two-calls.json", "two-mixed.json"],
    "swap": ["--models", "x", "y", "two-mixed.json", "--markdown", "swap.md"],
    "swap-matrix": ["--matrix", "--models", "x", "y", "two-mixed.json"],
    "swap-back": ["--models", "y", "x", "two-mixed.json"],
    "torn-after": ["calls.json", "torn-after.json"],
    "torn-before": ["torn-after.json", "calls.json"],
    "torn-models": ["--models", "m", "m", "torn-after.json"],
    "torn-matrix": ["--matrix", "calls.json", "torn-after.json"],
    "aligned": ["plain.json", "plain-failing.json"],
    "demo-again": ["--demo", "offline-demo"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(folder, the --merge result, {name: (exit code, stdout, stderr)} of every COMPARES entry):
    every run forked from the test zygote (fakes.cli_table), the runner's table and compare's."""
    folder = tmp_path_factory.mktemp("runs")
    merged = records(folder)
    results = fakes.cli_table([(argv, folder) for argv in COMPARES.values()], env=cli_env(),
                              script="compare_runs.py")
    return folder, merged, dict(zip(COMPARES, results))


def lines_of(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


# ====================================================================== 22.2: the set-up

def test_a_golden_system_prompt_edit_shows_both_sha256_the_diff_and_the_pins(runs):
    code, out, err = runs[2]["golden-edit"]
    assert (code, err) == (0, ""), out
    old, new = (hashlib.sha256(text.encode()).hexdigest()[:12] for text in (SYSTEM_V1, SYSTEM_V2))
    assert out.split("\n\n")[0].splitlines() == [
        "set-up that changed (before -> after; only these may differ between comparable records):",
        f"  instructions: sha256 {old} -> {new} (+1 -0 lines)",
        "    --- before", "    +++ after", "    @@ -1,3 +1,4 @@",
        "     You are the Acme support agent.", "     Never cancel an order without its order id.",
        "    +Always answer in one sentence.", "     ",
        f'  pin of cases "cancel", "shipping": {old} -> {new}']
    # one server on both sides: no endpoint line, no CAUTION
    assert "CAUTION" not in out and "verdict: no new failure (exit 0)" in out


def test_a_per_case_system_prompt_edit_names_the_case_and_its_pin(runs):
    code, out, _ = runs[2]["per-case"]
    assert code == 0, out
    old, new = (hashlib.sha256(text.encode()).hexdigest()[:12] for text in ("S", "S, and be brief"))
    lines = out.splitlines()
    assert f'  system prompt of case "b": sha256 {old} -> {new} (+1 -1 lines)' in lines
    assert "    -S" in lines and "    +S, and be brief" in lines
    assert f'  pin of case "b": {old} -> {new}' in lines
    assert '"a"' not in out.split("\n\n")[0]  # the unchanged cases are not listed


def test_the_diff_escapes_hostile_instructions_in_the_console_and_every_report(runs):
    folder, _, compared = runs
    code, out, err = compared["hostile"]
    assert (code, err) == (0, "")
    shown = "    +Answer briefly.\\x1b[2J\\u202egnp.exe ```` </pre><script>alert(1)</script>"
    assert shown in out.splitlines()
    text = {kind: (folder / f"hostile.{kind}").read_text(encoding="utf-8")
            for kind in ("md", "html", "xml")}
    for kind, report in text.items():
        assert "\x1b" not in report and "\u202e" not in report and "\\u202e" in report, kind
    fence = re.search(r"^(`{5,})diff$", text["md"], re.M)  # longer than the ```` inside it
    assert fence and text["md"].count(fence.group(1)) == 2
    assert "<script>" not in text["html"] and "&lt;/pre&gt;&lt;script&gt;" in text["html"]
    system_out = ET.fromstring(text["xml"]).find("testsuite/system-out").text
    assert "instructions: sha256" in system_out and "<script>" in system_out  # escaped in the XML


def test_a_long_edit_is_cut_and_says_so(runs):
    code, out, _ = runs[2]["long"]
    assert code == 0
    diff = [line for line in out.split("\n\n")[0].splitlines() if line.startswith("    ")]
    assert len(diff) == compare_runs.SETUP_DIFF_LINES + 1
    assert diff[-1] == "    [... diff cut: 64 more lines]"


CUT_TABLE = [  # (old, new, a shown line that must appear, text no shown line may hold)
    ("a\n", "a\r\n", "+a\\r", None),  # a \r shows: it does not vanish as a line break
    ("x", "x\u2028y", "+x\\u2028y", "\u2028"),
    ("x", "y" * 500, "+" + "y" * 199 + " [... 301 more characters]", "y" * 201),
    ("x", "\x9b31m", "+\\x9b31m", "\x9b"),
]


@pytest.mark.parametrize("old, new, shown, hidden", CUT_TABLE)
def test_bounded_diff_table(old, new, shown, hidden):
    item = compare_runs._text_change("instructions", old, new)
    assert shown in item["diff"]
    assert hidden is None or all(hidden not in line for line in item["diff"])


def test_texts_too_long_to_diff_are_hashed_only():
    limit = compare_runs.SETUP_DIFF_INPUT_LINES
    many = "\n".join(map(str, range(limit + 1)))
    item = compare_runs._text_change("instructions", many, many + "!")
    assert item["diff"] == [f"(too long to diff: over {limit:,} lines)"]
    assert item["what"].startswith("instructions: sha256 ")


UNSAFE = ("Cc", "Cf", "Cs", "Zl", "Zp")


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_a_shown_diff_is_bounded_and_holds_no_unsafe_character(old, new):
    lines = compare_runs._text_change("instructions", old, new)["diff"]
    assert len(lines) <= compare_runs.SETUP_DIFF_LINES + 1
    for line in lines:
        assert len(line) <= compare_runs.SETUP_LINE_CHARS + 40
        assert not any(unicodedata.category(char) in UNSAFE for char in line)


# ====================================================================== 22.2: every CAUTION

def test_every_caution_reaches_the_markdown_html_and_junit_reports(runs):
    folder, _, compared = runs
    code, out, err = compared["caution"]
    assert (code, err) == (0, "")
    cautions = lines_of(out, "CAUTION")
    assert [line.split()[1] for line in cautions] == ["sdk_version", "code_sha256"]
    md, html = (folder / "caution.md").read_text(), (folder / "caution.html").read_text()
    suites = ET.parse(folder / "caution.xml").getroot().iter("testsuite")
    system_out = [suite.find("system-out").text for suite in suites]
    assert system_out and all(line in text for text in system_out for line in cautions)
    for line in cautions:
        assert f"**CAUTION** {md_text(line[8:], 2000)}" in md
        assert f"<b>CAUTION</b> {xml_text(line[8:])}" in html
    assert "### Set-up that changed" in md and "Set-up that changed" in html  # the edit too


# ====================================================================== 21.13: vanished calls

MUTE = ("CAUTION after made no tool call ({model}: before called tools in {calls} of {rows} rows, "
        "after in none): did its server get the tools and return tool calls? A GAIN of a tool "
        "behaviour there (marked *) may come only from calling nothing")


def test_a_server_that_stopped_returning_tool_calls_is_a_caution_not_a_plain_gain(runs):
    folder, _, compared = runs
    code, out, err = compared["vanished"]
    assert (code, err) == (0, "")  # no row newly fails: the exit code stays the contract's
    assert lines_of(out, "GAIN") == [
        "GAIN           m  cancel  -forbidden_tool_called 3->0*  -invented_field 3->0*"]
    mute = [line for line in lines_of(out, "CAUTION") if "no tool call" in line]
    assert mute == [MUTE.format(model="m", calls=3, rows=6)]
    assert "CAUTION provider differs" in out and "  endpoint: openai http://127.0.0.1:" in out
    md, html = (folder / "vanished.md").read_text(), (folder / "vanished.html").read_text()
    system_out = ET.parse(folder / "vanished.xml").getroot().find("testsuite/system-out").text
    assert mute[0] in system_out and md.count("**CAUTION**") == html.count("<b>CAUTION</b>") == 2
    assert "forbidden_tool_called 3-&gt;0*, invented_field 3-&gt;0*" in md + html


def test_the_side_that_starts_calling_gets_a_caution_and_no_mark(runs):
    code, out, _ = runs[2]["appeared"]
    assert code == 0 and "*" not in out
    assert "CAUTION before made no tool call (m: after called tools in 3 of 6 rows, before in " \
        "none)" in out


def test_calls_made_only_to_tools_the_other_side_never_used_are_a_vanished_capability(runs):
    code, out, _ = runs[2]["other-tool"]
    assert code == 0
    assert lines_of(out, "GAIN") == [
        "GAIN           m  cancel  -forbidden_tool_called 3->0*  -invented_field 3->0*"]
    assert ("CAUTION after rows stopped calling the tools before rows called (m / cancel: "
            "cancel_order called in 3 of 3 rows, then in 0 of 3); a GAIN of a tool behaviour there "
            "(marked *)") in out


def test_one_model_of_two_that_stopped_calling_is_named(runs):
    (code, out, _), (matrix_code, matrix, _) = runs[2]["one-of-two"], runs[2]["one-of-two-matrix"]
    assert code == 0
    assert [line for line in lines_of(out, "CAUTION") if "tool call" in line] == [
        MUTE.format(model="y", calls=1, rows=2)]
    assert lines_of(out, "GAIN") == [
        "GAIN           y  cancel  -forbidden_tool_called 1->0*  -invented_field 1->0*"]
    assert matrix_code == 0
    assert "CAUTION B made no tool call (y: A called tools in 1 of 2 rows" in matrix
    model_x, model_y = matrix.split("model: y")
    assert re.search(r"^cancel +forbid_tool:cancel_order +FAIL +PASS +GAIN\*$", model_y, re.M)
    # it still does not ask for the id: no GAIN to mark
    assert re.search(r"^cancel +require_clarification:order_id +FAIL +FAIL +same$", model_y, re.M)
    assert "GAIN*" not in model_x  # model x still calls: its rows are unmarked
    assert "verdict: 0 REGRESS, 1 GAIN (1 marked *: may come only from calling nothing), 11 same" \
        in matrix


def test_models_and_matrix_models_mark_a_model_that_never_calls(runs):
    folder, _, compared = runs
    (code, out, _), (matrix_code, matrix, _), (back_code, back, _) = (
        compared[name] for name in ("swap", "swap-matrix", "swap-back"))
    assert code == 0
    assert "CAUTION y made no tool call (x -> y: x called tools in 1 of 2 rows, y in none)" in out
    assert lines_of(out, "GAIN") == [
        "GAIN           x -> y  cancel  -forbidden_tool_called 1->0*  -invented_field 1->0*"]
    assert "**CAUTION** y made no tool call" in (folder / "swap.md").read_text()
    assert matrix_code == 0 and matrix.count("GAIN*") == 1 and "1 GAIN (1 marked *" in matrix
    assert back_code == 0 and "*" not in back
    assert "CAUTION y made no tool call (y -> x: x called tools" in back


def test_the_reasons_a_call_causes_are_read_from_the_checker():
    assert compare_runs.call_reasons() == {"forbidden_tool_called", "invented_field",
                                           "no_final_answer", "system_leak", "too_many_tool_rounds"}


def _row(calls, reasons=()):
    return {"reasons": list(reasons), "passed": not reasons, "tool_calls": len(calls),
            "details": {"tool_calls": [{"name": name} for name in calls]} if calls else {}}


VANISH_TABLE = [  # (before rows' calls, after rows' calls, vanished)
    ([["t"]] * 3, [[]] * 3, True),
    ([["t"]] * 3, [["t"], [], []], True),  # two of three rows stopped calling
    ([["t"]] * 3, [["u"]] * 3, True),  # calls made, to no tool the other side used
    ([["t", "u"]] * 3, [["u"]] * 3, False),  # still calls one of its tools
    ([[]] * 3, [["t"]] * 3, False),  # started calling: not a vanished capability
    ([["t"], [], []], [["t"], [], []], False),
]


@pytest.mark.parametrize("before, after, expected", VANISH_TABLE)
def test_vanished_table(before, after, expected):
    change = compare_runs.call_change([_row(c) for c in before], [_row(c) for c in after])
    assert compare_runs.vanished(change) is expected


CALLS = st.lists(st.lists(st.sampled_from(["t", "u", "v"]), max_size=2), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(CALLS, CALLS, st.sampled_from(["forbidden_tool_called", "missing_required_text"]))
def test_a_gain_is_marked_exactly_when_it_is_a_call_caused_reason_without_the_calls(
        before, after, reason):
    """Rows that call one of the before side's tools fail `reason`; the others pass it. A GAIN
    then means fewer rows reached those tools: marked for a call-caused reason, never for text."""
    runs = min(len(before), len(after))
    tools = {name for calls in before[:runs] for name in calls}
    old = [_row(calls, [reason] if calls else []) for calls in before[:runs]]
    new = [_row(calls, [reason] if set(calls) & tools else []) for calls in after[:runs]]
    group = compare_runs.analyse([(("m", "c", n), a, b) for n, (a, b) in enumerate(zip(old, new))])
    group = group["groups"][0]
    marked = reason in group["gain"] and reason in compare_runs.call_reasons()
    assert group["no_call"] == ([reason] if marked else [])


# ====================================================================== 22.9: rough edges

def test_an_incomplete_record_is_named_by_its_file(runs):
    folder, _, compared = runs
    gone = json.loads((folder / "torn-gone.json").read_text())
    message = (f"NOT_COMPARABLE: torn-after.json: the run is incomplete: 1 of 6 rows missing "
               f"(first: {gone['model']} / {gone['case_id']} / repeat {gone['repeat']})\n")
    for name in ("torn-after", "torn-before", "torn-models", "torn-matrix"):
        assert compared[name] == (2, message, ""), name


def test_merge_of_shards_with_different_configs_names_the_key(runs):
    folder, (code, out, err), _ = runs
    assert (code, out) == (2, "")
    assert err == (f"regression.py: error: --merge: {folder / 'shard2.json'} differs from "
                   f'{folder / "shard1.json"} in config.cases["a"].input; only shards of one run '
                   "merge\n")
    assert not (folder / "merged.json").exists()


def test_label_lines_are_column_aligned(runs):
    code, out, _ = runs[2]["aligned"]
    assert code == 1
    rows = lines_of(out, "NEW_FAILURE")
    assert len(rows) == 2
    for column in ("repeat", "before=", "after="):
        assert len({line.index(column) for line in rows}) == 1, column
    regress = lines_of(out, "REGRESS")
    assert len(regress) == 2 and len({line.index("+missing") for line in regress}) == 1


CELL = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(CELL, min_size=3, max_size=3), min_size=1, max_size=6))
def test_aligned_starts_every_column_at_one_offset(rows):
    lines = compare_runs.aligned(rows)
    offset = 0
    for column in range(3):
        assert all(line[offset:].startswith(row[column]) and line[offset - 1:offset] in ("", " ")
                   for line, row in zip(lines, rows))
        offset += max(len(row[column]) for row in rows) + 2


def test_rerunning_the_demo_into_its_folder_is_one_line_exit_2_nothing_overwritten(runs):
    folder, _, compared = runs
    assert compared["demo-again"] == (2, "", (
        "compare_runs.py: error: --demo: offline-demo already exists; the demo writes only into a "
        "new folder, and nothing was written: give a new folder name\n"))
    files = {path.name: path.read_text() for path in (folder / "offline-demo").iterdir()}
    assert files == {"before.json": "mine", "after.json": "mine"}
