"""Everyday flows end to end (issue 14 and the --update-baseline part of issue 11):
baselines that keep the suite's formatting and refuse failing answers, comparisons that
name what differs, regrades, scaling output, reports that read well, and README flows.

Offline: the CLI runs in-process (regression.main / compare_runs.main) or as a subprocess
with --provider echo / replay; no network at all."""

import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compare_runs
import regression

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
COMPARE = HERE / "compare_runs.py"
SECRET_ENV = ("PERPLEXITY_", "OPENAI_", "REGRESSION_")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(SECRET_ENV):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def offline_env():
    return {name: value for name, value in os.environ.items() if not name.startswith(SECRET_ENV)}


def run_script(script, args, cwd, timeout=60):
    return subprocess.run([sys.executable, "-W", "error", str(script), *args], cwd=cwd, env=offline_env(),
                          capture_output=True, text=True, timeout=timeout)


def run_main(main, argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(result_code, err, code=2):
    assert result_code == code, err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err


def no_temp_files(folder):
    return [name for name in os.listdir(folder) if name.endswith(".tmp")] == []


# ====================================================================== edit_json_strings

JSON_KEYS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                st.dictionaries(JSON_KEYS, inner, max_size=4)),
                           max_leaves=20)
LAYOUTS = [dict(indent=None), dict(indent=2), dict(indent=4, ensure_ascii=False), dict(indent="\t"),
           dict(separators=(",", ":")), dict(indent=1, separators=(" ,", " : "), ensure_ascii=False)]


def string_paths(value, path=()):
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from string_paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_paths(item, path + (index,))


def set_path(value, path, new):
    for part in path[:-1]:
        value = value[part]
    value[path[-1]] = new


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON_VALUES, layout=st.sampled_from(LAYOUTS), data=st.data(),
       new=st.one_of(st.text(max_size=20), st.sampled_from(["a\ud800b", "\udfff", "\u2028\x00\"\\"])))
def test_edit_json_strings_changes_only_the_named_values(value, layout, new, data):
    document = {"cases": [value, {"expected_text": ""}], "tail": value}
    text = json.dumps(document, **layout)
    paths = list(string_paths(document))
    chosen = data.draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True))
    edits = {path: new + str(n) for n, path in enumerate(chosen)}
    result = regression.edit_json_strings(text, edits)
    expected = json.loads(text)
    for path, replacement in edits.items():
        set_path(expected, path, replacement)
    assert json.loads(result) == expected
    result.encode("utf-8")  # always writable, even with a lone surrogate in a replacement
    # Outside the edited values every character is kept: the result is the original text
    # with exactly the spans of the named values swapped for their new JSON strings.
    spans = sorted((span, path) for path, span in regression._value_spans(text, set(edits)).items())
    rebuilt, position = "", 0
    for (start, end), path in spans:
        assert isinstance(json.loads(text[start:end]), str)
        rebuilt += text[position:start] + encoded(edits[path])
        position = end
    assert result == rebuilt + text[position:]


def encoded(string):
    if any(0xD800 <= ord(char) <= 0xDFFF for char in string):
        return json.dumps(string)
    return json.dumps(string, ensure_ascii=False)


@pytest.mark.parametrize("text, path, fragment", [
    ('{"cases": [{"expected_text": 3}]}', ("cases", 0, "expected_text"), "not a string"),
    ('{"cases": [{"expected_text": ""}]}', ("cases", 1, "expected_text"), "not in the JSON text"),
    ('{"cases": [{"id": "a"}]}', ("cases", 0, "expected_text"), "not in the JSON text"),
    ('{"a": "x", "a": "y"}', ("a",), "appears twice"),
    ('{"a": "x"', ("a",), "Expecting"),
    ('{"a": ["x"]}', ("a",), "not a string"),
])
def test_edit_json_strings_refuses_what_it_cannot_edit(text, path, fragment):
    with pytest.raises(ValueError, match=fragment):
        regression.edit_json_strings(text, {path: "new"})


