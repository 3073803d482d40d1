"""Offline tests of the comparison analysis and the reports (SPEC A9, B5, C3 "HTML report").

Comparison: per-check matrix (REGRESS / GAIN), pass rates with the one-sided Fisher exact
p-value, --alpha, model swap, answer diffs. Reports: JUnit, Markdown and HTML from one run
(regression.py --report) and from a comparison (compare_runs.py --junit/--markdown/--html),
their file modes and the never-overwrite rule, and the HTML page opened in a real headless
Chromium next to a loopback server that records any request the page makes.
"""

import contextlib
import fractions
import html.parser
import http.server
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import xml.etree.ElementTree as ET

import pytest

import compare_runs
import fakes
import regression

HERE = pathlib.Path(__file__).resolve().parent
REGRESSION = HERE / "regression.py"
COMPARE = HERE / "compare_runs.py"
CHROMIUM = "/usr/bin/chromium"
LABELS = ("NEW_FAILURE", "RECOVERED", "PASS", "STILL_FAILING")


# ====================================================================== helpers

@pytest.fixture(autouse=True)
def _no_environment_twins(monkeypatch):
    """regression.main reads REGRESSION_* twins of its flags; a developer's shell must not leak in."""
    for name in list(os.environ):
        if name.startswith("REGRESSION_") or name == "OPENAI_BASE_URL":
            monkeypatch.delenv(name)


def make_row(model, case_id, repeat=0, reasons=(), answer="answer", error=None, **extra):
    reasons = list(reasons)
    row = {"case_id": case_id, "model": model, "repeat": repeat, "error": error, "error_status": None,
           "cost_usd": "0.001", "response": {"status": "completed"}, "answer_text": answer,
           "reasons": reasons, "seconds": 0.25, "passed": error is None and not reasons}
    row.update(extra)
    return row


def make_config(models, case_ids, repeats):
    return {"models": list(models), "cases": [{"id": case_id} for case_id in case_ids],
            "instructions": "Be careful.", "repeats": repeats}


def make_record(models, case_ids, repeats=1, reasons=None, answers=None, rows=None, **top):
    """A record; by default complete, `reasons` and `answers` keyed by (model, case_id, repeat)."""
    reasons, answers = reasons or {}, answers or {}
    config = make_config(models, case_ids, repeats)
    if rows is None:
        rows = [make_row(m, c, r, reasons.get((m, c, r), ()), answers.get((m, c, r), "answer"))
                for m, c, r in regression.plan_rows(models, case_ids, repeats)]
    record = {"created_at": "2024-01-01T00:00:00+00:00", "config": config, "sdk_version": "0.43.5",
              "code_sha256": "0" * 64, "runs": rows,
              "summary": regression.summary(rows, models, repeats, config["cases"])}
    record.update(top)
    return record


def write_json(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def pairs_of(before_reasons, after_reasons, model="m", case_id="c"):
    """analyse() input for one (model, case): reason lists per repeat, before and after."""
    return [((model, case_id, repeat), make_row(model, case_id, repeat, old), make_row(model, case_id, repeat, new))
            for repeat, (old, new) in enumerate(zip(before_reasons, after_reasons))]


# the columns are aligned: cells two or more spaces apart
A9_LINE = re.compile(r"^(NEW_FAILURE|RECOVERED|PASS|STILL_FAILING)\s+(.+?) {2,}(\S+) {2,}"
                     r"repeat (\d+) {2,}before=(\[.*?\]) {2,}after=(\[.*\])$")


def key_lines(output):
    """{(model, case, repeat): (label, before, after)} from the SPEC A9 lines of a comparison."""
    found = {}
    for line in output.splitlines():
        match = A9_LINE.match(line)
        if match:
            label, model, case_id, repeat, before, after = match.groups()
            key = (model, case_id, int(repeat))
            assert key not in found, f"two lines for {key}"
            found[key] = (label, json.loads(before), json.loads(after))
    return found


def script_env():
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("REGRESSION_", "PERPLEXITY", "OPENAI")) and "proxy" not in name.lower()}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_script(script, *args, cwd):
    """`python SCRIPT ARGS`, forked from a zygote that paid the SDK import once (fakes.run_script):
    the real CLI; the tests that need a cold start or the caller's umask run their own child."""
    return fakes.run_script(args, cwd, script_env(), timeout=60, script=str(script))


@contextlib.contextmanager
def umask(value):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# ====================================================================== 1. per-check matrix

MATRIX_BEFORE = {("m1", "c1", 0): ["wrong_code"], ("m1", "c1", 1): ["wrong_code", "missing_citation"],
                 ("m2", "c1", 0): ["too_long"], ("m2", "c2", 1): ["wrong_action"]}
MATRIX_AFTER = {("m1", "c1", 0): ["forbidden_text"], ("m2", "c1", 1): ["too_long"],
                ("m2", "c2", 0): ["wrong_action"], ("m2", "c2", 1): ["wrong_action"]}


def test_matrix_regress_and_gain_lines(capsys):
    before = make_record(["m1", "m2"], ["c1", "c2"], 2, reasons=MATRIX_BEFORE)
    after = make_record(["m1", "m2"], ["c1", "c2"], 2, reasons=MATRIX_AFTER)
    assert compare_runs.compare(before, after) == 1
    out = capsys.readouterr().out
    changes = {tuple(line.split()) for line in out.splitlines() if line.startswith(("REGRESS", "GAIN"))}
    # m2/c1 only moved a reason between repeats (1 -> 1): no change; in m2/c2 wrong_action
    # occurred more often (1 -> 2 of 2 repeats): counts per side, not sets (issue 14.7)
    assert changes == {("REGRESS", "m1", "c1", "+forbidden_text", "0->1"),
                       ("GAIN", "m1", "c1", "-missing_citation", "1->0", "-wrong_code", "2->0"),
                       ("REGRESS", "m2", "c2", "+wrong_action", "1->2")}


