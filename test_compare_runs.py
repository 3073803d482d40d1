"""Offline tests of compare_runs.py against SPEC A9 (index, compare, demo, main)."""

import copy
import json
import os
import pathlib
import subprocess
import sys

import pytest

import compare_runs
import regression

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "compare_runs.py"
CASE_IDS = ["c1", "c2", "c3", "c4"]
MODELS = ["m/one", "m/two"]


# ====================================================================== helpers

def make_row(model, case_id, repeat=0, reasons=(), error=None):
    reasons = list(reasons)
    return {"case_id": case_id, "model": model, "repeat": repeat, "error": error, "error_status": None,
            "cost_usd": "0.001", "response": {"status": "completed"}, "answer_text": "{}",
            "reasons": reasons, "seconds": 0.5, "passed": not reasons}


def make_record(models=MODELS, case_ids=CASE_IDS, repeats=1, failing=None, **top):
    """A complete, error-free record; `failing` maps (model, case_id, repeat) to reasons."""
    failing = failing or {}
    rows = [make_row(m, c, r, failing.get((m, c, r), ()))
            for r in range(repeats) for c in case_ids for m in models]
    record = {
        "created_at": "2024-01-01T00:00:00+00:00",
        "config": {"models": list(models), "cases": [{"id": c, "question": f"q {c}"} for c in case_ids],
                   "instructions": "Be careful.", "tool": {"type": "web_search"},
                   "response_format": {"type": "json_schema"}, "repeats": repeats, "max_steps": 5,
                   "max_output_tokens": 4096, "timeout_seconds": 180},
        "sdk_version": "0.43.5",
        "code_sha256": "a" * 64,
        "runs": rows,
        "summary": {"exit_code": 0},
    }
    record.update(top)
    return record


