"""Records read back after any one edit, at any path of a real record (a row's response, rounds,
turns, details, verdicts, judgements, costs, errors; the header's config, suite, superseded rows,
shard, merged_from, judge_agreement): every reader (--report, --resume, --merge, --replay,
compare_runs.py) refuses it in one line with exit 2 or reads it, never a traceback, and never
shows a failing row passing without a CAUTION. Exit codes are pinned through the real CLI."""

import contextlib
import copy
import decimal
import io
import json
import pathlib
import re
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compare_runs
import fakes
import regression
from fakes import FakeServer
from testkit import ROOT, cli_env, played, read_record, run_main  # noqa: F401 (a fixture)

EXAMPLE = ROOT / "suites" / "agent-trajectories.json"
GUARDRAILS = ROOT / "suites" / "support-guardrails.json"
FIXTURE = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.just(10 ** 400)
                    | st.floats(allow_nan=False) | st.text(max_size=6)
                    | st.sampled_from(["[REDACTED]", "PASS", "1/2", "0.1", "\u202e", "m"]),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=5)


def paths(value, at=()):
    """Every path into a JSON value, the value's own () first."""
    yield at
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from paths(inner, (*at, key))


def texts(value):
    """The record's own strings: model names, case ids, tool names, answers."""
    if isinstance(value, str):
        yield value
    for inner in (value.values() if isinstance(value, dict) else
                  value if isinstance(value, list) else ()):
        yield from texts(inner)


@st.composite
def edited(draw, record):
    """(record with one edit, what was done): a value set, a key deleted, or one added."""
    record = copy.deepcopy(record)
    path = draw(st.sampled_from([path for path in paths(record) if path]))
    parent = record
    for step in path[:-1]:
        parent = parent[step]
    value = draw(JSON | st.sampled_from(sorted({t for t in texts(record) if len(t) < 40})))
    how = draw(st.sampled_from(["set", "delete", "add"]))
    if how == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif how == "add" and isinstance(parent[path[-1]], list):
        parent[path[-1]].append(value)
    elif how == "add" and isinstance(parent[path[-1]], dict):
        parent[path[-1]][draw(st.sampled_from(["passed", "error", "x", "response"]))] = value
    else:
        parent[path[-1]] = value
    return record, f"{how} {path} {value!r:.60}"


def call(main, argv):
    """(exit code, stdout + stderr) of main(argv) in-process; a traceback fails the test."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            code = main([str(arg) for arg in argv])
    except SystemExit as exc:
        code = exc.code
    finally:
        regression.release_record()
    return code, said.getvalue()


def junit_cases(text):
    """{(model, case, repeat): 'pass' | 'failure' | 'error' | 'skipped'} of a JUnit report."""
    found = {}
    for suite, body in re.findall(r'<testsuite name="([^"]*)"(.*?)</testsuite>', text, re.S):
        for case, repeat, inner in re.findall(
                r'<testcase [^>]*name="(\S+) \[repeat (\d+)\]"[^>]*>(.*?)</testcase>', body, re.S):
            kind = re.search(r"<(failure|error|skipped)\b", inner)
            found[(suite, case, int(repeat))] = kind.group(1) if kind else "pass"
    return found


def failing(record):
    return {regression.row_key(row) for row in record["runs"] if row.get("passed") is not True}


def refused_in_one_line(code, said):
    lines = said.strip().splitlines()
    return code == 2 and len(lines) == 1 and "Traceback" not in said


# ------------------------------------------------------------ rows outside the config's plan

def test_a_row_outside_the_plan_is_refused_not_dropped_from_the_junit_report(played, tmp_path):
    """config.models without the failing model: its rows were left out of the JUnit report, which
    said 3 tests, 0 failures, 0 errors (a CI gate reading it passed) while the record held three
    failing rows. Now every reader refuses the record in one line, exit 2."""
    record = copy.deepcopy(played)
    record["config"]["models"] = ["refund-correct"]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    said = ("is not a usable agent-regression record: runs[1] (refund-claims / "
            "refund-shipped-order / repeat 0) is not in the config's models x cases x repeats")
    runs = [(["--report", path, "--junit", tmp_path / "r.xml"], tmp_path),
            (["--resume", path], tmp_path),
            (["--provider", "replay", "--replay", path, "--suite", EXAMPLE, "--out", "o.json"],
             tmp_path)]
    for code, out, err in fakes.cli_table(runs, env=cli_env()):
        assert (code, out, "Traceback" in err) == (2, "", False), err
        assert err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "r.xml").exists() and not (tmp_path / "o.json").exists()
    assert read_record(path) == record  # --resume left it as it was


@pytest.mark.parametrize("edit", ["repeat", "case_id", "model"])
def test_a_row_key_outside_the_plan_is_named(played, edit):
    record = copy.deepcopy(played)
    record["runs"][3][edit] = 5 if edit == "repeat" else "other"
    assert regression.record_problem(record, evidence=False) == (
        f"runs[3] ({regression.key_text(regression.row_key(record['runs'][3]))}) is not in the "
        "config's models x cases x repeats")


def test_a_shard_whose_rows_are_another_shards_is_refused(tmp_path):
    """A shard 1/2 record edited to say 2/2: its JUnit report walked shard 2's rows, all 'not
    run', and dropped the three failing rows it holds (0 failures, 4 skipped)."""
    assert run_main(["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "m2",
                     "--shard", "1/2", "--out", tmp_path / "s.json"]) == 1
    record = {**read_record(tmp_path / "s.json"), "shard": "2/2"}
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    assert call(regression.main, ["--report", path, "--junit", tmp_path / "r.xml"]) == (
        2, f"regression.py: error: --report: {path} is not a usable agent-regression record: "
        "runs[0] (m / refund-policy / repeat 0) is not in the config's models x cases x repeats "
        "(shard 2/2)\n")