def test_edit_json_strings_keeps_escapes_and_layout_of_untouched_values():
    text = ('{\n  "name":"caf\\u00e9" ,\n  "cases" : [ {"id":"a","expected_text" : "" , "x":[1,2.50,1e3]},\n'
            '    {"id": "b", "expected_text": "kept \\/ as written"} ]\n}\n')
    result = regression.edit_json_strings(text, {("cases", 0, "expected_text"): 'new "quoted"\nline'})
    assert result == text.replace('"expected_text" : ""', '"expected_text" : "new \\"quoted\\"\\nline"')


# ====================================================================== --update-baseline

BASELINE_SUITE = """{
    "name" : "baselines",
    "notes": "caf\\u00e9 \\u2013 hand formatted; keys in a human order",
    "instructions": "Echo.",
    "cases": [
        {"id": "fresh", "input": "Annual plans can be refunded within 30 days.",
         "expected_text": "", "min_similarity": 0.9},
        {"id": "pinned",   "input": "Hello there", "expected_text": "A reviewed answer.", "min_similarity": 0.0},
        {"id": "strict", "input": "We offer lifetime refunds.", "expected_text": "",
         "min_similarity": 0.5, "excludes": ["lifetime"]}
    ]
}
"""


def baseline_suite(tmp_path, text=BASELINE_SUITE, name="suite.json"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_update_baseline_refuses_a_failing_answer_through_the_cli(tmp_path):
    path = baseline_suite(tmp_path)
    before = path.read_bytes()
    result = run_script(SCRIPT, ["--suite", str(path), "--provider", "echo", "--update-baseline",
                                 "--out", "r1.json"], tmp_path)
    err = one_line_error(result.returncode, result.stderr)
    assert "'strict'" in err and "forbidden_text_present" in err and "--approve-failing" in err
    assert "'fresh'" not in err  # only the failing case is named
    assert path.read_bytes() == before  # fully old: not even the passing case was filled
    assert no_temp_files(tmp_path)
    assert json.loads((tmp_path / "r1.json").read_text())["summary"]["complete"] is True

    approved = run_script(SCRIPT, ["--suite", str(path), "--provider", "echo", "--update-baseline",
                                   "--approve-failing", "--out", "r2.json"], tmp_path)
    assert approved.returncode == 1, approved.stderr  # the run itself failed a check
    assert "baselines filled: fresh, strict" in approved.stdout
    after = path.read_text(encoding="utf-8")
    # Only the two baseline strings changed: every other byte (spacing, escapes, key order) is kept.
    assert after == BASELINE_SUITE.replace(
        '"expected_text": "", "min_similarity": 0.9',
        '"expected_text": "Annual plans can be refunded within 30 days.", "min_similarity": 0.9').replace(
        '"expected_text": "",\n', '"expected_text": "We offer lifetime refunds.",\n')
    assert no_temp_files(tmp_path)


def test_approve_failing_without_update_baseline_is_a_usage_error(tmp_path, capsys):
    path = baseline_suite(tmp_path)
    code, _, err = run_main(regression.main, ["--suite", str(path), "--provider", "echo", "--approve-failing"],
                            capsys)
    assert "--approve-failing" in one_line_error(code, err) and os.listdir(tmp_path) == ["suite.json"]


def test_update_baseline_writes_through_a_symlink(tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    real = baseline_suite(real_dir, BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]'))
    os.chmod(real, 0o640)
    link = tmp_path / "suite.json"
    link.symlink_to(real)
    result = run_script(SCRIPT, ["--suite", str(link), "--provider", "echo", "--update-baseline",
                                 "--out", "r.json"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    data = json.loads(real.read_text(encoding="utf-8"))
    assert [case["expected_text"] for case in data["cases"]] == [
        "Annual plans can be refunded within 30 days.", "A reviewed answer.", "We offer lifetime refunds."]
    assert oct(real.stat().st_mode & 0o7777) == "0o640"
    assert no_temp_files(real_dir) and no_temp_files(tmp_path)


def test_update_baseline_with_a_lone_surrogate_answer_is_one_line_exit_2(tmp_path):
    text = BASELINE_SUITE.replace("We offer lifetime refunds.", "broken \\ud800 text").replace(
        '"excludes": ["lifetime"]', '"excludes": ["never"]')
    path = baseline_suite(tmp_path, text)
    result = run_script(SCRIPT, ["--suite", str(path), "--provider", "echo", "--update-baseline",
                                 "--out", "r.json"], tmp_path)
    err = one_line_error(result.returncode, result.stderr)
    assert "surrogate" in err  # a suite holding one is now refused before the run (test_trust.py)
    assert path.read_text(encoding="utf-8") == text and no_temp_files(tmp_path)


def _fail_writes_to_temp(monkeypatch, error):
    original = regression._pwrite_all

    def pwrite_all(fd, data, offset):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise error
        return original(fd, data, offset)
    monkeypatch.setattr(regression, "_pwrite_all", pwrite_all)


FAULTS = {
    "disk-full": lambda mp: _fail_writes_to_temp(mp, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
    "unwritable-folder": lambda mp: mp.setattr("tempfile.mkstemp", lambda *a, **k: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, os.strerror(errno.EACCES)))),
    "rename-fails": lambda mp: mp.setattr(regression.os, "replace", lambda *a: (_ for _ in ()).throw(
        OSError(errno.EXDEV, os.strerror(errno.EXDEV)))),
    "interrupted": lambda mp: _fail_writes_to_temp(mp, KeyboardInterrupt()),
}


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc to name a file descriptor")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_update_baseline_fault_leaves_the_suite_fully_old_and_no_temp(tmp_path, capsys, monkeypatch, fault):
    text = BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]')
    path = baseline_suite(tmp_path, text)
    FAULTS[fault](monkeypatch)
    argv = ["--suite", str(path), "--provider", "echo", "--update-baseline", "--out", "r.json"]
    if fault == "interrupted":
        with pytest.raises(KeyboardInterrupt):
            regression.main(argv)
    else:
        code, out, err = run_main(regression.main, argv, capsys)
        err = one_line_error(code, err)
        assert "is unchanged" in err and str(path) in err
    assert path.read_text(encoding="utf-8") == text
    assert no_temp_files(tmp_path)
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["complete"] is True  # the record is kept


def test_a_stale_pid_named_temp_file_does_not_block_the_rewrite(tmp_path, capsys):
    path = baseline_suite(tmp_path, BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]'))
    stale = tmp_path / f"suite.json.{os.getpid()}.tmp"
    stale.write_text("stale", encoding="utf-8")
    code, out, err = run_main(regression.main, ["--suite", str(path), "--provider", "echo", "--update-baseline",
                                                "--out", "r.json"], capsys)
    assert code == 0, err
    assert "baselines filled: fresh, strict" in out
    assert stale.read_text(encoding="utf-8") == "stale"


def test_update_baseline_on_the_shipped_suite_changes_one_line_per_baseline(tmp_path, capsys):
    source = (HERE / "suites" / "support-guardrails.json").read_text(encoding="utf-8")
    data = json.loads(source)
    target = next(n for n, case in enumerate(data["cases"]) if "expected_text" in case)
    old = json.dumps(data["cases"][target]["expected_text"], ensure_ascii=False)
    assert source.count(old) == 1
    text = source.replace(old, '""')
    path = baseline_suite(tmp_path, text)
    edited = regression.edit_json_strings(text, {("cases", target, "expected_text"): "A new baseline."})
    changed = [(a, b) for a, b in zip(text.splitlines(), edited.splitlines()) if a != b]
    assert len(text.splitlines()) == len(edited.splitlines()) and len(changed) == 1
    assert '"A new baseline."' in changed[0][1]
    assert path.exists()