def write(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def lines_by_case(output):
    """{case_id: (label, line)} for the per-key lines of compare's output."""
    result = {}
    for line in output.splitlines():
        parts = line.split()
        if parts[:1] and parts[0] in ("NEW_FAILURE", "RECOVERED", "PASS", "STILL_FAILING") and parts[3:4] == ["repeat"]:
            result[(parts[1], parts[2], int(parts[4]))] = (parts[0], line)
    return result


# ====================================================================== index

def _set(path, value):
    def mutate(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _row(index, **changes):
    def mutate(record):
        record["runs"][index].update(changes)
    return mutate


def _append_copy(record):
    record["runs"].append(copy.deepcopy(record["runs"][0]))


def _drop(record):
    del record["runs"][-1]


def _extra_model(record):
    record["runs"].append(make_row("m/other", "c1"))


def _extra_case(record):
    record["runs"].append(make_row("m/one", "c9"))


def _extra_repeat(record):
    record["runs"].append(make_row("m/one", "c1", repeat=1))


def _duplicate_case(record):
    record["config"]["cases"].append({"id": "c1", "question": "again"})


def _replace_with_duplicate(record):
    record["runs"][-1] = copy.deepcopy(record["runs"][0])


INDEX_GUARDS = [
    ("models-empty", _set(("config", "models"), [])),
    ("models-duplicate", _set(("config", "models"), ["m/one", "m/two", "m/one"])),
    ("models-not-list", _set(("config", "models"), "m/one")),
    ("cases-duplicate-id", _duplicate_case),
    ("cases-empty", _set(("config", "cases"), [])),
    ("repeats-zero", _set(("config", "repeats"), 0)),
    ("repeats-zero-no-rows", lambda record: record.update(runs=[]) or record["config"].update(repeats=0)),
    ("models-empty-no-rows", lambda record: record.update(runs=[]) or record["config"].update(models=[])),
    ("cases-empty-no-rows", lambda record: record.update(runs=[]) or record["config"].update(cases=[])),
    ("repeats-negative", _set(("config", "repeats"), -1)),
    ("repeats-string", _set(("config", "repeats"), "1")),
    ("repeats-true", _set(("config", "repeats"), True)),
    ("repeats-float", _set(("config", "repeats"), 1.0)),
    ("repeats-missing", lambda record: record["config"].pop("repeats")),
    ("duplicate-row-key", _append_copy),
    ("duplicate-row-same-count", _replace_with_duplicate),
    ("row-with-error", _row(0, error="InternalServerError", reasons=["execution_error"], passed=False)),
    ("row-with-error-but-passed", _row(1, error="CheckerCrash")),
    ("passed-true-with-reasons", _row(2, passed=True, reasons=["wrong_code"])),
    ("passed-false-without-reasons", _row(2, passed=False, reasons=[])),
    ("passed-not-bool", _row(2, passed=1, reasons=[])),
    ("passed-missing", lambda record: record["runs"][3].pop("passed")),
    ("reasons-string", _row(3, reasons="wrong_code", passed=False)),
    ("reasons-non-str-item", _row(3, reasons=["wrong_code", 7], passed=False)),
    ("reasons-missing", lambda record: record["runs"][3].pop("reasons")),
    ("missing-row", _drop),
    ("no-rows", _set(("runs",), [])),
    ("extra-row-model", _extra_model),
    ("extra-row-case", _extra_case),
    ("extra-row-repeat", _extra_repeat),
    ("row-not-object", lambda record: record["runs"].append("row")),
    ("config-not-dict", _set(("config",), [])),
    ("runs-not-list", _set(("runs",), {})),
]


@pytest.mark.parametrize("mutate", [g[1] for g in INDEX_GUARDS], ids=[g[0] for g in INDEX_GUARDS])
def test_index_guards(mutate):
    record = make_record()
    compare_runs.index(record)  # the unmutated record is fine
    mutate(record)
    with pytest.raises(ValueError):
        compare_runs.index(record)


@pytest.mark.parametrize("value", [None, [], "record", 3])
def test_index_rejects_non_dict(value):
    with pytest.raises(ValueError):
        compare_runs.index(value)


@pytest.mark.parametrize("repeats", [1, 2, 3])
def test_index_returns_rows_by_key(repeats):
    record = make_record(repeats=repeats, failing={("m/two", "c3", 0): ["wrong_code"]})
    rows = compare_runs.index(record)
    expected = {(m, c, r) for r in range(repeats) for c in CASE_IDS for m in MODELS}
    assert set(rows) == expected
    for row in record["runs"]:
        assert rows[(row["model"], row["case_id"], row["repeat"])] is row
    assert rows[("m/two", "c3", 0)]["passed"] is False


def test_index_accepts_rows_in_any_order():
    record = make_record(repeats=2)
    record["runs"].reverse()
    assert len(compare_runs.index(record)) == 16


# ====================================================================== compare

def test_compare_four_labels(capsys):
    before = make_record(models=["m"], failing={("m", "c2", 0): ["wrong_code"], ("m", "c4", 0): ["invalid_json"]})
    after = make_record(models=["m"], failing={("m", "c1", 0): ["wrong_code", "wrong_next_action"],
                                               ("m", "c4", 0): ["citation_not_approved"]})
    assert compare_runs.compare(before, after) == 1
    lines = lines_by_case(capsys.readouterr().out)
    assert {key: label for key, (label, _) in lines.items()} == {
        ("m", "c1", 0): "NEW_FAILURE",
        ("m", "c2", 0): "RECOVERED",
        ("m", "c3", 0): "PASS",
        ("m", "c4", 0): "STILL_FAILING",
    }
    new_failure = lines[("m", "c1", 0)][1]
    assert "before=[]" in new_failure
    assert 'after=["wrong_code", "wrong_next_action"]' in new_failure
    recovered = lines[("m", "c2", 0)][1]
    assert 'before=["wrong_code"]' in recovered and "after=[]" in recovered
    still = lines[("m", "c4", 0)][1]
    assert "invalid_json" in still and "citation_not_approved" in still


def test_compare_one_line_per_key_with_repeats(capsys):
    before = make_record(repeats=2)
    after = make_record(repeats=2, failing={("m/two", "c2", 1): ["wrong_code"]})
    assert compare_runs.compare(before, after) == 1
    out = capsys.readouterr().out
    lines = lines_by_case(out)
    assert len(lines) == 16
    assert len([line for line in out.splitlines() if line.split()[:1] in (["PASS"], ["NEW_FAILURE"])]) == 16
    assert [key for key, (label, _) in lines.items() if label == "NEW_FAILURE"] == [("m/two", "c2", 1)]


@pytest.mark.parametrize("before_failing, after_failing, expected", [
    ({}, {}, 0),
    ({("m/one", "c1", 0): ["wrong_code"]}, {}, 0),                                  # RECOVERED
    ({("m/one", "c1", 0): ["wrong_code"]}, {("m/one", "c1", 0): ["wrong_code"]}, 0),  # STILL_FAILING
    ({("m/one", "c1", 0): ["wrong_code"]}, {("m/one", "c1", 0): ["invalid_json"]}, 0),
    ({}, {("m/two", "c4", 0): ["wrong_code"]}, 1),                                  # NEW_FAILURE
    ({("m/one", "c1", 0): ["wrong_code"]}, {("m/two", "c1", 0): ["wrong_code"]}, 1),
])
def test_compare_exit_is_1_iff_new_failure(capsys, before_failing, after_failing, expected):
    result = compare_runs.compare(make_record(failing=before_failing), make_record(failing=after_failing))
    assert result == expected
    labels = [label for label, _ in lines_by_case(capsys.readouterr().out).values()]
    assert len(labels) == 8
    assert ("NEW_FAILURE" in labels) is (expected == 1)


def test_compare_allows_instructions_difference(capsys):
    after = make_record()
    after["config"]["instructions"] = "Completely different instructions."
    assert compare_runs.compare(make_record(), after) == 0
    assert len(lines_by_case(capsys.readouterr().out)) == 8


@pytest.mark.parametrize("key, value", [
    ("models", ["m/two", "m/one"]),
    ("cases", [{"id": c, "question": "changed"} for c in CASE_IDS]),
    ("tool", {"type": "web_search", "max_results": 10}),
    ("response_format", None),
    ("repeats", 2),
    ("max_steps", 6),
    ("max_output_tokens", 1024),
    ("timeout_seconds", 60),
    ("temperature", 0),  # a key only one side has
])
def test_compare_rejects_config_difference(key, value):
    before, after = make_record(), make_record()
    after["config"][key] = value
    with pytest.raises(ValueError, match=key):
        compare_runs.compare(before, after)
    with pytest.raises(ValueError, match=key):
        compare_runs.compare(after, before)


def test_compare_rejects_missing_config_key():
    before, after = make_record(), make_record()
    del after["config"]["max_steps"]
    with pytest.raises(ValueError, match="max_steps"):
        compare_runs.compare(before, after)


def test_compare_rejects_none_valued_key_vs_missing_key():
    before, after = make_record(), make_record()
    before["config"]["seed"] = None
    with pytest.raises(ValueError, match="seed"):
        compare_runs.compare(before, after)


@pytest.mark.parametrize("before_label, after_label", [
    ("synthetic", None), (None, "synthetic"), ("synthetic", "live"), ("replay", "live"),
])
def test_compare_rejects_evidence_mismatch(before_label, after_label):
    before, after = make_record(), make_record()
    if before_label:
        before["evidence"] = before_label
    if after_label:
        after["evidence"] = after_label
    with pytest.raises(ValueError, match="evidence"):
        compare_runs.compare(before, after)


@pytest.mark.parametrize("before_label, after_label", [(None, "live"), ("synthetic", "synthetic"), ("live", None)])
def test_compare_accepts_matching_evidence(before_label, after_label, capsys):
    before, after = make_record(), make_record()
    if before_label:
        before["evidence"] = before_label
    if after_label:
        after["evidence"] = after_label
    assert compare_runs.compare(before, after) == 0


@pytest.mark.parametrize("field", ["sdk_version", "code_sha256"])
def test_compare_caution_when_versions_differ(field, capsys):
    after = make_record()
    after[field] = "something-else"
    assert compare_runs.compare(make_record(), after) == 0
    caution = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CAUTION")]
    assert len(caution) == 1
    assert field in caution[0]


def test_compare_no_caution_when_versions_equal(capsys):
    assert compare_runs.compare(make_record(), make_record()) == 0
    assert "CAUTION" not in capsys.readouterr().out


def test_compare_caution_for_both(capsys):
    after = make_record(sdk_version="9.9.9", code_sha256="b" * 64)
    compare_runs.compare(make_record(), after)
    out = capsys.readouterr().out
    assert "CAUTION" in out and "sdk_version" in out and "code_sha256" in out


@pytest.mark.parametrize("before, after", [
    (None, "good"), ("good", None), ([], "good"), ("good", []), ("text", "good"), ("good", 1),
    ({"runs": []}, "good"), ("good", {"config": {}}), ({"config": [], "runs": []}, "good"),
    ("good", {"config": {}, "runs": {}}),
], ids=repr)
def test_compare_rejects_non_records(before, after):
    good = make_record()
    before = good if before == "good" else before
    after = copy.deepcopy(good) if after == "good" else after
    with pytest.raises(ValueError):
        compare_runs.compare(before, after)


@pytest.mark.parametrize("broken", ["before", "after"])
def test_compare_indexes_both_sides(broken):
    records = {"before": make_record(), "after": make_record()}
    del records[broken]["runs"][0]
    with pytest.raises(ValueError):
        compare_runs.compare(records["before"], records["after"])


# ====================================================================== demo

def test_demo(tmp_path, capsys):
    folder = tmp_path / "d"
    assert compare_runs.demo(str(folder)) == 1
    out = capsys.readouterr().out
    assert "synthetic" in out.lower()
    assert sorted(os.listdir(folder)) == ["after.json", "before.json"]
    records = {}
    for name in ("before.json", "after.json"):
        path = folder / name
        assert os.stat(path).st_mode & 0o777 == 0o600
        records[name] = json.loads(path.read_text(encoding="utf-8"))
        assert records[name]["evidence"] == "synthetic"
    labels = [line.split()[0] for line in out.splitlines()
              if line.split()[:1] in (["NEW_FAILURE"], ["PASS"], ["RECOVERED"], ["STILL_FAILING"])]
    assert sorted(labels) == ["NEW_FAILURE", "PASS", "PASS", "PASS"]
    new_failure = [line for line in out.splitlines() if line.startswith("NEW_FAILURE")]
    assert len(new_failure) == 1
    assert "ambiguous-payment" in new_failure[0]
    assert "wrong_code" in new_failure[0] and "wrong_next_action" in new_failure[0]
    # the saved records compare the same way
    assert compare_runs.compare(records["before.json"], records["after.json"]) == 1


def test_demo_records_graded_by_real_checker(tmp_path, capsys):
    folder = tmp_path / "d"
    compare_runs.demo(str(folder))
    before = json.loads((folder / "before.json").read_text(encoding="utf-8"))
    after = json.loads((folder / "after.json").read_text(encoding="utf-8"))
    cases = {case["id"]: case for case in regression.CASES}
    for record in (before, after):
        compare_runs.index(record)
        assert [case["id"] for case in record["config"]["cases"]] == list(cases)
        for row in record["runs"]:
            assert row["reasons"] == regression.check(cases[row["case_id"]], row["response"], row["answer_text"])
    payment = [row for row in after["runs"] if row["case_id"] == "ambiguous-payment"][0]
    assert payment["reasons"] == ["wrong_code", "wrong_next_action"]
    assert all(row["passed"] for row in before["runs"])
    assert before["config"]["instructions"] != after["config"]["instructions"]


def test_demo_refuses_existing_folder(tmp_path, capsys):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "keep.txt").write_text("keep", encoding="utf-8")
    with pytest.raises(ValueError):
        compare_runs.demo(str(folder))
    assert sorted(os.listdir(folder)) == ["keep.txt"]
    assert compare_runs.main(["--demo", str(folder)]) == 2
    captured = capsys.readouterr()  # a folder problem, not a comparison: one error line
    assert captured.out == "" and captured.err.startswith("compare_runs.py: error: --demo: ")
    assert sorted(os.listdir(folder)) == ["keep.txt"]


def test_demo_refuses_existing_empty_folder(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    with pytest.raises(ValueError):
        compare_runs.demo(str(folder))
    assert os.listdir(folder) == []


# ====================================================================== main

def not_comparable(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    assert out[0].startswith("NOT_COMPARABLE: ")
    assert len(out[0]) > len("NOT_COMPARABLE: ")
    return out[0]


def test_main_compares_files(tmp_path, capsys):
    before = write(tmp_path / "b.json", make_record())
    after = write(tmp_path / "a.json", make_record(failing={("m/one", "c2", 0): ["wrong_code"]}))
    assert compare_runs.main([before, after]) == 1
    assert lines_by_case(capsys.readouterr().out)[("m/one", "c2", 0)][0] == "NEW_FAILURE"
    assert compare_runs.main([before, before]) == 2  # one file twice: nothing compared (test_run_control.py)


def test_main_missing_file(tmp_path, capsys):
    good = write(tmp_path / "b.json", make_record())
    assert compare_runs.main([good, str(tmp_path / "missing.json")]) == 2
    not_comparable(capsys)
    assert compare_runs.main([str(tmp_path / "missing.json"), good]) == 2
    not_comparable(capsys)


@pytest.mark.parametrize("content", [
    "not json", "", "{", "[]", "[1, 2]", '"record"', "null", "42",
    json.dumps({"runs": []}),  # no config
    json.dumps({"config": {"models": ["m"]}}),  # no runs
    json.dumps({"config": [], "runs": []}),
], ids=repr)
def test_main_bad_content(tmp_path, capsys, content):
    good = write(tmp_path / "b.json", make_record())
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    assert compare_runs.main([good, str(bad)]) == 2
    not_comparable(capsys)
    assert compare_runs.main([str(bad), good]) == 2
    not_comparable(capsys)


def test_main_config_mismatch(tmp_path, capsys):
    other = make_record()
    other["config"]["max_steps"] = 9
    assert compare_runs.main([write(tmp_path / "b.json", make_record()), write(tmp_path / "a.json", other)]) == 2
    assert "max_steps" in not_comparable(capsys)


def test_main_incomplete_record(tmp_path, capsys):
    other = make_record()
    del other["runs"][2]
    assert compare_runs.main([write(tmp_path / "b.json", make_record()), write(tmp_path / "a.json", other)]) == 2
    not_comparable(capsys)


def test_main_record_with_error_row(tmp_path, capsys):
    other = make_record()
    other["runs"][0].update(error="RateLimitError", error_status=429, reasons=["execution_error"], passed=False)
    assert compare_runs.main([write(tmp_path / "b.json", make_record()), write(tmp_path / "a.json", other)]) == 2
    not_comparable(capsys)


@pytest.mark.parametrize("argv", [
    ["b.json", "a.json", "--demo", "d"], ["--demo", "d", "b.json"], ["--demo", "d", "b.json", "a.json"],
    ["--no-such-flag"],
])
def test_main_usage_errors(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        compare_runs.main(argv)
    assert exc.value.code == 2
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv", [[], ["only-one.json"], ["a.json", "b.json", "c.json"]])
def test_main_wrong_number_of_records_is_exit_2(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    for name in argv:
        write(tmp_path / name, make_record())
    try:
        code = compare_runs.main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2


def _real_record_file(path, record):
    """Write a record the way regression.py does (header, rows, summary last)."""
    header = {key: value for key, value in record.items() if key not in ("runs", "summary")}
    models, repeats = record["config"]["models"], record["config"]["repeats"]
    summary = regression.summary(record["runs"], models, repeats, record["config"]["cases"])
    writer = regression.create_record(str(path), header, record["runs"], summary)
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("tail", [b'"summary": {"com', b'"summary": ', b'"summary": {"complete": true, "rows": 8'])
def test_main_reads_torn_record(tmp_path, capsys, tail):
    before_path = tmp_path / "before.json"
    data = _real_record_file(before_path, make_record())
    cut = data.rindex(b'"summary": ')
    torn = tmp_path / "torn.json"
    torn.write_bytes(data[:cut] + tail)
    with pytest.raises(json.JSONDecodeError):
        json.loads(torn.read_bytes())
    after = write(tmp_path / "after.json", make_record(failing={("m/two", "c4", 0): ["wrong_code"]}))
    assert compare_runs.main([str(torn), after, "--all"]) == 1
    lines = lines_by_case(capsys.readouterr().out)
    assert len(lines) == 8
    assert lines[("m/two", "c4", 0)][0] == "NEW_FAILURE"


def test_main_torn_record_missing_rows_is_not_comparable(tmp_path, capsys):
    data = _real_record_file(tmp_path / "before.json", make_record())
    cut = data.index(b'"case_id": "c3"')
    torn = tmp_path / "torn.json"
    torn.write_bytes(data[:cut])
    assert compare_runs.main([str(torn), write(tmp_path / "a.json", make_record())]) == 2
    assert "incomplete" in not_comparable(capsys)


def test_main_demo(tmp_path, capsys):
    folder = tmp_path / "demo"
    assert compare_runs.main(["--demo", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "synthetic" in out.lower()
    assert (folder / "before.json").exists() and (folder / "after.json").exists()


# ====================================================================== subprocess

def clean_env():
    return {key: value for key, value in os.environ.items() if not key.startswith("PERPLEXITY_")}


def test_demo_subprocess(tmp_path):
    folder = tmp_path / "demo"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--demo", str(folder)], cwd=HERE, env=clean_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert "NEW_FAILURE" in proc.stdout and "ambiguous-payment" in proc.stdout
    assert "synthetic" in proc.stdout.lower()
    assert proc.stderr == ""
    assert sorted(os.listdir(folder)) == ["after.json", "before.json"]


def test_demo_subprocess_does_not_import_sdk(tmp_path):
    folder = tmp_path / "demo"
    env = clean_env()
    env["PYTHONPATH"] = str(HERE)
    code = ("import sys, compare_runs; rc = compare_runs.main(['--demo', sys.argv[1]]); "
            "print('RESULT', rc, any(m == 'perplexity' or m.startswith('perplexity.') for m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "RESULT 1 False"


def test_script_compare_subprocess_does_not_import_sdk(tmp_path):
    before = write(tmp_path / "b.json", make_record())
    after = write(tmp_path / "a.json", make_record(failing={("m/one", "c1", 0): ["wrong_code"]}))
    proc = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPT), before, after], cwd=HERE,
                          env=clean_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    assert "regression" in imported
    assert not [name for name in imported if name.split(".")[0] == "perplexity"]


def _compare_cli(tmp_path, before, after, *flags):
    """python -W error compare_runs.py BEFORE AFTER FLAGS as a subprocess."""
    files = [write(tmp_path / "before.json", before), write(tmp_path / "after.json", after)]
    return subprocess.run([sys.executable, "-W", "error", str(SCRIPT), *files, *flags], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=60)


def _typed_tool_record():
    record = make_record()
    record["config"]["tool"] = {"type": "function", "name": "lookup", "strict": True,
                                "parameters": {"type": "object", "additionalProperties": False}}
    record["config"]["request"] = {"store": False}
    return record


@pytest.mark.parametrize("mutate, path", [
    (lambda config: config["tool"].update(strict=1), "tool.strict differs: true -> 1"),
    (lambda config: config["tool"]["parameters"].update(additionalProperties=0),
     "tool.parameters.additionalProperties differs: false -> 0"),
    (lambda config: config["request"].update(store=0), "request.store differs: false -> 0"),
    (lambda config: config.update(max_output_tokens=4096.0), "max_output_tokens differs: 4096 -> 4096.0"),
])
@pytest.mark.parametrize("flags", [[], ["--matrix"]])
def test_config_differing_only_in_a_json_type_is_not_comparable(tmp_path, mutate, path, flags):
    """Python's == calls true, 1 and 1.0 equal; a tool schema or request that sends `1` for `true`
    is another config. It said "no new failure" (exit 0)."""
    before = _typed_tool_record()
    after = copy.deepcopy(before)
    mutate(after["config"])
    proc = _compare_cli(tmp_path, before, after, *flags)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"NOT_COMPARABLE: {path} (only the instructions may differ)" in proc.stdout


def test_config_differing_only_in_key_order_stays_comparable(tmp_path):
    before = _typed_tool_record()
    after = copy.deepcopy(before)
    after["config"]["tool"] = dict(reversed(list(after["config"]["tool"].items())))
    proc = _compare_cli(tmp_path, before, after)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("old, new, shown", [
    ("q caf\u00e9", "q cafe\u0301", '"q caf\\xe9" -> "q cafe\\u0301"'),  # NFC against NFD
    ("q c\u0061t", "q c\u0430t", '"q cat" -> "q c\\u0430t"'),  # a Cyrillic a for a Latin one
])
def test_not_comparable_shows_code_points_where_two_values_read_alike(tmp_path, old, new, shown):
    """Two questions that differ only in Unicode normalisation were named as "q café" -> "q café"."""
    before = make_record()
    after = copy.deepcopy(before)
    before["config"]["cases"][0]["question"], after["config"]["cases"][0]["question"] = old, new
    proc = _compare_cli(tmp_path, before, after)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == f'NOT_COMPARABLE: cases["c1"].question differs: {shown} (only the instructions may differ)\n'