# ------------------------------------------------------------ an error that reads as none

def test_an_empty_error_name_is_refused_not_shown_as_pass(tmp_path):
    """A row that failed with HTTP 400, its error name edited to "": the HTML report said
    "m / refund-policy / repeat 0: PASS" (the reports ask whether the error is truthy, the
    verdict whether it is there). Now every reader refuses it: exit 2 and one line, no report
    written."""
    with FakeServer(fakes.failing(400)) as server:
        assert run_main(["--suite", GUARDRAILS, "--provider", "openai", "--base-url",
                         server.url + "/v1", "--models", "m", "--out", tmp_path / "e.json"]) == 2
    record = read_record(tmp_path / "e.json")
    assert record["runs"][0]["error"] == "HTTPError"
    record["runs"][0]["error"] = ""
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    said = "is not a usable agent-regression record: runs[0].error is not the name of an error"
    runs = [(["--report", path, "--html", tmp_path / "r.html"], tmp_path)]
    (code, out, err), = fakes.cli_table(runs, env=cli_env())
    assert (code, out, err.count("\n"), said in err) == (2, "", 1, True), err
    assert not (tmp_path / "r.html").exists()
    assert call(compare_runs.main, [tmp_path / "e.json", path]) == (
        2, f"NOT_COMPARABLE: {path} is not a usable record: runs[0].error is not the name of an "
        "error\n")


# ------------------------------------------------------------ damage mid-file is no tear

@pytest.mark.parametrize("damage, said", [
    (b'"repeat": ' + b"9" * 5000, "Exceeds the limit (4300 digits) for integer string conversion"),
    (b'"repeat": \xff', "byte {at} is not UTF-8 (invalid start byte)")], ids=["number", "byte"])
def test_a_row_damaged_mid_file_is_refused_not_read_as_torn(tmp_path, damage, said):
    """A number of 5,000 digits (json.loads refuses it), or a byte that is not UTF-8, in row 3 of
    8 was read as a crash's torn tail: rows 3 to 8 were dropped, and --resume rewrote the record
    without them, ran them again (paid again with a paid provider) and exited 1 as if nothing
    was wrong. Now it is not a JSON record: exit 2, one line, the file as it was. A real tear (the
    file cut inside its last row, or inside a character) still recovers."""
    path = tmp_path / "run.json"
    assert run_main(["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "m2",
                     "--out", path]) == 1
    data = path.read_bytes()
    starts = [match.start() for match in re.finditer(b"\n{", data)]
    third = data.index(b'"repeat": 0', starts[2])
    assert third < starts[3]
    damaged = data[:third] + damage + data[third + len(b'"repeat": 0'):]
    path.write_bytes(damaged)
    (code, out, err), = fakes.cli_table([(["--resume", path], tmp_path)], env=cli_env())
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert err.startswith(f"regression.py: error: --resume: {path} is not a JSON record: "
                          + said.format(at=third + len(b'"repeat": '))), err
    assert path.read_bytes() == damaged
    torn = regression.load_record(_written(tmp_path / "torn.json", data[:starts[-1] + 9]))
    assert (len(torn["runs"]), torn["recovered"]) == (len(starts) - 1, True)
    cut = data[:starts[-1] + 9] + "\u00e9".encode("utf-8")[:1]
    assert len(regression.load_record(_written(tmp_path / "cut.json", cut))["runs"]) == 7