def test_matrix_labels_and_a9_line_format(capsys):
    before = make_record(["m1", "m2"], ["c1", "c2"], 2, reasons=MATRIX_BEFORE)
    after = make_record(["m1", "m2"], ["c1", "c2"], 2, reasons=MATRIX_AFTER)
    assert compare_runs.compare(before, after) == 1
    out = capsys.readouterr().out
    lines = key_lines(out)
    assert set(lines) == set(regression.plan_rows(["m1", "m2"], ["c1", "c2"], 2))
    assert lines[("m1", "c1", 0)] == ("STILL_FAILING", ["wrong_code"], ["forbidden_text"])
    assert lines[("m1", "c1", 1)] == ("RECOVERED", ["wrong_code", "missing_citation"], [])
    assert lines[("m2", "c1", 0)] == ("RECOVERED", ["too_long"], [])
    assert lines[("m2", "c1", 1)] == ("NEW_FAILURE", [], ["too_long"])
    assert lines[("m2", "c2", 0)] == ("NEW_FAILURE", [], ["wrong_action"])
    assert lines[("m2", "c2", 1)] == ("STILL_FAILING", ["wrong_action"], ["wrong_action"])
    assert lines[("m1", "c2", 0)] == ("PASS", [], [])
    # the exact A9 shape: label, model, case, repeat, before=[..] after=[..]
    assert re.search(r'^NEW_FAILURE +m2  c1  repeat 1  before=\[\] +after=\["too_long"\]$', out,
                     re.M)


MATRIX_TABLE = [
    # before reasons per repeat, after reasons per repeat, REGRESS, GAIN
    ([[], []], [[], []], [], []),
    ([[], []], [["b"], []], ["b"], []),
    ([["a"], ["a"]], [[], []], [], ["a"]),
    ([["a"], []], [[], ["a"]], [], []),
    ([["a", "b"], ["c"]], [["c"], ["d", "a"]], ["d"], ["b"]),
    ([["z"], ["y"], ["x"]], [["x", "w"], [], ["v"]], ["v", "w"], ["y", "z"]),
]


@pytest.mark.parametrize("before, after, regress, gain", MATRIX_TABLE)
def test_matrix_table(before, after, regress, gain):
    result = compare_runs.analyse(pairs_of(before, after))
    (group,) = result["groups"]
    assert (group["regress"], group["gain"]) == (regress, gain)


# ====================================================================== 2. Fisher, FLAKY, RATE, --alpha

@pytest.mark.parametrize("args, expected", [
    ((3, 3, 0, 3), 0.05),
    ((10, 10, 5, 10), 3003 / 184756),
    ((1, 1, 0, 1), 0.5),
    ((2, 2, 0, 2), 1 / 6),
    ((2, 2, 1, 2), 0.5),
    ((3, 3, 3, 3), 1.0),
    ((0, 3, 0, 3), 1.0),
])
def test_fisher_drop_hand_computed(args, expected):
    assert compare_runs.fisher_drop(*args) == expected


def _brute_force_p(passed_before, runs_before, passed_after, runs_after):
    """Every way of choosing which of the pooled runs were 'before': the share with as many passes or more."""
    pooled = [1] * (passed_before + passed_after) + [0] * (runs_before + runs_after - passed_before - passed_after)
    splits = list(itertools.combinations(range(len(pooled)), runs_before))
    extreme = sum(1 for chosen in splits if sum(pooled[i] for i in chosen) >= passed_before)
    return fractions.Fraction(extreme, len(splits))


def test_fisher_drop_against_brute_force_and_bounds():
    for runs_before in range(1, 5):
        for runs_after in range(1, 5):
            for passed_before in range(runs_before + 1):
                for passed_after in range(runs_after + 1):
                    args = (passed_before, runs_before, passed_after, runs_after)
                    p = compare_runs.fisher_drop(*args)
                    assert p == float(_brute_force_p(*args)), args
                    assert 0 < p <= 1, args
                    if passed_before * runs_after <= passed_after * runs_before:  # no drop
                        assert p >= 0.5, args
                    if passed_before < runs_before:  # one more pass before is a stronger drop
                        assert compare_runs.fisher_drop(passed_before + 1, runs_before, passed_after,
                                                        runs_after) <= p, args


def test_rate_lines_and_flaky(capsys):
    models, cases = ["m"], ["c1", "c2", "c3", "c4"]
    before = make_record(models, cases, 3, reasons={("m", "c3", 1): ["x"], ("m", "c4", 0): ["x"]})
    after = make_record(models, cases, 3, reasons={("m", "c1", 0): ["x"], ("m", "c1", 2): ["x"],
                                                   ("m", "c4", 1): ["x"]})
    compare_runs.compare(before, after)
    out = capsys.readouterr().out
    rates = {line.split()[2]: line for line in out.splitlines() if line.startswith("RATE")}
    assert set(rates) == set(cases)
    assert "3/3 = 1.00 [0.44, 1.00] -> 1/3 = 0.33 [0.06, 0.79]" in rates["c1"]
    assert "FLAKY(after)" in rates["c1"] and "p=0.2000" in rates["c1"]  # fisher_drop(3, 3, 1, 3)
    assert "3/3 = 1.00 [0.44, 1.00] -> 3/3 = 1.00 [0.44, 1.00]" in rates["c2"]
    assert "FLAKY" not in rates["c2"]
    assert "2/3 = 0.67 [0.21, 0.94] -> 3/3" in rates["c3"] and "FLAKY(before)" in rates["c3"]
    assert "2/3 = 0.67 [0.21, 0.94] -> 2/3" in rates["c4"] and "FLAKY(before,after)" in rates["c4"]


def test_no_rate_lines_with_one_repeat(capsys):
    before = make_record(["m"], ["c1", "c2"], 1)
    after = make_record(["m"], ["c1", "c2"], 1, reasons={("m", "c1", 0): ["x"]})
    assert compare_runs.compare(before, after) == 1
    out = capsys.readouterr().out
    assert "RATE" not in out and "pass rates" not in out and "FLAKY" not in out
    assert "NEW_FAILURE" in out


def _drop_records(tmp_path, repeats, failing_repeats):
    """Model m passes c1 in every repeat before and fails it in `failing_repeats` after."""
    before = make_record(["m"], ["c1", "c2"], repeats)
    after = make_record(["m"], ["c1", "c2"], repeats, reasons={("m", "c1", r): ["wrong_code"] for r in failing_repeats})
    return write_json(tmp_path / "before.json", before), write_json(tmp_path / "after.json", after)


def test_alpha_significant_drop_exits_1(tmp_path, capsys):
    paths = _drop_records(tmp_path, 3, [0, 1, 2])  # 3/3 -> 0/3: p = 0.05 exactly
    assert compare_runs.main([*paths, "--alpha", "0.05", "--correction", "none"]) == 1
    out = capsys.readouterr().out
    assert ("verdict: SIGNIFICANT DROP (exit 1): 1 model/case pair dropped at p <= 0.05 "
            "(uncorrected over 2 model/case pairs: --correction none); 3 rows flipped to "
            "failing") in out
    assert "note:" not in out  # 3 repeats can reach 0.05