@pytest.mark.parametrize("where", [0, 3], ids=["before-row-1", "after-row-3"])
def test_the_rows_closed_early_are_refused_not_read_as_torn(written, tmp_path, where):
    """The line break before row 1, or the comma after row 3, replaced by "]": load_record read
    the rows before it and the text after it as a torn summary, so every later row was lost
    (--resume kept 0 or 3 rows of 8, rewrote the record without the rest and ran them again)."""
    at = [match.start() for match in re.finditer(b"\n{", written)][where] - (where > 0)
    path = _written(tmp_path / "run.json", written[:at] + b"]" + written[at + 1:])
    damaged = path.read_bytes()
    code, said = call(regression.main, ["--resume", path])
    assert (code, said.count("\n")) == (2, 1), said
    assert said.startswith(f"regression.py: error: --resume: {path} is not a JSON record: "
                           "Expecting ',' delimiter: line "), said
    assert path.read_bytes() == damaged


def _written(path, data):
    path.write_bytes(data)
    return path


# ------------------------------------------------------------ no cost is below zero

def test_a_negative_cost_does_not_lower_the_spend_a_resume_starts_from(tmp_path):
    """A played record that spent $0.0009, one row's cost_usd edited to "-1" and another row's
    response deleted: --resume --max-cost-usd 0.0005 counted the record as $-0.9992 spent and
    sent the row again, past the cap. Now a cost below zero is no amount (unknown), so the cap
    cannot be enforced and nothing is sent: exit 2."""
    with FakeServer(fakes.refund_agent()) as server:
        out = tmp_path / "run.json"
        assert run_main(["--suite", EXAMPLE, "--provider", "openai", "--base-url",
                         server.url + "/v1", "--models", "refund-correct", "refund-claims",
                         "--out", out]) == 1
        record, sent = read_record(out), len(server.requests)
        assert sum(map(decimal.Decimal, (row["cost_usd"] for row in record["runs"]))) == \
            decimal.Decimal("0.0009")
        record["runs"][0]["cost_usd"] = "-1"
        del record["runs"][1]["response"]
        edited = tmp_path / "edited.json"
        edited.write_text(json.dumps(record), encoding="utf-8")
        (code, _, err), = fakes.cli_table([(["--resume", edited, "--max-cost-usd", "0.0005"],
                                            tmp_path)], env=cli_env())
        assert (code, len(server.requests) - sent, "Traceback" in err) == (2, 0, False), err
    assert regression._amount("-1") is None and regression._amount("-0") == 0


# ------------------------------------------------------------ any one edit: read or refused

@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=FIXTURE)
@given(data=st.data())
def test_report_of_any_edit_is_refused_or_keeps_every_failure(played, tmp_path, data):
    """--report of a record with one edit anywhere: one line and exit 2, or a JUnit report in
    which no row that failed reads as a pass, unless a CAUTION says its grade changed."""
    record, how = data.draw(edited(played))
    folder = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "run.json").write_text(json.dumps(record), encoding="utf-8")
    code, said = call(regression.main, ["--report", folder / "run.json",
                                        "--junit", folder / "r.xml"])
    if code == 2:
        assert refused_in_one_line(code, said), (how, said)
        return
    assert code == 0, (how, said)
    cases = junit_cases((folder / "r.xml").read_text(encoding="utf-8"))
    passing = {key for key in failing(played) if cases.get(key, "pass") == "pass"}
    assert not passing or "CAUTION" in said, (how, passing, said)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=FIXTURE)
@given(data=st.data())
def test_compare_of_any_edit_is_refused_or_keeps_every_failure(played, tmp_path, data):
    """compare_runs.py BEFORE EDITED --all and --models: NOT_COMPARABLE in one line (exit 2), or
    no row that failed reads as passing after, and the swap to the failing model still fails,
    unless a CAUTION the unedited record does not give says why."""
    record, how = data.draw(edited(played))
    folder = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    before, after = folder / "before.json", folder / "after.json"
    before.write_text(json.dumps(played), encoding="utf-8")
    after.write_text(json.dumps(record), encoding="utf-8")
    code, said = call(compare_runs.main, [before, after, "--all"])
    if code == 2:
        assert refused_in_one_line(code, said), (how, said)
    else:
        shown = {tuple(line.split()[1:3]) for line in said.splitlines()
                 if line.startswith(("PASS ", "FIXED ", "RECOVERED "))}
        passing = {key for key in failing(played) if key[:2] in shown}
        assert code in (0, 1) and (not passing or "CAUTION" in said), (how, passing, said)
    base = call(compare_runs.main, ["--models", "refund-correct", "refund-claims", before])[1]
    code, said = call(compare_runs.main, ["--models", "refund-correct", "refund-claims", after])
    new = [line for line in said.splitlines() if "CAUTION" in line and line not in base]
    assert code == 1 or refused_in_one_line(code, said) or new, (how, code, said)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Both shards of an echo run of two models: 3 of each model's 4 rows fail."""
    folder = tmp_path_factory.mktemp("shards")
    for number in (1, 2):
        assert run_main(["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "m2",
                         "--shard", f"{number}/2", "--out", folder / f"s{number}.json"]) == 1
    return [read_record(folder / f"s{number}.json") for number in (1, 2)]


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=FIXTURE)
@given(data=st.data())
def test_merge_resume_and_replay_of_any_edit_never_pass(shards, tmp_path, data):
    """Shard 1 with one edit, merged with shard 2, resumed, and replayed: each exits 1 or 2 (the
    echo answers fail 3 cases of each model, so no edit may turn either run into a pass), and a
    refusal before anything is written is one line."""
    record, how = data.draw(edited(shards[0]))
    folder = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))
    for name, value in (("s1.json", record), ("s2.json", shards[1]), ("r.json", record)):
        (folder / name).write_text(json.dumps(value), encoding="utf-8")
    runs = [(["--merge", folder / "out.json", folder / "s1.json", folder / "s2.json"], "out.json"),
            (["--resume", folder / "r.json"], "r.json"),
            (["--provider", "replay", "--replay", folder / "s1.json", "--suite", GUARDRAILS,
              "--out", folder / "replay.json"], "replay.json")]
    for argv, out in runs:
        code, said = call(regression.main, [*argv, "--quiet"])
        path = folder / out
        written = path.exists() and (out != "r.json" or json.loads(path.read_text()) != record)
        assert code == 1 or refused_in_one_line(code, said) or code == 2 and written, (
            how, argv[0], code, said)


# ------------------------------------------------------------ any byte: a tear or a refusal