def test_alpha_insignificant_drop_exits_0_despite_new_failures(tmp_path, capsys):
    paths = _drop_records(tmp_path, 3, [0, 1, 2])
    assert compare_runs.main([*paths, "--alpha", "0.01", "--correction", "none"]) == 0
    out = capsys.readouterr().out
    assert sum(label == "NEW_FAILURE" for label, _, _ in key_lines(out).values()) == 3
    assert "verdict: no significant drop (exit 0): 3 rows flipped to failing, none at p <= 0.01" in out
    assert "no new failure" not in out and out.count("NEW_FAILURE") == 3
    assert "no drop can reach p <= 0.01 (the smallest possible p is 0.0500); to plan repeats: " \
        "python compare_runs.py --repeats-needed BEFORE AFTER --alpha 0.01" in out


def test_without_alpha_any_new_failure_exits_1(tmp_path, capsys):
    paths = _drop_records(tmp_path, 3, [1])  # 3/3 -> 2/3, p = 0.5: only one row flipped
    assert compare_runs.main(list(paths)) == 1
    out = capsys.readouterr().out
    assert "verdict: NEW FAILURES (exit 1): 1 row flipped to failing" in out
    assert compare_runs.main([*paths, "--alpha", "0.2"]) == 0


def test_alpha_note_with_one_repeat(tmp_path, capsys):
    paths = _drop_records(tmp_path, 1, [0])
    assert compare_runs.main([*paths, "--alpha", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "note: with 1 repeat(s) per side no drop can reach adjusted p <= 0.05 over 2 pairs " \
        "(the smallest possible p is 0.5000; Holm needs p <= 0.025 for the first)" in out


@pytest.mark.parametrize("alpha", ["0", "1", "-0.1", "nan", "x"])
def test_alpha_out_of_range_is_usage_error(tmp_path, alpha):
    paths = _drop_records(tmp_path, 1, [0])
    with pytest.raises(SystemExit) as exc:
        compare_runs.main([*paths, "--alpha", alpha])
    assert exc.value.code == 2


# ====================================================================== 3. model swap

def _swap_record(tmp_path, reasons, models=("A", "B", "C"), name="run.json"):
    record = make_record(list(models), ["c1", "c2", "c3"], 2, reasons=reasons)
    return write_json(tmp_path / name, record)


SWAP_REASONS = {("A", "c2", 0): ["wrong_code"], ("A", "c2", 1): ["wrong_code"],
                ("A", "c3", 0): ["too_long"], ("B", "c3", 0): ["too_long"],
                ("B", "c1", 1): ["wrong_action"],
                **{("C", c, r): ["broken"] for c in ("c1", "c2", "c3") for r in (0, 1)}}


def test_model_swap_pairs_a_before_b_after(tmp_path, capsys):
    run = _swap_record(tmp_path, SWAP_REASONS)
    assert compare_runs.main(["--models", "A", "B", run, "--all"]) == 1
    out = capsys.readouterr().out
    assert "MODEL SWAP: A (before) -> B (after)" in out
    lines = key_lines(out)
    assert set(lines) == {("A -> B", c, r) for c in ("c1", "c2", "c3") for r in (0, 1)}  # model C is ignored
    assert lines[("A -> B", "c1", 0)] == ("PASS", [], [])
    assert lines[("A -> B", "c1", 1)] == ("NEW_FAILURE", [], ["wrong_action"])
    assert lines[("A -> B", "c2", 0)] == ("RECOVERED", ["wrong_code"], [])
    assert lines[("A -> B", "c2", 1)] == ("RECOVERED", ["wrong_code"], [])
    assert lines[("A -> B", "c3", 0)] == ("STILL_FAILING", ["too_long"], ["too_long"])
    assert lines[("A -> B", "c3", 1)] == ("PASS", [], [])
    assert "REGRESS        A -> B  c1  +wrong_action" in out
    assert "GAIN           A -> B  c2  -wrong_code" in out


def test_model_swap_reversed_and_drop_in(tmp_path, capsys):
    run = _swap_record(tmp_path, SWAP_REASONS)
    # B -> A: A fails c2 where B passes
    assert compare_runs.main(["--models", "B", "A", run]) == 1
    lines = key_lines(capsys.readouterr().out)
    assert lines[("B -> A", "c2", 0)] == ("NEW_FAILURE", [], ["wrong_code"])
    assert lines[("B -> A", "c1", 1)] == ("RECOVERED", ["wrong_action"], [])
    same = {("A", "c1", 0): ["x"], ("B", "c1", 0): ["y"]}  # both fail the same row: B is a drop-in
    run = _swap_record(tmp_path, same, name="same.json")
    assert compare_runs.main(["--models", "A", "B", run]) == 0


def test_model_swap_subprocess(tmp_path):
    run = _swap_record(tmp_path, SWAP_REASONS)
    proc = run_script(COMPARE, "--models", "A", "B", run, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert re.search(r"^NEW_FAILURE +A -> B  c1  repeat 1  before=\[\] +"
                     r"after=\[\"wrong_action\"\]$",
                     proc.stdout, re.M)


@pytest.mark.parametrize("models", [["A", "Z"], ["Z", "B"], ["A", "A"]])
def test_model_swap_unknown_or_same_model_not_comparable(tmp_path, capsys, models):
    run = _swap_record(tmp_path, {})
    assert compare_runs.main(["--models", *models, run]) == 2
    out = capsys.readouterr().out
    assert out.startswith("NOT_COMPARABLE: ") and len(out.strip().splitlines()) == 1


def test_model_swap_incomplete_run_not_comparable(tmp_path, capsys):
    record = make_record(["A", "B"], ["c1"], 1)
    del record["runs"][-1]
    run = write_json(tmp_path / "run.json", record)
    assert compare_runs.main(["--models", "A", "B", run]) == 2
    assert capsys.readouterr().out.startswith("NOT_COMPARABLE: ")


def test_model_swap_with_two_records_is_usage_error(tmp_path, capsys):
    run = _swap_record(tmp_path, {})
    with pytest.raises(SystemExit) as exc:
        compare_runs.main(["--models", "A", "B", run, run])
    assert exc.value.code == 2
    assert "--models A B takes one RUN record" in capsys.readouterr().err
    proc = run_script(COMPARE, "--models", "A", "B", run, run, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


# ====================================================================== 4. answer diffs

def _diff_records():
    models, cases = ["m"], ["new", "rec", "same", "pass", "still"]
    before = make_record(models, cases, 1, reasons={("m", "rec", 0): ["x"], ("m", "still", 0): ["x"]},
                         answers={("m", "new", 0): "code: 200\naction: retry",
                                  ("m", "rec", 0): "code: 404\naction: verify",
                                  ("m", "pass", 0): "old wording", ("m", "still", 0): "still old"})
    after = make_record(models, cases, 1, reasons={("m", "new", 0): ["wrong_code"], ("m", "still", 0): ["x"]},
                        answers={("m", "new", 0): "code: 503\naction: retry",
                                 ("m", "rec", 0): "code: 409\naction: verify",
                                 ("m", "pass", 0): "new wording", ("m", "still", 0): "still new"})
    return before, after


def _diff_sections(out):
    """{case: diff text} from the 'answers that changed' part of a comparison."""
    _, _, tail = out.partition("answers that changed (unified diff before -> after; an identical diff is shown once):\n")
    sections = {}
    for block in tail.split("== ")[1:]:
        header, _, body = block.partition("\n")
        sections[header.split()[1]] = (header, body)
    return sections


def test_diff_for_new_failure_and_recovered_only(capsys):
    before, after = _diff_records()
    assert compare_runs.compare(before, after) == 1
    sections = _diff_sections(capsys.readouterr().out)
    assert set(sections) == {"new", "rec"}
    header, body = sections["new"]
    assert header == "m  new  repeat 0 (passed before, fails now)"
    assert body.splitlines()[:5] == ["--- before", "+++ after", "@@ -1,2 +1,2 @@", "-code: 200", "+code: 503"]
    assert " action: retry" in body.splitlines()
    assert "-code: 404" in sections["rec"][1] and "+code: 409" in sections["rec"][1]


def test_all_diffs_shows_every_changed_answer(tmp_path, capsys):
    before, after = _diff_records()
    paths = write_json(tmp_path / "b.json", before), write_json(tmp_path / "a.json", after)
    assert compare_runs.main([*paths, "--all-diffs"]) == 1
    sections = _diff_sections(capsys.readouterr().out)
    assert set(sections) == {"new", "rec", "pass", "still"}  # "same" did not change
    assert sections["pass"][0] == "m  pass  repeat 0 (passes in both)"
    assert "-old wording" in sections["pass"][1] and "+new wording" in sections["pass"][1]
    assert "-still old" in sections["still"][1] and "+still new" in sections["still"][1]


def test_no_diff_section_when_answers_unchanged(capsys):
    before = make_record(["m"], ["c"], 1)
    after = make_record(["m"], ["c"], 1, reasons={("m", "c", 0): ["x"]})
    assert compare_runs.compare(before, after, all_diffs=True) == 1
    assert "answers that changed" not in capsys.readouterr().out


# ====================================================================== 5. JUnit

HOSTILE_XML = "ctl \x00 esc \x1b[31m red \x07 bell <tag> & \"quoted\" 'single' ]]> \ufffe end"


def _junit_record():
    """m1, m2 x c1..c3 x 2 repeats = 12 planned rows: 2 failed, 1 execution error, 2 never ran."""
    models, cases, repeats = ["m1", "m2"], ["c1", "c2", "c3"], 2
    missing = {("m2", "c3", 0), ("m2", "c3", 1)}
    rows = []
    for m, c, r in regression.plan_rows(models, cases, repeats):
        if (m, c, r) in missing:
            continue
        if (m, c, r) == ("m1", "c1", 0):
            rows.append(make_row(m, c, r, ["wrong_code"], answer=HOSTILE_XML))
        elif (m, c, r) == ("m1", "c2", 1):
            rows.append(make_row(m, c, r, ["missing_citation", "too_long"], answer="<b>x</b>",
                                 details={"diff": "-a\n+b \x1b", "similarity": 0.5}))
        elif (m, c, r) == ("m2", "c2", 1):
            rows.append(make_row(m, c, r, ["execution_error"], error="APITimeoutError", error_status=None,
                                 error_message=HOSTILE_XML))
        else:
            rows.append(make_row(m, c, r))
    record = make_record(models, cases, repeats, rows=rows, suite={"name": "demo"})
    record["summary"]["stopped"] = "the first execution error stops the run"
    return record


def check_junit_counts(root):
    """testsuites/testsuite counters agree with the elements; returns the testcase elements."""
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    cases = root.findall("testsuite/testcase")
    assert len(root.findall(".//testcase")) == len(cases)
    for element, scope in [(root, cases)] + [(suite, suite.findall("testcase")) for suite in suites]:
        assert int(element.get("tests")) == len(scope)
        for kind in ("failures", "errors", "skipped"):
            assert int(element.get(kind)) == sum(1 for case in scope if case.find(kind.rstrip("s")) is not None)
    return cases


def test_junit_run_counts():
    root = ET.fromstring(regression.junit_run(_junit_record()))
    cases = check_junit_counts(root)
    assert len(cases) == 2 * 3 * 2
    # a row that never ran is an error, as the exit code says (2): a gate reading only the JUnit
    # file must not pass an incomplete run
    assert (int(root.get("failures")), int(root.get("errors")), int(root.get("skipped"))) == (2, 3, 0)
    by_name = {(case.get("classname"), case.get("name")): case for case in cases}
    assert len(by_name) == 12
    failure = by_name[("demo.m1", "c1 [repeat 0]")].find("failure")
    assert failure.get("message") == "wrong_code"
    assert "<tag> & \"quoted\"" in failure.text  # escaped on the way out, intact once parsed
    assert "missing_citation, too_long" == by_name[("demo.m1", "c2 [repeat 1]")].find("failure").get("message")
    assert by_name[("demo.m2", "c2 [repeat 1]")].find("error").get("message") == "APITimeoutError"
    not_run = by_name[("demo.m2", "c3 [repeat 0]")].find("error")
    assert not_run.get("message") == "not run" and "first execution error" in not_run.text
    for case in cases:  # exactly one outcome element at most
        assert len([child for child in case if child.tag in ("failure", "error", "skipped")]) <= 1


def test_junit_run_hostile_names_stay_well_formed():
    model, case_id = "m<&\"'>\x00\x1b", "c]]>\x1b<!--"
    record = make_record([model], [case_id], 1, reasons={(model, case_id, 0): [HOSTILE_XML]},
                         answers={(model, case_id, 0): HOSTILE_XML}, suite={"name": "s<&>\x00"})
    root = ET.fromstring(regression.junit_run(record))
    (case,) = check_junit_counts(root)
    assert case.get("name").startswith("c]]>")
    assert "\x00" not in ET.tostring(root, encoding="unicode")


def test_junit_via_report_flag(tmp_path):
    record = write_json(tmp_path / "run.json", _junit_record())
    out = tmp_path / "junit.xml"
    proc = run_script(REGRESSION, "--report", record, "--junit", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(out).getroot()
    cases = check_junit_counts(root)
    # the 2 rows that never ran are errors too: the report of an incomplete run never reads green
    assert len(cases) == 12 and root.get("failures") == "2" and root.get("errors") == "3"
    assert root.get("skipped") == "0"


def _junit_comparison_paths(tmp_path):
    models, cases = ["m1", "m2"], ["c1", "c2"]
    before = make_record(models, cases, 2, reasons={("m2", "c1", 0): ["x"]})
    after = make_record(models, cases, 2, reasons={("m1", "c1", 0): ["wrong_code"], ("m1", "c1", 1): ["wrong_code"],
                                                   ("m2", "c2", 0): [HOSTILE_XML]},
                        answers={("m1", "c1", 0): HOSTILE_XML})
    return write_json(tmp_path / "before.json", before), write_json(tmp_path / "after.json", after)


def test_junit_comparison_one_testcase_per_key(tmp_path, capsys):
    paths = _junit_comparison_paths(tmp_path)
    out = tmp_path / "cmp.xml"
    assert compare_runs.main([*paths, "--junit", str(out)]) == 1
    new_failures = [key for key, (label, _, _) in key_lines(capsys.readouterr().out).items()
                    if label == "NEW_FAILURE"]
    root = ET.parse(out).getroot()
    cases = check_junit_counts(root)
    assert len(cases) == 2 * 2 * 2
    assert len({(case.get("classname"), case.get("name")) for case in cases}) == 8
    assert int(root.get("failures")) == len(new_failures) == 3
    failing = {(case.get("classname"), case.get("name").split(" [")[0]) for case in cases
               if case.find("failure") is not None}
    assert failing == {("compare.m1", "c1"), ("compare.m2", "c2")}


def test_junit_comparison_with_alpha_fails_significant_groups(tmp_path, capsys):
    paths = _junit_comparison_paths(tmp_path)
    out = tmp_path / "cmp.xml"
    # m1/c1 2/2 -> 0/2 has p = 1/6; m2/c2 2/2 -> 1/2 has p = 0.5
    argv = [*paths, "--alpha", "0.2", "--correction", "none", "--junit", str(out)]
    assert compare_runs.main(argv) == 1
    capsys.readouterr()
    root = ET.parse(out).getroot()
    cases = check_junit_counts(root)
    assert len(cases) == 8 and root.get("failures") == "2"
    assert {case.get("name").split(" [")[0] for case in cases if case.find("failure") is not None} == {"c1"}
    assert all(case.get("classname") == "compare.m1" for case in cases if case.find("failure") is not None)


# ====================================================================== 6. Markdown

HOSTILE_MD = ["pipe | in | cell", "<script>alert(1)</script>", "line\nbreak\r\nmore", "back`tick ``code``",
              "![img](http://127.0.0.1:9/x.png) [link](javascript:alert(1))", "trailing backslash \\",
              "escaped \\| pipe", "<SCRIPT src=//x>"]


def md_tables(text):
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def md_cells(line):
    """Cells as a GFM table parser (cmark-gfm) splits them: a pipe after a backslash is content."""
    assert line.startswith("| ") or line.startswith("|-"), line
    parts = re.split(r"(?<!\\)\|", line)
    assert parts[0] == "" and parts[-1] == "", line
    return parts[1:-1]


def check_markdown_safe(text, row_counts):
    """Each table keeps its column count on every line; no raw HTML tag or unescaped backtick survives."""
    tables = md_tables(text)
    assert [len(table) - 2 for table in tables] == row_counts
    for table in tables:
        width = len(md_cells(table[0]))
        assert set(table[1]) <= set("|-") and len(md_cells(table[1])) == width
        for line in table[2:]:
            assert len(md_cells(line)) == width, line
    assert "<script" not in text.lower()
    assert not re.search(r"<[a-zA-Z!/]", text)
    assert not re.search(r"(?<!\\)`", text)
    assert "![" not in text and "](" not in text.replace("\\](", "")


def _hostile_run_record():
    models = [f"model {n} {text}" for n, text in enumerate(HOSTILE_MD[:3])]
    cases = [f"case {n} {text}" for n, text in enumerate(HOSTILE_MD[3:6])]
    reasons = {(models[0], cases[0], 0): HOSTILE_MD[:4], (models[1], cases[2], 0): HOSTILE_MD[4:],
               (models[2], cases[1], 0): ["wrong_code"]}
    return make_record(models, cases, 1, reasons=reasons, answers={key: "\n".join(HOSTILE_MD) for key in reasons},
                       suite={"name": "suite | `x` <script>"}, evidence="live <script>")


def test_markdown_run_hostile(tmp_path, capsys):
    record = _hostile_run_record()
    path = write_json(tmp_path / "run.json", record)
    out = tmp_path / "run.md"
    assert regression.main(["--report", path, "--markdown", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text(encoding="utf-8")
    assert "**FAIL: at least one check failed** (exit 1)" in text
    check_markdown_safe(text, [3, 3])  # a row per model, a row per failed row
    assert "&lt;script&gt;" in text and "pipe \\| in \\| cell" in text


def test_markdown_run_verdicts():
    assert "**PASS: every row passed** (exit 0)" in regression.markdown_run(make_record(["m"], ["c"], 1))
    incomplete = _junit_record()
    text = regression.markdown_run(incomplete)
    assert "**ERROR: an execution error or an incomplete run** (exit 2)" in text
    assert "10 of 12 rows" in text and "Stopped early: the first execution error stops the run" in text
    check_markdown_safe(text, [2, 3, 3])  # the models, the cases that failed a repeat, the failures


def test_markdown_comparison_hostile(tmp_path, capsys):
    models = [f"model {n} {text}" for n, text in enumerate(HOSTILE_MD[:2])]
    cases = [f"case {n} {text}" for n, text in enumerate(HOSTILE_MD[2:5])]
    before = make_record(models, cases, 2, reasons={(models[1], cases[2], 1): HOSTILE_MD[5:]})
    after = make_record(models, cases, 2, reasons={(models[0], cases[0], 0): HOSTILE_MD[:4],
                                                   (models[1], cases[1], 1): HOSTILE_MD[4:]})
    paths = write_json(tmp_path / "b|`<script>`.json", before), write_json(tmp_path / "a.json", after)
    out = tmp_path / "cmp.md"
    assert compare_runs.main([*paths, "--markdown", str(out)]) == 1
    capsys.readouterr()
    text = out.read_text(encoding="utf-8")
    assert "**NEW FAILURES (exit 1): 2 rows flipped to failing**" in text
    # changed rows (2 NEW_FAILURE + 1 RECOVERED), the models, the changed model x case pairs
    check_markdown_safe(text, [3, 2, 3])


def test_markdown_comparison_no_new_failure(tmp_path, capsys):
    record = make_record(["m"], ["c"], 1)
    paths = write_json(tmp_path / "b.json", record), write_json(tmp_path / "a.json", record)
    out = tmp_path / "cmp.md"
    assert compare_runs.main([*paths, "--markdown", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text(encoding="utf-8")
    assert "**no new failure (exit 0): 0 rows flipped to failing**" in text
    assert "Unchanged rows (not listed): PASS 1." in text
    check_markdown_safe(text, [1])  # the models


@pytest.mark.parametrize("value", HOSTILE_MD + ["a\u2028b\x85c\x0bd", "x" * 500 + "|"])
def test_md_text_is_one_safe_cell(value):
    line = regression.md_table(["h"], [[regression.md_text(value)]]).splitlines()[-1]
    assert len(md_cells(line)) == 1
    assert "\n" not in line and "\r" not in line and "<" not in line


# ====================================================================== 7. files: mode 0600, never overwrite

@pytest.mark.parametrize("kind", ["markdown", "junit", "html"])
def test_run_report_created_0600(tmp_path, capsys, kind):
    record = write_json(tmp_path / "run.json", _junit_record())
    out = tmp_path / f"report.{kind}"
    with umask(0):  # the mode must not depend on the caller's umask
        assert regression.main(["--report", record, f"--{kind}", str(out)]) == 0
    capsys.readouterr()
    assert out.stat().st_mode & 0o777 == 0o600
    assert out.stat().st_size > 0


@pytest.mark.parametrize("kind", ["markdown", "junit", "html"])
def test_comparison_report_created_0600(tmp_path, capsys, kind):
    paths = _junit_comparison_paths(tmp_path)
    out = tmp_path / f"cmp.{kind}"
    with umask(0):
        assert compare_runs.main([*paths, f"--{kind}", str(out)]) == 1
    capsys.readouterr()
    assert out.stat().st_mode & 0o777 == 0o600
    assert out.stat().st_size > 0


def test_echo_run_reports_created_0600(tmp_path):
    """Reports written at the end of a real (offline, echo) run are new 0600 files too."""
    outs = {kind: tmp_path / f"r.{kind}" for kind in ("markdown", "junit", "html")}
    flags = [item for kind, path in outs.items() for item in (f"--{kind}", path)]
    command = [sys.executable, str(REGRESSION), "--provider", "echo", "--out", str(tmp_path / "run.json"),
               *map(str, flags)]
    # umask 0 in the child: the mode must come from the code, not from the caller's umask
    proc = subprocess.run(["/bin/sh", "-c", 'umask 0 && exec "$@"', "sh", *command], capture_output=True,
                          text=True, cwd=tmp_path, env=script_env(), timeout=60)
    assert proc.returncode == 1, proc.stderr  # echo answers fail the built-in checks
    for path in outs.values():
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert ET.parse(outs["junit"]).getroot().get("tests") == str(len(regression.CASES))


EXISTING = b"precious bytes\n"


@pytest.mark.parametrize("kind", ["markdown", "junit", "html"])
def test_run_report_never_overwrites(tmp_path, kind):
    record = write_json(tmp_path / "run.json", _junit_record())
    existing, fresh = tmp_path / "existing", tmp_path / "fresh.md"
    existing.write_bytes(EXISTING)
    other = "junit" if kind == "markdown" else "markdown"
    # the fresh target comes first: nothing may be written before the existing one is refused
    proc = run_script(REGRESSION, "--report", record, f"--{other}", fresh, f"--{kind}", existing, cwd=tmp_path)
    assert proc.returncode == 2
    assert "already exists" in proc.stderr and "Traceback" not in proc.stderr
    assert existing.read_bytes() == EXISTING
    assert not fresh.exists()


@pytest.mark.parametrize("kind", ["markdown", "junit", "html"])
def test_comparison_report_never_overwrites(tmp_path, kind):
    paths = _junit_comparison_paths(tmp_path)
    existing, fresh = tmp_path / "existing", tmp_path / "fresh.out"
    existing.write_bytes(EXISTING)
    other = "junit" if kind == "markdown" else "markdown"
    proc = run_script(COMPARE, *paths, f"--{other}", fresh, f"--{kind}", existing, cwd=tmp_path)
    assert proc.returncode == 2
    assert "already exists" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # refused before any comparison work
    assert existing.read_bytes() == EXISTING
    assert not fresh.exists()


def test_run_never_starts_when_report_target_exists(tmp_path):
    existing, out = tmp_path / "existing.html", tmp_path / "run.json"
    existing.write_bytes(EXISTING)
    proc = run_script(REGRESSION, "--provider", "echo", "--out", out, "--html", existing, cwd=tmp_path)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert existing.read_bytes() == EXISTING
    assert not out.exists()  # checked before the record (and any request)


@pytest.mark.parametrize("script", ["regression", "compare_runs"])
def test_dangling_symlink_target_refused(tmp_path, script):
    link, target = tmp_path / "link.html", tmp_path / "elsewhere.html"
    link.symlink_to(target)
    if script == "regression":
        args = [REGRESSION, "--report", write_json(tmp_path / "run.json", _junit_record()), "--html", link]
    else:
        args = [COMPARE, *_junit_comparison_paths(tmp_path), "--html", link]
    proc = run_script(*args, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert not target.exists()


def test_same_report_path_twice_refused_before_writing(tmp_path):
    """Two reports (or the record and a report) aimed at one path can never both be written; refuse up front."""
    record = write_json(tmp_path / "run.json", _junit_record())
    twice = tmp_path / "twice.out"
    proc = run_script(REGRESSION, "--report", record, "--markdown", twice, "--html", twice, cwd=tmp_path)
    assert proc.returncode == 2
    assert not twice.exists(), "half the reports were written before the clash was noticed"


def test_comparison_same_report_path_twice_refused_before_writing(tmp_path):
    twice = tmp_path / "twice.out"
    proc = run_script(COMPARE, *_junit_comparison_paths(tmp_path), "--markdown", twice, "--junit", twice,
                      cwd=tmp_path)
    assert proc.returncode == 2
    assert not twice.exists(), "half the reports were written before the clash was noticed"


def test_report_path_equal_to_out_refused_before_running(tmp_path):
    out = tmp_path / "run.json"
    proc = run_script(REGRESSION, "--provider", "echo", "--out", out, "--html", out, cwd=tmp_path)
    assert proc.returncode == 2
    assert not out.exists(), "the run was executed although its --html report could never be written"


MALFORMED_RECORDS = {
    "config-without-models": {"config": {}, "runs": []},
    "suite-null": dict(make_record(["m"], ["c"], 1), suite=None),
    "summary-model-without-counts": dict(make_record(["m"], ["c"], 1), summary={"models": {"m": {}}}),
    "case-without-id": {"config": {"models": ["m"], "cases": [{}], "repeats": 1}, "runs": []},
}


@pytest.mark.parametrize("kind", ["markdown", "junit", "html"])
@pytest.mark.parametrize("name", list(MALFORMED_RECORDS))
def test_report_of_malformed_record_is_one_line_not_traceback(tmp_path, name, kind):
    """SPEC C2: a malformed record is exit 2 with one line (or a report), never a traceback."""
    record = write_json(tmp_path / "run.json", MALFORMED_RECORDS[name])
    out = tmp_path / f"report.{kind}"
    proc = run_script(REGRESSION, "--report", record, f"--{kind}", out, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert proc.returncode in (0, 2)
    if proc.returncode == 2:
        assert not out.exists()


@pytest.mark.parametrize("kind", ["markdown", "junit", "html"])
def test_report_with_lone_surrogate_in_answer(tmp_path, kind):
    """A JSON record may carry an escaped lone surrogate ("\\ud800") from a model's output; it cannot be
    encoded as UTF-8. The report must not crash with a traceback, nor leave an empty file behind."""
    key = ("m", "c", 0)
    record = make_record(["m"], ["c"], 1, reasons={key: ["wrong_code"]}, answers={key: "bad \ud800 text"},
                         suite={"name": "s"})
    record["runs"][0]["error_message"] = "\udfff"
    path = write_json(tmp_path / "run.json", record)  # json.dumps escapes it: the file itself is valid
    out = tmp_path / f"report.{kind}"
    proc = run_script(REGRESSION, "--report", path, f"--{kind}", out, cwd=tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr[-600:]
    assert proc.returncode in (0, 2)
    if proc.returncode == 2:
        assert not out.exists(), "an empty report file was left behind and blocks the next attempt"
    else:
        assert out.stat().st_size > 0


# ====================================================================== 8. HTML in a real headless browser

def hostile_strings(port):
    base = f"http://127.0.0.1:{port}"
    return [f'<script>fetch("{base}/script")</script>',
            f"<img src=x onerror=\"fetch('{base}/img')\">",
            f"<a href=\"javascript:fetch('{base}/js')\">click</a>",
            '</style><script>document.title="PWNED"</script>',
            "<svg onload=\"document.title='PWNED'\">"]


class _Recorder(http.server.ThreadingHTTPServer):
    """A loopback server that records every connection and request path it sees."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.port = self.server_address[1]
        self.paths, self.connections = [], 0

    def verify_request(self, request, client_address):
        self.connections += 1  # counted on accept, before any request line arrives
        return True

    def settle(self):
        """Every request the browser made is recorded: our own request is accepted after it."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.port}/__settle__", timeout=10) as response:
            response.read()
        self.paths.remove("/__settle__")
        self.connections -= 1
        seen = (list(self.paths), self.connections)
        self.paths.clear()
        self.connections = 0
        return seen


class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    def _record(self):
        self.server.paths.append(self.path)
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_HEAD = do_OPTIONS = do_PUT = _record

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback():
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def dump_dom(page, tmp_path):
    """Open a local page in headless Chromium and return the DOM after scripts (if any) ran."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("REQUIRE_CHROMIUM"):  # .ci/run installs it: a missing browser is a failure there
            pytest.fail(f"{CHROMIUM} is not installed but REQUIRE_CHROMIUM is set")
        pytest.skip(f"{CHROMIUM} is not installed")
    profile = tmp_path / f"profile-{page.stem}"
    home = tmp_path / "home"
    for folder in (profile, home):
        folder.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if "proxy" not in name.lower()}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"))
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-proxy-server", f"--user-data-dir={profile}", "--virtual-time-budget=3000",
               "--dump-dom", page.as_uri()]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own session: the browser and its helpers
        proc.communicate()
        pytest.fail("chromium did not finish within 60 s")
    assert proc.returncode == 0, err.decode("utf-8", "replace")[-2000:]
    dom = out.decode("utf-8", "replace")
    assert "<html" in dom, err.decode("utf-8", "replace")[-2000:]
    return dom


class _Page(html.parser.HTMLParser):
    """Tags, attributes, the title and the text nodes of a page."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text, self.title, self.metas = [], [], [], None, []
        self._in_title = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, name, value) for name, value in attrs]
        if tag == "meta":
            self.metas.append(dict(attrs))
        self._in_title = tag == "title"
        if self._in_title:
            self.title = ""

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_title:
            self.title += data


SAFE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b", "small", "br",
             "table", "thead", "tbody", "tr", "th", "td", "pre", "code", "details", "summary", "span", "div"}
SAFE_ATTRIBUTES = {"lang", "charset", "http-equiv", "content", "name", "class", "open"}


def check_markup_inert(page):
    """No element or attribute that can run script or fetch anything; just one <style> (ours)."""
    assert set(page.tags) <= SAFE_TAGS, set(page.tags) - SAFE_TAGS
    assert page.tags.count("style") == 1 and page.tags.count("title") == 1
    for tag, name, value in page.attrs:
        assert name in SAFE_ATTRIBUTES, (tag, name, value)
        assert not re.search(r"https?:|javascript:|//", value or "", re.I), (tag, name, value)


def csp_directives(page):
    (meta,) = [m for m in page.metas if (m.get("http-equiv") or "").lower() == "content-security-policy"]
    directives = {}
    for part in meta["content"].split(";"):
        if part.strip():
            name, *sources = part.split()
            directives[name.lower()] = sources
    return directives


def assert_inert_in_browser(path, loopback, tmp_path, hostile, title_fragment=None):
    source_text = path.read_text(encoding="utf-8")
    source = _Page(source_text)
    check_markup_inert(source)
    policy = csp_directives(source)
    assert policy.get("default-src") == ["'none'"]
    assert policy.get("script-src", policy["default-src"]) == ["'none'"]
    assert "http:" not in " ".join(sum(policy.values(), []))
    if title_fragment:
        assert title_fragment in source.title
    # Escaping alone must keep the page inert; the policy is a second line of defence. Open both.
    without_csp = path.with_name(f"nocsp-{path.name}")
    stripped, count = re.subn(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", source_text)
    assert count == 1
    without_csp.write_text(stripped, encoding="utf-8")
    for page in (path, without_csp):
        dom_text = dump_dom(page, tmp_path)
        assert loopback.settle() == ([], 0), f"{page.name}: the page contacted the loopback server"
        dom = _Page(dom_text)
        assert dom.title == source.title and dom.title != "PWNED", page.name
        check_markup_inert(dom)
        lowered = dom_text.lower()
        for element in ("<script", "<img", "<svg", "<a ", "<iframe", "<object", "<embed", "<link"):
            assert element not in lowered, (page.name, element)
        assert "&lt;script&gt;" in dom_text
        text = "\x00".join(dom.text)
        for value in hostile:
            assert value in text, (page.name, value)


def _html_run_record(hostile):
    h0, h1, h2, h3, h4 = hostile
    models, cases = [f"m/{h0}", h4], [h1, f"case {h3}"]
    answer = "answer:\n" + "\n".join(hostile)
    rows = [make_row(models[0], cases[0], 0, answer=answer),
            make_row(models[0], cases[1], 0, [h2, "wrong_code"], answer=answer,
                     details={"diff": "--- expected\n+++ actual\n" + "\n".join("+" + h for h in hostile),
                              "similarity": h4}),
            make_row(models[1], cases[0], 0, ["execution_error"], answer=None, error=f"Timeout{h0}",
                     error_status=h1, error_message="\n".join(hostile)),
            make_row(models[1], cases[1], 0, [h3], answer=answer)]
    record = make_record(models, cases, 1, rows=rows, suite={"name": f"suite {h3}"}, evidence=h2,
                         created_at=h4)
    record["summary"]["stopped"] = h1
    return record


def test_html_run_is_inert_in_headless_chromium(tmp_path, loopback):
    hostile = hostile_strings(loopback.port)
    page = tmp_path / "run.html"
    page.write_text(regression.html_run(_html_run_record(hostile)), encoding="utf-8")
    assert_inert_in_browser(page, loopback, tmp_path, hostile, title_fragment=hostile[3])


def test_html_run_report_flag_is_inert_in_headless_chromium(tmp_path, loopback, capsys):
    hostile = hostile_strings(loopback.port)
    data = _html_run_record(hostile)
    for row in data["runs"]:  # the record validator refuses wrong types; hostile text stays in every text field
        row.get("details", {})["similarity"] = 0.5
        row["error_status"] = 504 if row.get("error") else None
    record = write_json(tmp_path / "run.json", data)
    page = tmp_path / "report.html"
    assert regression.main(["--report", record, "--html", str(page)]) == 0
    capsys.readouterr()
    assert page.read_text(encoding="utf-8") == regression.html_run(json.loads(pathlib.Path(record).read_text()))
    assert_inert_in_browser(page, loopback, tmp_path, hostile, title_fragment=hostile[3])


def test_html_comparison_is_inert_in_headless_chromium(tmp_path, loopback, capsys):
    hostile = hostile_strings(loopback.port)
    models, cases = [f"m/{hostile[0]}", hostile[4]], [hostile[1], f"case {hostile[3]}"]
    joined = "\n".join(hostile)
    before = make_record(models, cases, 1, answers={(m, c, 0): "safe answer\nsame line" for m in models for c in cases})
    after = make_record(models, cases, 1, reasons={(models[0], cases[0], 0): [hostile[0], hostile[2]],
                                                   (models[1], cases[1], 0): [hostile[3]]},
                        answers={(models[0], cases[0], 0): joined, (models[1], cases[0], 0): joined,
                                 (models[1], cases[1], 0): "safe answer\n" + joined})
    paths = write_json(tmp_path / "before.json", before), write_json(tmp_path / "after.json", after)
    page = tmp_path / "cmp.html"
    assert compare_runs.main([*paths, "--html", str(page)]) == 1
    capsys.readouterr()
    assert_inert_in_browser(page, loopback, tmp_path, hostile)


def test_html_model_swap_is_inert_in_headless_chromium(tmp_path, loopback, capsys):
    hostile = hostile_strings(loopback.port)
    model_a, model_b = f"a {hostile[3]}", f"b {hostile[4]}"
    cases = [hostile[1], hostile[0]]
    joined = "\n".join(hostile)
    record = make_record([model_a, model_b], cases, 2,
                         reasons={(model_b, cases[0], r): [hostile[2], hostile[0]] for r in (0, 1)},
                         answers={(model_b, c, r): joined for c in cases for r in (0, 1)})
    run = write_json(tmp_path / "run.json", record)
    page = tmp_path / "swap.html"
    assert compare_runs.main(["--models", model_a, model_b, run, "--html", str(page)]) == 1
    capsys.readouterr()
    assert_inert_in_browser(page, loopback, tmp_path, hostile, title_fragment=hostile[4])


def test_positive_control_raw_page_executes(tmp_path, loopback):
    """The harness can see script execution and resource loads: the same strings unescaped do both."""
    hostile = hostile_strings(loopback.port)
    page = tmp_path / "raw.html"
    page.write_text(f"<!DOCTYPE html><html><head><title>original</title></head><body>{''.join(hostile)}"
                    f"<img src=\"http://127.0.0.1:{loopback.port}/plain-img\"></body></html>", encoding="utf-8")
    dom = dump_dom(page, tmp_path)
    paths, connections = loopback.settle()
    assert _Page(dom).title == "PWNED"  # the title channel sees script execution
    assert "/plain-img" in paths and connections > 0  # the network channel sees loads, script-free
    assert {"/script", "/img"} & set(paths)  # and script-driven requests
    assert "<script" in dom.lower()


def test_positive_control_policy_blocks_raw_page(tmp_path, loopback):
    """html_page's Content-Security-Policy on its own stops the same raw strings in Chromium."""
    hostile = hostile_strings(loopback.port)
    page = tmp_path / "raw-csp.html"
    page.write_text(regression.html_page("original", "".join(hostile) +
                                         f"<img src=\"http://127.0.0.1:{loopback.port}/plain-img\">"),
                    encoding="utf-8")
    dom = dump_dom(page, tmp_path)
    assert loopback.settle() == ([], 0)
    assert _Page(dom).title == "original"