@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The bytes of a record as the writer leaves them (8 echo rows, each on a line of its own)."""
    path = tmp_path_factory.mktemp("written") / "run.json"
    assert run_main(["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "m2",
                     "--out", path]) == 1
    return path.read_bytes()


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=FIXTURE)
@given(data=st.data())
def test_a_changed_or_cut_byte_loses_no_row_but_a_torn_last_one(written, tmp_path, data):
    """A record with one byte replaced, deleted or the file cut there: load_record refuses it in
    one line (RecordError), or reads it; read as torn (recovered), it keeps every row but one
    the change falls in at the tail, as a crash's tear does. Never fewer: a --resume would
    rewrite the record without them."""
    at = data.draw(st.integers(written.index(b'"runs": [') + 9, len(written) - 1))
    byte = data.draw(st.sampled_from([b"", b"]", b"}", b",", b"\xff", b"\xc3", b"x", b"\n", b"9"]))
    cut = data.draw(st.booleans())
    damaged = written[:at] + (b"" if cut else byte + written[at + 1:])
    path = tmp_path / f"d{at}.json"
    path.write_bytes(damaged)
    try:
        record = regression.load_record(path)
    except regression.RecordError as exc:
        assert "\n" not in str(exc)
        return
    starts = [match.start() for match in re.finditer(b"\n{", written)]
    ends = [*(start - 1 for start in starts[1:]), written.index(b"\n]", starts[-1])]  # "}" + 1
    if record.get("recovered"):  # a cut keeps the rows it left whole; a change, all but a last one
        kept, whole = len(record["runs"]), sum(end <= at for end in ends)
        changed = kept == len(starts) or kept == whole >= len(starts) - 1
        assert kept == whole if cut else changed, (at, byte, cut, kept)


def test_a_row_the_writer_left_half_over_the_old_tail_is_a_tear(written, tmp_path):
    """The writer appends a row by writing it and the summary over the old summary: killed after
    part of that write, the file holds the new row's start, then the rest of the old summary.
    Cut anywhere, that is a tear: the 7 rows before it are kept, and the record is not refused."""
    starts = [match.start() for match in re.finditer(b"\n{", written)]
    tail = written[written.index(b"\n]", starts[-1]):]
    before = written[:starts[-1] - 1] + tail.replace(b'"rows": 8', b'"rows": 7') + b" " * 40
    for cut in range(starts[-1] - 1, len(written) - 40, 7):
        record = regression.load_record(_written(tmp_path / "r.json", written[:cut] + before[cut:]))
        assert len(record["runs"]) >= 7, cut


# ------------------------------------------------------------ one row key twice

def _twice(played, first):
    """The played record with a passing copy of a failing row: refund-correct's answer to the
    case relabelled as refund-claims' (each copy an honest row of its own), appended or first."""
    record = copy.deepcopy(played)
    failing_row = next(row for row in record["runs"] if row["passed"] is False)
    copy_ = dict(next(row for row in record["runs"] if row["passed"] is True
                      and row["case_id"] == failing_row["case_id"]), model=failing_row["model"])
    at = record["runs"].index(failing_row)
    record["runs"] = [copy_, *record["runs"]] if first else [*record["runs"], copy_]
    key = regression.key_text(regression.row_key(failing_row))
    positions = (0, at + 1) if first else (at, len(record["runs"]) - 1)
    return record, (f"runs[{positions[1]}] holds {key} again (as runs[{positions[0]}] does); a "
                    "record holds each model, case and repeat once, so which verdict counts is "
                    "not clear")


@pytest.mark.parametrize("first", [False, True], ids=["appended", "first"])
def test_a_record_holding_one_row_key_twice_is_refused_by_every_reader(played, tmp_path, first):
    """Two honest rows of one key (a failing row and a passing copy): --report exited 0 with
    JUnit failures="0", --resume kept the first copy and moved the failing finished row to
    superseded (PASS, then RECOVERED in compare), --replay used the last copy. Now every reader
    (report, resume, replay, a replay that rebaselines, merge, compare either side) refuses it
    in one line naming both positions, exit 2, writing nothing and leaving the record as it was."""
    record, said = _twice(played, first)
    path, honest = tmp_path / "twice.json", tmp_path / "honest.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    honest.write_text(json.dumps(played), encoding="utf-8")
    suite = tmp_path / "suite.json"
    suite.write_bytes(EXAMPLE.read_bytes())
    replay = ["--provider", "replay", "--replay", path, "--suite"]
    runs = [["--report", path, "--junit", "r.xml", "--markdown", "r.md", "--html", "r.html"],
            ["--resume", path], [*replay, EXAMPLE, "--out", "o.json"],
            [*replay, suite, "--update-baseline", "--out", "b.json"],
            ["--merge", "m.json", path]]
    table = fakes.cli_table([(argv, tmp_path) for argv in runs], env=cli_env())
    table += fakes.cli_table([([path, honest], tmp_path), ([honest, path], tmp_path)],
                             env=cli_env(), script="compare_runs.py")
    for argv, (code, out, err) in zip([*runs, ["compare"], ["compare"]], table):
        told = out + err  # compare says NOT_COMPARABLE on stdout
        assert (code, told.count("\n"), said in told, "Traceback" in told) == (2, 1, True, False), (
            argv[0], told)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["honest.json", "suite.json",
                                                          "twice.json"]
    assert read_record(path) == record and suite.read_bytes() == EXAMPLE.read_bytes()
    assert regression.record_problem(record, evidence=False) == said  # --resume asks so too
    # the control: the honest record reads, every failure in its report
    assert call(regression.main, ["--report", honest, "--junit", tmp_path / "h.xml"])[0] == 0
    cases = junit_cases((tmp_path / "h.xml").read_text(encoding="utf-8"))
    assert {key for key, kind in cases.items() if kind == "failure"} == failing(played)


# ------------------------------------------------------------ every way the tool ends a played row

LOOKUP = {"type": "function", "function": {
    "name": "lookup_order", "description": "look",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}
# {how the play loop ends a row: (the suite's keys, round -> the model's calls, the reason)}: every
# stop round_end gives, so a bound added without a way to replay it fails the test below
STOPS = {
    "answered": ({}, lambda number: [], None),
    "max_rounds": ({"max_rounds": 2}, lambda number: [("lookup_order", {"order_id": "1"})],
                   "no_final_answer"),
    "max_calls_per_round": ({"max_calls_per_round": 1},
                            lambda number: [("lookup_order", {"order_id": "1"})] * 2,
                            "too_many_tool_calls"),
    # two rounds of 3,000 bytes each way pass 10,000 in round 2: counted over the stored rounds
    "max_row_bytes": ({"max_row_bytes": 10_000},
                      lambda number: [("lookup_order", {"order_id": "x" * 3000})],
                      "row_too_large"),
    # a round whose response did not complete (finish_reason length): its calls are not run
    "cut_short": ({}, lambda number: [("lookup_order", {"order_id": "1"})], "response_not_completed"),
}


def test_every_stop_the_play_loop_has_is_enumerated_here():
    """The stops of STOPS are the play loop's: its answer, max_rounds, every PLAYED_BOUNDS key and
    a round cut short, and their reasons the no_final_answer check's and check_completed's. A new
    bound fails here until it is added."""
    check = next(check for check in regression.CHECK_TABLE if check.name == "no_final_answer")
    assert set(STOPS) == {"answered", "cut_short", *regression.PLAYED_SUITE_KEYS}
    assert {reason for _, _, reason in STOPS.values()} - {None} == \
        {*check.reasons, "response_not_completed"}


def _stopping_agent(calls, finish=None):
    """A chat endpoint whose model makes calls(round) in each round of turn or input "s one" (and
    of a plain played input "go"; a response ending `finish`), then answers "ok"; every other turn
    it answers "ok"."""
    def answer(body):
        messages = body["messages"]
        last = max(n for n, message in enumerate(messages) if message["role"] == "user")
        number = 1 + sum(message["role"] == "assistant" for message in messages[last:])
        made = calls(number) if messages[last]["content"] in ("s one", "go") else []
        return fakes.chat_response(None if made else "ok", tool_calls=made, cost=0.001,
                                   finish_reason=finish if made else None)
    return fakes.chat(answer)


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_a_row_the_tool_ended_is_reported_compared_replayed_and_resumed(tmp_path, stop):
    """A played row and a conversation turn ended by a suite bound (max_calls_per_round,
    max_row_bytes) made the honest record unreadable: --report exit 2 ("it ended after round 1
    (its max_rounds then), but the suite now plays on"), compare NOT_COMPARABLE, replay exit 2,
    and a torn copy's --resume refused, so every paid row was paid again. Now every stop of the
    play loop is replayed as it was: report, compare, replay and the resume of a torn copy
    (keeping both finished rows) read it; the same record under a suite that would play on is
    still refused."""
    keys, calls, reason = STOPS[stop]
    data = {"name": "stops", "instructions": "Support agent.", "tools": [LOOKUP], **keys,
            "cases": [{"id": "played", "input": "go", "contains": ["ok"],
                       "tool_results": {"lookup_order": {"ok": True}}},
                      {"id": "conv", "turns": ["s one", "s two"], "contains": ["ok"],
                       "tool_results": {"lookup_order": {"ok": True}}},
                      {"id": "tail", "input": "plain", "contains": ["ok"]}]}
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(data), encoding="utf-8")
    code = 0 if reason is None else 1
    with FakeServer(_stopping_agent(calls, "length" if stop == "cut_short" else None)) as server:
        live = ["--suite", suite, "--provider", "openai", "--base-url", server.url + "/v1",
                "--models", "m", "--quiet"]
        (ran, _, err), = fakes.cli_table([([*live, "--out", "run.json"], tmp_path)],
                                         env=cli_env())
        assert ran == code, err
        record = read_record(tmp_path / "run.json")
        played_row, conv = record["runs"][:2]
        assert reason is None or reason in played_row["reasons"] and reason in conv["reasons"]
        assert len(conv["turns"]) == (2 if reason is None else 1)  # a stopped turn ends it
        text = (tmp_path / "run.json").read_bytes()
        (tmp_path / "torn.json").write_bytes(text[:text.rindex(b"\n{") + 60])
        (tmp_path / "copy.json").write_bytes(text)
        replay = ["--provider", "replay", "--replay", tmp_path / "run.json", "--quiet"]
        runs = [(["--report", "run.json", "--junit", "r.xml"], 0), (["--resume", "torn.json"], code),
                ([*replay, "--out", "replayed.json"], code)]
        table = fakes.cli_table([(argv, tmp_path) for argv, _ in runs], env=cli_env())
    for (argv, want), (got, out, err) in zip(runs, table):
        assert got == want, (argv[0], out, err)
    assert read_record(tmp_path / "torn.json")["resumed"][0]["kept_rows"] == 2  # none paid again
    failures = {key[1] for key, kind in junit_cases((tmp_path / "r.xml").read_text()).items()
                if kind == "failure"}
    assert failures == (set() if reason is None else {"played", "conv"})
    for after in ("copy.json", "replayed.json", "torn.json"):
        said = call(compare_runs.main, [tmp_path / "run.json", tmp_path / after])
        assert said[0] == 0, (after, said)
    if keys:  # the control: a suite that would play on past the stop is refused
        longer = {**data, **{key: regression.PLAYED_BOUNDS.get(key, (8,))[0] for key in keys}}
        suite.write_text(json.dumps(longer), encoding="utf-8")
        said = call(regression.main, [*replay, "--suite", suite, "--out", tmp_path / "again.json"])
        assert said[0] == 2 and "but the suite now plays on" in said[1], said


def test_a_replay_graded_on_the_tool_results_as_recorded_is_reported_compared_and_resumed(
        tmp_path):
    """--replay --allow-changed-tool-results under a suite whose tool_results changed wrote a
    record that --report and compare then refused (its stored results are not its suite's). It
    says it holds the results as recorded: its readers grade it so, a CAUTION saying it, and it
    compares with the record it replayed as a REGRADE. A live record with the same results is
    still refused (the control)."""
    def suite_of(day):
        return {"name": "as-recorded", "instructions": "State only facts a tool gave you.",
                "tools": [LOOKUP], "cases": [{
                    "id": "ship", "input": "go", "behaviors": ["grounded"],
                    "tool_results": {"lookup_order": {"shipped_on": f"2026-11-{day}"}}}]}
    for day in (20, 21):
        (tmp_path / f"s{day}.json").write_text(json.dumps(suite_of(day)), encoding="utf-8")

    def answer(body):
        told = body["messages"][-1]["role"] == "tool"
        return fakes.chat_response("It shipped on 2026-11-20." if told else None,
                                   tool_calls=[] if told else [("lookup_order", {})], cost=0.001)
    with FakeServer(fakes.chat(answer)) as server:
        assert run_main(["--suite", tmp_path / "s20.json", "--provider", "openai", "--base-url",
                         server.url + "/v1", "--models", "m", "--out", tmp_path / "run.json",
                         "--quiet"]) == 0
    replay = ["--provider", "replay", "--replay", "run.json", "--suite", "s21.json", "--quiet"]
    caution = "replayed with --allow-changed-tool-results: graded on the tool results"
    runs = [([*replay, "--out", "no.json"], 2),
            ([*replay, "--allow-changed-tool-results", "--out", "rep.json"], 0),
            (["--report", "rep.json", "--markdown", "rep.md"], 0), (["--resume", "rep.json"], 0)]
    table = fakes.cli_table([(argv, tmp_path) for argv, _ in runs], env=cli_env())
    for (argv, want), (code, out, err) in zip(runs, table):
        assert code == want and "Traceback" not in err, (argv, out, err)
    assert "but the suite now answers" in table[0][2] and caution in table[2][2]
    assert caution in (tmp_path / "rep.md").read_text(encoding="utf-8")
    code, said = call(compare_runs.main, [tmp_path / "run.json", tmp_path / "rep.json"])
    assert code == 0 and "REGRADE" in said and caution in said, said
    # the control: the same stored conversation in a record that is no such replay is refused
    live = {key: value for key, value in read_record(tmp_path / "rep.json").items()
            if key != "replayed_from"}
    (tmp_path / "live.json").write_text(json.dumps(live), encoding="utf-8")
    code, said = call(regression.main, ["--report", tmp_path / "live.json", "--html",
                                        tmp_path / "live.html"])
    assert code == 2 and "its stored conversation is not one its suite plays" in said, said


# ================================================ max_row_bytes counted on what the row stores

LONG_EMAIL = "averyveryverylongaddress.name@subdomain.example-company.com"
ECHOED_KEY = "sk-test-" + "k" * 52  # long enough to be masked


@pytest.mark.parametrize("said, flags, env, rounds", [
    (" " + LONG_EMAIL, ["--redact-pii"], {}, 2),  # masked: round 1 is under the bound as stored
    # an endpoint echoing the key it is sent: the key is masked without any --redact flag
    (" " + ECHOED_KEY, ["--api-key-env", "AGENT_KEY"], {"AGENT_KEY": ECHOED_KEY}, 2),
    (" " + LONG_EMAIL, [], {}, 1),  # the control: nothing masked, the bound as it always was
    (" " + ECHOED_KEY, [], {}, 1)])  # the control: that key is not sent, so it is no secret
def test_a_row_stopped_by_max_row_bytes_stops_so_again_when_its_masked_record_is_read(
        tmp_path, said, flags, env, rounds):
    """max_row_bytes counted the response as it came, a replay the response as stored (masked):
    a row row_too_large after round 1 was under the bound when replayed, "the suite now plays
    on", so --report, compare of the record with its own copy and a torn copy's --resume exited
    2 and the paid record was lost. It bounds what a row makes the record store: it is counted
    on the masked form, live and replayed alike."""
    def answer(body):
        return fakes.chat_response(None, tool_calls=[
            ("lookup_order", {"order_id": "x" * 4600 + said * 5})], cost=0.001)
    data = {"name": "b", "instructions": "Agent.", "tools": [LOOKUP], "max_row_bytes": 10_000,
            "cases": [{"id": "played", "input": "go", "contains": ["ok"],
                       "tool_results": {"lookup_order": {"ok": True}}},
                      {"id": "tail", "input": "plain", "contains": ["ok"]}]}
    (tmp_path / "suite.json").write_text(json.dumps(data), encoding="utf-8")
    environ = cli_env(**env)
    with FakeServer(fakes.chat(answer)) as server:
        live = ["--suite", "suite.json", "--provider", "openai", "--base-url",
                server.url + "/v1", "--models", "m", "--quiet", *flags]
        ((ran, _, err),) = fakes.cli_table([([*live, "--out", "run.json"], tmp_path)], environ)
        assert ran == 1, err
        text = (tmp_path / "run.json").read_bytes()
        row = read_record(tmp_path / "run.json")["runs"][0]
        assert "row_too_large" in row["reasons"] and len(row["rounds"]) == rounds, row["reasons"]
        assert ECHOED_KEY.encode() not in text or not env
        (tmp_path / "torn.json").write_bytes(text[:text.rindex(b"\n{") + 60])
        (tmp_path / "copy.json").write_bytes(text)
        table = fakes.cli_table([(["--report", "run.json", "--markdown", "r.md"], tmp_path),
                                 (["--resume", "torn.json", *flags], tmp_path)], environ)
    assert [code for code, _, _ in table] == [0, 1], table
    assert "CAUTION" not in "".join(out + err for _, out, err in table)
    assert read_record(tmp_path / "torn.json")["resumed"][0]["kept_rows"] == 1  # not paid again
    for other in ("copy.json", "torn.json"):
        code, said_ = call(compare_runs.main, [tmp_path / "run.json", tmp_path / other])
        assert code == 0 and "CAUTION" not in said_, (other, said_)
