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
import fakes
import regression
from testkit import model_echo  # noqa: F401 (a fixture: a model's evidence, which baselines need)

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
    """`python -W error SCRIPT ARGS`, forked from a -W error zygote (fakes.run_script): the real
    CLI; the README's commands as written (readme_run) start their own interpreter."""
    return fakes.run_script(args, cwd, offline_env(), timeout=timeout, script=str(script),
                            flags=("-W", "error"))


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
        {"id": "pinned",   "input": "Hello there", "expected_text": "A reviewed answer.",
         "min_similarity": 0.0, "min_chars": 1},
        {"id": "strict", "input": "We offer lifetime refunds.", "expected_text": "",
         "min_similarity": 0.5, "excludes": ["lifetime"]}
    ]
}
"""


def baseline_suite(tmp_path, text=BASELINE_SUITE, name="suite.json"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


FRESH_FILLED = BASELINE_SUITE.replace(
    '"expected_text": "", "min_similarity": 0.9',
    '"expected_text": "Annual plans can be refunded within 30 days.", "min_similarity": 0.9')


def test_update_baseline_refuses_a_failing_answer_through_the_cli(tmp_path, model_echo):
    path = baseline_suite(tmp_path)
    result = run_script(SCRIPT, ["--suite", str(path), *model_echo, "--update-baseline",
                                 "--out", "r1.json"], tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [  # only the failing case is named, and why
        "baseline not filled: case 'strict': its answer failed forbidden_text_present "
        "(--approve-failing approves it anyway)"]
    assert "baselines filled: fresh (" in result.stdout
    assert path.read_text(encoding="utf-8") == FRESH_FILLED  # the passing case is filled anyway
    assert no_temp_files(tmp_path)
    assert json.loads((tmp_path / "r1.json").read_text())["summary"]["complete"] is True

    approved = run_script(SCRIPT, ["--suite", str(path), *model_echo, "--update-baseline",
                                   "--approve-failing", "--out", "r2.json"], tmp_path)
    assert approved.returncode == 1, approved.stderr  # the run itself failed a check
    assert "baselines filled: strict" in approved.stdout
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


def test_update_baseline_writes_through_a_symlink(tmp_path, model_echo):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    real = baseline_suite(real_dir, BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]'))
    os.chmod(real, 0o640)
    link = tmp_path / "suite.json"
    link.symlink_to(real)
    result = run_script(SCRIPT, ["--suite", str(link), *model_echo, "--update-baseline",
                                 "--out", "r.json"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    data = json.loads(real.read_text(encoding="utf-8"))
    assert [case["expected_text"] for case in data["cases"]] == [
        "Annual plans can be refunded within 30 days.", "A reviewed answer.", "We offer lifetime refunds."]
    assert oct(real.stat().st_mode & 0o7777) == "0o640"
    assert no_temp_files(real_dir) and no_temp_files(tmp_path)


def test_update_baseline_never_writes_a_lone_surrogate_answer(tmp_path, model_echo):
    text = BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]')
    path = baseline_suite(tmp_path, text)
    # A model answer holding a lone surrogate (a JSON escape no UTF-8 file can hold), replayed.
    plain = {"name": "plain", "instructions": "Echo.",
             "cases": [{"id": case["id"], "input": case["input"]} for case in json.loads(text)["cases"]]}
    (tmp_path / "plain.json").write_text(json.dumps(plain), encoding="utf-8")
    made = run_script(SCRIPT, ["--suite", "plain.json", *model_echo, "--out", "r0.json"], tmp_path)
    assert made.returncode == 0, made.stderr
    record = (tmp_path / "r0.json").read_text(encoding="utf-8")
    assert record.count('"We offer lifetime refunds."') >= 2  # the response and the answer
    (tmp_path / "r0.json").write_text(record.replace('"We offer lifetime refunds."', '"broken \\ud800 text"'),
                                      encoding="utf-8")
    result = run_script(SCRIPT, ["--suite", str(path), "--provider", "replay", "--replay", "r0.json",
                                 "--update-baseline", "--out", "r.json"], tmp_path)
    # that case is listed as not filled (exit 1); the others are filled (a suite holding one is
    # refused before a run: test_trust.py)
    err = one_line_error(result.returncode, result.stderr, code=1)
    assert err == ("baseline not filled: case 'strict': the answer holds a lone surrogate "
                   "(not text a suite file can hold)\n")
    assert json.loads(path.read_text(encoding="utf-8"))["cases"][2]["expected_text"] == ""
    assert no_temp_files(tmp_path)


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
def test_update_baseline_fault_leaves_the_suite_fully_old_and_no_temp(tmp_path, model_echo, capsys,
                                                                      monkeypatch, fault):
    text = BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]')
    path = baseline_suite(tmp_path, text)
    FAULTS[fault](monkeypatch)
    argv = ["--suite", str(path), *model_echo, "--update-baseline", "--out", "r.json"]
    if fault == "interrupted":  # main saves and explains; cli prints .message and exits with .code
        with pytest.raises(KeyboardInterrupt) as interrupt:
            regression.main(argv)
        assert interrupt.value.code == 130
        err = interrupt.value.message + "\n"
        assert "r.json is complete" in err
    else:
        code, out, err = run_main(regression.main, argv, capsys)
        err = one_line_error(code, err)
    assert "is unchanged" in err and str(path) in err and err.count("\n") == 1
    assert path.read_text(encoding="utf-8") == text
    assert no_temp_files(tmp_path)
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["complete"] is True  # the record is kept


def test_update_baseline_keeps_windows_line_endings_and_tabs(tmp_path, model_echo, capsys):
    text = BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]').replace("    ", "\t")
    path = tmp_path / "suite.json"
    path.write_bytes(text.replace("\n", "\r\n").encode("utf-8"))
    code, out, err = run_main(regression.main, ["--suite", str(path), *model_echo,
                                                "--update-baseline",
                                                "--out", "r.json"], capsys)
    assert code == 0, err
    after = path.read_bytes().decode("utf-8")
    assert after.count("\r\n") == text.count("\n") and after.count("\n") == text.count("\n")
    assert after.replace("\r\n", "\n") == text.replace('"expected_text": "", "min', '"expected_text": '
                                                        '"Annual plans can be refunded within 30 days.", "min').replace(
        '"expected_text": "",\n', '"expected_text": "We offer lifetime refunds.",\n')


def test_update_baseline_refuses_while_another_process_rewrites_the_suite(tmp_path, model_echo):
    import fcntl
    text = BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]')
    path = baseline_suite(tmp_path, text)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a concurrent --update-baseline holds it
        result = run_script(SCRIPT, ["--suite", "suite.json", *model_echo, "--update-baseline",
                                     "--out", "r.json"], tmp_path)
    finally:
        os.close(fd)
    err = one_line_error(result.returncode, result.stderr)
    assert "being rewritten by another process" in err and "suite.json" in err
    assert path.read_text(encoding="utf-8") == text and no_temp_files(tmp_path)
    again = run_script(SCRIPT, ["--suite", "suite.json", *model_echo, "--update-baseline",
                                "--out", "r2.json"], tmp_path)
    assert again.returncode == 0 and "baselines filled: fresh, strict" in again.stdout  # once it is released


def test_a_stale_pid_named_temp_file_does_not_block_the_rewrite(tmp_path, model_echo, capsys):
    path = baseline_suite(tmp_path, BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]'))
    stale = tmp_path / f"suite.json.{os.getpid()}.tmp"
    stale.write_text("stale", encoding="utf-8")
    code, out, err = run_main(regression.main, ["--suite", str(path), *model_echo,
                                                "--update-baseline",
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


# ====================================================================== comparisons: records

def make_row(model, case_id, repeat=0, reasons=(), answer="{}", error=None):
    reasons = list(reasons)
    return {"case_id": case_id, "model": model, "repeat": repeat, "error": error, "error_status": None,
            "cost_usd": "0.001", "response": {"status": "completed", "text": answer}, "answer_text": answer,
            "reasons": reasons, "seconds": 0.5, "passed": not reasons}


def make_record(models=("m/one",), case_ids=("c1", "c2"), repeats=1, failing=None, answers=None, **top):
    failing, answers = failing or {}, answers or {}
    rows = [make_row(m, c, r, failing.get((m, c, r), ()), answers.get((m, c, r), "{}"))
            for r in range(repeats) for c in case_ids for m in models]
    record = {"created_at": "2026-01-01T00:00:00+00:00",
              "config": {"models": list(models), "cases": [{"id": c, "input": f"q {c}"} for c in case_ids],
                         "instructions": "Be careful.", "tool": None, "response_format": None,
                         "repeats": repeats, "max_steps": 5, "max_output_tokens": 4096, "timeout_seconds": 180},
              "sdk_version": None, "code_sha256": "a" * 64, "evidence": "echo", "runs": rows,
              "summary": {"exit_code": 0}}
    record.update(top)
    return record


def write_json(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def compare_cli(tmp_path, before, after, *flags):
    paths = write_json(tmp_path / "before.json", before), write_json(tmp_path / "after.json", after)
    return run_script(COMPARE, [*paths, *flags], tmp_path)


def compare_in_process(tmp_path, capsys, before, after, *flags):
    """compare_runs.main in-process (fast); returns an object like a CompletedProcess."""
    paths = write_json(tmp_path / "before.json", before), write_json(tmp_path / "after.json", after)
    code, out, err = run_main(compare_runs.main, [*paths, *flags], capsys)
    return subprocess.CompletedProcess([], code, out, err)


def _with_case(record, case_id, **changes):
    for case in record["config"]["cases"]:
        if case["id"] == case_id:
            case.update(changes)
    return record


# ====================================================================== 14.1 / 14.2: what may differ, and naming what does

def before_tools(record):
    return record


def _mutated(mutate):
    record = make_record(case_ids=("refund-policy", "c2"), suite={"name": "s", "builtin": False})
    _with_case(record, "refund-policy", contains=["30 days"])
    record["config"]["tools"] = [{"type": "function", "function": {"name": "b"}}]
    mutate(record)
    return record


NOT_COMPARABLE = [
    ("contains", lambda r: _with_case(r, "refund-policy", contains=["30 days", "annual"]),
     'cases["refund-policy"].contains differs: ["30 days"] -> ["30 days", "annual"]'),
    ("input", lambda r: _with_case(r, "c2", input="other"), 'cases["c2"].input differs: "q c2" -> "other"'),
    ("case-added", lambda r: r["config"]["cases"].append({"id": "new", "input": "x"}),
     'cases["new"] differs: (absent) -> {"id": "new", "input": "x"}'),
    ("case-order", lambda r: r["config"]["cases"].reverse(),
     'cases order differs: ["refund-policy", "c2"] -> ["c2", "refund-policy"]'),
    ("models", lambda r: r["config"].update(models=["m/two"]) or [row.update(model="m/two")
                                                                 for row in r["runs"]],
     'models differs: ["m/one"] -> ["m/two"]'),
    ("tools", lambda r: r["config"].update(tools=[{"type": "function", "function": {"name": "a"}}]) or
     before_tools(r), 'tools[0].function.name differs: "b" -> "a"'),
    ("repeats", lambda r: r["config"].update(repeats=2), "repeats differs: 1 -> 2"),
    ("tool", lambda r: r["config"].update(tool={"type": "web_search"}), 'tool differs: null -> {"type": "web_search"}'),
    ("key-added", lambda r: r["config"].update(max_rounds=3), "max_rounds differs: (absent) -> 3"),
    ("control-characters", lambda r: _with_case(r, "c2", input="a\x1b[2J\u202eb"),
     'cases["c2"].input differs: "q c2" -> "a\\u001b[2J\\u202eb"'),
]


@pytest.mark.parametrize("name, mutate, message", NOT_COMPARABLE, ids=[item[0] for item in NOT_COMPARABLE])
def test_not_comparable_names_the_first_differing_path_and_both_values(tmp_path, capsys, name, mutate, message):
    before, after = _mutated(lambda r: None), _mutated(mutate)
    paths = write_json(tmp_path / "b.json", before), write_json(tmp_path / "a.json", after)
    code, out, err = run_main(compare_runs.main, list(paths), capsys)
    assert code == 2 and err == ""
    assert out.count("\n") == 1 and out.startswith(f"NOT_COMPARABLE: {message}"), out


def test_not_comparable_through_the_cli_exact_line(tmp_path):
    before = _mutated(lambda r: None)
    after = _mutated(NOT_COMPARABLE[0][1])
    result = compare_cli(tmp_path, before, after)
    assert result.returncode == 2 and result.stderr == ""
    assert result.stdout.startswith('NOT_COMPARABLE: cases["refund-policy"].contains differs: '
                                    '["30 days"] -> ["30 days", "annual"]')
    assert "regrade" in result.stdout  # only checks differ: the way to compare is printed


def test_a_long_value_is_shortened_around_the_difference():
    old = "Checkout log: " + "x" * 200 + " status 503"
    new = old.replace("503", "504")
    path, a, b = compare_runs.first_difference({"input": old}, {"input": new})
    assert path == "input"
    shown_old, shown_new = compare_runs.shorten(a, b), compare_runs.shorten(b, a)
    assert "503" in shown_old and "504" in shown_new
    assert len(shown_old) <= compare_runs.SHORT + 10 and shown_old.startswith("...")


@settings(max_examples=60, deadline=None)
@given(a=JSON_VALUES, b=JSON_VALUES)
def test_first_difference_is_none_exactly_when_equal(a, b):
    found = compare_runs.first_difference(a, b)
    assert (found is None) == regression.same_json(a, b)  # JSON equality: true is not 1
    if found is not None:
        line = (f"{found[0]} differs: {compare_runs.shorten(found[1], found[2])} -> "
                f"{compare_runs.shorten(found[2], found[1])}")
        assert "\n" not in line and all(char.isprintable() for char in line)


@pytest.mark.parametrize("key, value", [("instructions_sha256", "b" * 64), ("notes", "changed by a reviewer")])
def test_pins_and_notes_may_differ_like_the_instructions(capsys, key, value):
    before = _with_case(make_record(), "c1", instructions_sha256="a" * 64)
    after = _with_case(make_record(), "c1", **{key: value})
    after["config"]["instructions"] = "Edited instructions."
    assert compare_runs.compare(before, after) == 0
    assert "NOT_COMPARABLE" not in capsys.readouterr().out


PINNED_SUITE = {"name": "pinned", "instructions": "You are a support agent.", "cases": [
    {"id": "refund-policy", "input": "Refunds within 30 days.", "contains": ["30 days"]},
    {"id": "password-reset", "input": "How do I reset my password?", "contains": ["reset"]}]}


def _pinned(instructions):
    import hashlib
    pin = hashlib.sha256(instructions.encode("utf-8")).hexdigest()
    return {**PINNED_SUITE, "instructions": instructions,
            "cases": [{**case, "instructions_sha256": pin} for case in PINNED_SUITE["cases"]]}


def test_edit_the_instructions_update_the_pins_then_compare(tmp_path):
    """Issue 14.1 through the real CLI: the pins follow the instructions, so compare accepts them."""
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(_pinned("You are a support agent."), indent=2), encoding="utf-8")
    first = run_script(SCRIPT, ["--suite", "suite.json", "--provider", "echo", "--out", "before.json"], tmp_path)
    assert first.returncode == 0, first.stderr
    suite.write_text(json.dumps(_pinned("You are a careful support agent."), indent=2), encoding="utf-8")
    second = run_script(SCRIPT, ["--suite", "suite.json", "--provider", "echo", "--out", "after.json"], tmp_path)
    assert second.returncode == 0, second.stderr
    compared = run_script(COMPARE, ["before.json", "after.json"], tmp_path)
    assert compared.returncode == 0, compared.stdout
    assert "PASS 2" in compared.stdout and "NOT_COMPARABLE" not in compared.stdout


# ====================================================================== 14.3: regrade

def test_regrade_a_record_with_a_changed_suite_then_compare(tmp_path):
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(PINNED_SUITE, indent=2), encoding="utf-8")
    first = run_script(SCRIPT, ["--suite", "suite.json", "--provider", "echo", "--out", "old.json"], tmp_path)
    assert first.returncode == 0, first.stderr
    changed_suite = json.loads(json.dumps(PINNED_SUITE))
    changed_suite["cases"][0]["contains"] = ["30 days", "annual"]  # a stricter check
    (tmp_path / "stricter.json").write_text(json.dumps(changed_suite, indent=2), encoding="utf-8")
    regrade = run_script(SCRIPT, ["--provider", "replay", "--replay", "old.json", "--suite", "stricter.json",
                                  "--out", "regraded.json"], tmp_path)
    assert regrade.returncode == 1, regrade.stderr
    compared = run_script(COMPARE, ["old.json", "regraded.json"], tmp_path)
    assert compared.returncode == 1, compared.stdout
    lines = compared.stdout.splitlines()
    assert lines[0].startswith("REGRADE") and "refund-policy" in lines[0] and "password-reset" not in lines[0]
    assert [line.split()[:3] for line in lines if "NEW_FAILURE" in line] == [["NEW_FAILURE", "echo", "refund-policy"]]
    # either order: the replay names the record it replayed
    assert run_script(COMPARE, ["regraded.json", "old.json"], tmp_path).returncode == 0
    # a replay with the same suite is a regrade by the current checker: no case's checks changed
    same = run_script(SCRIPT, ["--provider", "replay", "--replay", "old.json", "--out", "same.json"], tmp_path)
    assert same.returncode == 0, same.stderr
    unchanged = run_script(COMPARE, ["old.json", "same.json"], tmp_path)
    assert unchanged.returncode == 0 and unchanged.stdout.splitlines()[0].endswith("cases whose checks changed: none")

    # A replay whose inputs differ is not a regrade: NOT_COMPARABLE, naming the input.
    changed_suite["cases"][1]["input"] = "How do I change my password?"
    (tmp_path / "other-input.json").write_text(json.dumps(changed_suite, indent=2), encoding="utf-8")
    replayed = run_script(SCRIPT, ["--provider", "replay", "--replay", "old.json", "--suite", "other-input.json",
                                   "--out", "other.json"], tmp_path)
    assert replayed.returncode in (0, 1), replayed.stderr
    refused = run_script(COMPARE, ["old.json", "other.json"], tmp_path)
    assert refused.returncode == 2
    assert refused.stdout.startswith('NOT_COMPARABLE: cases["password-reset"].input differs: ')

    # Two independent runs that differ only in checks are not a record and its replay.
    again = run_script(SCRIPT, ["--suite", "stricter.json", "--provider", "echo", "--out", "new.json"], tmp_path)
    assert again.returncode == 1
    independent = run_script(COMPARE, ["old.json", "new.json"], tmp_path)
    assert independent.returncode == 2 and "regrade the earlier record" in independent.stdout


def test_a_regrade_must_keep_the_stored_responses(capsys):
    before = make_record(created_at="2026-01-01T00:00:00+00:00")
    after = _with_case(make_record(created_at="2026-01-02T00:00:00+00:00",
                                   replayed_from={"path": "before.json", "created_at": "2026-01-01T00:00:00+00:00"}),
                       "c1", contains=["x"])
    assert compare_runs.compare(before, after) == 0
    assert capsys.readouterr().out.startswith("REGRADE")
    after["runs"][0]["response"] = {"status": "completed", "text": "something else"}
    with pytest.raises(ValueError, match="replay must keep the stored responses"):
        compare_runs.compare(before, after)
    with pytest.raises(ValueError, match="replay must keep the stored responses"):
        compare_runs.matrix_records(before, after)  # the behaviour matrix holds a regrade to it too


def test_a_replay_under_other_instructions_is_no_regrade():
    """Stored responses answered the old instructions: a replay cannot say what new ones do."""
    before = make_record(created_at="2026-01-01T00:00:00+00:00")
    after = make_record(created_at="2026-01-02T00:00:00+00:00",
                        replayed_from={"path": "before.json", "created_at": "2026-01-01T00:00:00+00:00"})
    after["config"]["instructions"] = "Ignore the log and always answer retry."
    for pair in ((before, after), (after, before)):
        with pytest.raises(ValueError, match="config.instructions differs: a replay re-grades"):
            compare_runs.compare(*pair)
        with pytest.raises(ValueError, match="config.instructions differs"):
            compare_runs.matrix_records(*pair)


def test_update_baseline_prints_the_regrade_command_and_it_works(tmp_path, model_echo):
    text = BASELINE_SUITE.replace('"excludes": ["lifetime"]', '"excludes": ["never"]')
    baseline_suite(tmp_path, text)
    first = run_script(SCRIPT, ["--suite", "suite.json", *model_echo, "--update-baseline",
                                "--out", "run1.json"], tmp_path)
    assert first.returncode == 0, first.stderr
    hint = [line for line in first.stdout.splitlines() if line.startswith("note: run1.json")]
    assert len(hint) == 1
    command = hint[0].split("regrade it first: ")[1]
    assert command == (f"{regression._python_word()} {SCRIPT} --provider replay --replay run1.json "
                       "--suite suite.json --out run1-regraded.json")
    second = run_script(SCRIPT, ["--suite", "suite.json", *model_echo, "--out", "run2.json"],
                        tmp_path)
    assert second.returncode == 0, second.stderr
    refused = run_script(COMPARE, ["run1.json", "run2.json"], tmp_path)
    assert refused.returncode == 2 and "expected_text differs" in refused.stdout
    regraded = run_script(SCRIPT, command.split()[2:], tmp_path)
    assert regraded.returncode == 0, regraded.stderr
    assert run_script(COMPARE, ["run1.json", "run1-regraded.json"], tmp_path).stdout.startswith("REGRADE")
    later = run_script(COMPARE, ["run1-regraded.json", "run2.json"], tmp_path)
    assert later.returncode == 0, later.stdout


# ====================================================================== 14.4: the built-in suite as a file

def test_builtin_suite_and_its_file_have_the_same_config():
    builtin = regression.run_config(regression.builtin_suite(), regression.MODELS, 2)
    from_file = regression.run_config(regression.load_suite(str(HERE / "suites" / "http-advisor.json")),
                                      regression.MODELS, 2)
    assert builtin == from_file
    assert builtin["cases"] == regression.CASES  # SPEC A8: the built-in config keeps its own form


def test_a_changed_builtin_file_keeps_its_own_config():
    data = json.loads((HERE / "suites" / "http-advisor.json").read_text(encoding="utf-8"))
    data["cases"][0]["expect"]["code"] = "430"
    config = regression.run_config(regression.validate_suite(data), regression.MODELS, 1)
    assert config["cases"] != regression.CASES and config["cases"][0]["expect"]["code"] == "430"


def test_compare_and_resume_across_the_builtin_suite_and_its_file(tmp_path):
    shutil_copy = (HERE / "suites" / "http-advisor.json").read_text(encoding="utf-8")
    (tmp_path / "http-advisor.json").write_text(shutil_copy, encoding="utf-8")
    builtin = run_script(SCRIPT, ["--provider", "echo", "--out", "builtin.json"], tmp_path)
    from_file = run_script(SCRIPT, ["--provider", "echo", "--suite", "http-advisor.json", "--out", "file.json"],
                           tmp_path)
    assert builtin.returncode == from_file.returncode == 1
    configs = [json.loads((tmp_path / name).read_text(encoding="utf-8"))["config"] for name in ("builtin.json", "file.json")]
    assert configs[0] == configs[1]
    compared = run_script(COMPARE, ["builtin.json", "file.json"], tmp_path)
    assert compared.returncode == 0, compared.stdout
    # An interrupted built-in run resumes with the file, and the other way round.
    for made, then in (("builtin.json", ["--resume", "a.json", "--suite", "http-advisor.json"]),
                       ("file.json", ["--resume", "b.json"])):
        record = json.loads((tmp_path / made).read_text(encoding="utf-8"))
        record["runs"] = record["runs"][:1]  # as if the run had been killed after its first row
        (tmp_path / then[1]).write_text(json.dumps(record), encoding="utf-8")
        resumed = run_script(SCRIPT, then, tmp_path)
        assert resumed.returncode == 1, resumed.stderr
        record = json.loads((tmp_path / then[1]).read_text(encoding="utf-8"))
        assert record["summary"]["complete"] is True and len(record["runs"]) == 4


# ====================================================================== 14.6: compare scales

def _big_pair(cases=500, models=("openai/gpt-4.1-mini", "anthropic/claude-sonnet-4-6"), repeats=3,
              still=(), new=(), same_diff_case=None):
    case_ids = [f"case-{n:03d}" for n in range(cases)]
    failing_before = {(models[0], case_ids[n], r): ["wrong_code"] for n in still for r in range(repeats)}
    failing_after = dict(failing_before)
    answers_after = {}
    for n in new:
        for r in range(repeats):
            failing_after[(models[1], case_ids[n], r)] = ["missing_required_text"]
            answers_after[(models[1], case_ids[n], r)] = "a changed answer"  # identical in every repeat
    return (make_record(models, case_ids, repeats, failing_before),
            make_record(models, case_ids, repeats, failing_after, answers_after))


def test_unchanged_big_comparison_is_a_few_lines(tmp_path, capsys):
    before, after = _big_pair()
    result = compare_cli(tmp_path, before, after)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 11, lines  # with the by-model block: a header and one line per model
    assert any(line.startswith("PASS 3,000") for line in lines)
    assert "NEW_FAILURE" not in result.stdout and "STILL_FAILING" not in result.stdout
    everything = compare_in_process(tmp_path, capsys, before, after, "--all")
    assert sum(line.startswith("PASS ") for line in everything.stdout.splitlines()) == 3000


def test_changed_rows_listed_unchanged_counted_and_grep_counts_new_failures(tmp_path, capsys):
    before, after = _big_pair(still=(7, 8), new=(3, 4))
    result = compare_in_process(tmp_path, capsys, before, after)
    assert result.returncode == 1
    out = result.stdout
    assert sum("NEW_FAILURE" in line for line in out.splitlines()) == 6  # grep -c NEW_FAILURE: one per row
    assert out.count("NEW_FAILURE") == 6
    assert "PASS 2,988" in out and "STILL_FAILING 6" in out
    # The identical diff of the three repeats appears once and names them.
    headers = [line for line in out.splitlines() if line.startswith("== ")]
    assert headers == [f"== anthropic/claude-sonnet-4-6  case-{n:03d}  repeats 0, 1, 2 (passed before, fails now)"
                       for n in (3, 4)]
    assert out.count("+a changed answer") == 2
    # Pass-rate lines only for the pairs that changed; the rest are counted.
    assert sum(line.startswith("RATE    ") for line in out.splitlines()) == 2
    assert "RATE unchanged: 998 model/case pair(s)" in out
    assert len(out.splitlines()) < 40


def test_reports_of_a_big_comparison_fold_unchanged_rows(tmp_path):
    before, after = _big_pair(still=(7,), new=(3,))
    paths = write_json(tmp_path / "b.json", before), write_json(tmp_path / "a.json", after)
    result = run_script(COMPARE, [*paths, "--markdown", "d.md", "--html", "d.html", "--junit", "d.xml"], tmp_path)
    assert result.returncode == 1, result.stderr
    markdown = (tmp_path / "d.md").read_text(encoding="utf-8")
    assert len(markdown.splitlines()) < 30 and "PASS 2,994" in markdown and "STILL_FAILING 3" in markdown
    html = (tmp_path / "d.html").read_text(encoding="utf-8")
    assert len(html) < 20_000 and "PASS 2,994" in html
    junit = (tmp_path / "d.xml").read_text(encoding="utf-8")
    assert junit.count("<testcase ") == 3000  # JUnit keeps one testcase per row key


# ====================================================================== 14.7: counts, and the --alpha headline

def test_regress_sees_a_drop_whose_reason_already_occurred_before(tmp_path, capsys):
    """password-reset 2/3 -> 0/3 with the reason seen once before: a REGRESS line, with counts."""
    before = make_record(case_ids=("password-reset",), repeats=3,
                         failing={("m/one", "password-reset", 0): ["missing_required_text"]})
    after = make_record(case_ids=("password-reset",), repeats=3,
                        failing={("m/one", "password-reset", r): ["missing_required_text"] for r in range(3)})
    result = compare_in_process(tmp_path, capsys, before, after)
    regress = [line for line in result.stdout.splitlines() if line.startswith("REGRESS")]
    assert regress == ["REGRESS        m/one  password-reset  +missing_required_text 1->3"]
    back = compare_in_process(tmp_path, capsys, after, before)
    assert [line for line in back.stdout.splitlines() if line.startswith("GAIN")] == [
        "GAIN           m/one  password-reset  -missing_required_text 3->1"]


@pytest.mark.parametrize("flip, alpha, code, verdict", [
    (3, "0.01", 0, "verdict: no significant drop (exit 0): 3 rows flipped to failing, none at "
                   "adjusted p <= 0.01 (Holm-Bonferroni correction over 2 model/case pairs)"),
    (3, "0.1", 1, "verdict: SIGNIFICANT DROP (exit 1): 1 model/case pair dropped at adjusted p <= "
                  "0.1 (Holm-Bonferroni correction over 2 model/case pairs); 3 rows flipped to "
                  "failing"),
    (0, "0.05", 0, "verdict: no significant drop (exit 0): 0 rows flipped to failing, none at "
                   "adjusted p <= 0.05 (Holm-Bonferroni correction over 2 model/case pairs)"),
    (1, None, 1, "verdict: NEW FAILURES (exit 1): 1 row flipped to failing"),
    (0, None, 0, "verdict: no new failure (exit 0): 0 rows flipped to failing"),
])
def test_the_headline_never_contradicts_the_rows(tmp_path, capsys, flip, alpha, code, verdict):
    before = make_record(repeats=3)
    after = make_record(repeats=3, failing={("m/one", "c1", r): ["wrong_code"] for r in range(flip)})
    result = compare_in_process(tmp_path, capsys, before, after, *(["--alpha", alpha] if alpha else []))
    assert result.returncode == code
    assert verdict in result.stdout.splitlines()
    assert result.stdout.count("NEW_FAILURE") == flip
    if flip:
        assert "no new failure" not in result.stdout


# ====================================================================== 14.10: reports read well

def _report_record():
    model = "openai/gpt-4.1-mini"
    record = make_record(models=(model,), case_ids=("c1", "c2", "c3"), failing={(model, "c1", 0): ["wrong_code"]},
                         suite={"name": "support.v2"})
    errored = record["runs"][1]
    errored.update(error="ConnectionError", error_status=503, error_message="upstream reset", answer_text=None,
                   response=None, reasons=["execution_error"], passed=False)
    del record["runs"][2]  # never ran
    record["summary"] = regression.summary(record["runs"], [model], 1, record["config"]["cases"])
    return record


def test_junit_names_are_stable_dots_escaped_reasons_json():
    import xml.etree.ElementTree as ET
    record = _report_record()
    root = ET.fromstring(regression.junit_run(record))
    cases = root.iter("testcase")
    names = {(case.get("classname"), case.get("name")) for case in cases}
    assert names == {("support_v2.openai/gpt-4_1-mini", f"{c} [repeat 0]") for c in ("c1", "c2", "c3")}
    failure = next(case for case in root.iter("testcase") if case.get("name") == "c1 [repeat 0]").find("failure")
    assert failure.get("message").startswith("wrong_code")
    assert 'reasons: ["wrong_code"]' in failure.text and "['" not in failure.text  # JSON, never a Python list
    # The same names when every row passes: a test's identity does not depend on its verdict.
    passing = make_record(models=("openai/gpt-4.1-mini",), case_ids=("c1", "c2", "c3"), suite={"name": "support.v2"})
    passing_root = ET.fromstring(regression.junit_run(passing))
    assert {(c.get("classname"), c.get("name")) for c in passing_root.iter("testcase")} == names


def test_junit_comparison_names_are_stable(tmp_path, capsys):
    import xml.etree.ElementTree as ET
    model = "openai/gpt-4.1-mini"
    before = make_record(models=(model,))
    outcomes = {}
    for name, after in (("same", make_record(models=(model,))),
                        ("worse", make_record(models=(model,), failing={(model, "c1", 0): ["wrong_code"]}))):
        paths = write_json(tmp_path / f"b-{name}.json", before), write_json(tmp_path / f"a-{name}.json", after)
        run_main(compare_runs.main, [*paths, "--junit", str(tmp_path / f"{name}.xml")], capsys)
        root = ET.parse(tmp_path / f"{name}.xml").getroot()
        outcomes[name] = root
        assert all(case.get("classname") == "compare.openai/gpt-4_1-mini" for case in root.iter("testcase"))
    assert [c.get("name") for c in outcomes["same"].iter("testcase")] == \
        [c.get("name") for c in outcomes["worse"].iter("testcase")] == ["c1 [repeat 0]", "c2 [repeat 0]"]
    failure = next(outcomes["worse"].iter("failure"))
    assert failure.get("message") == 'NEW_FAILURE: ["wrong_code"]'


def test_markdown_and_html_say_what_failed_and_not_run():
    record = _report_record()
    for text in (regression.markdown_run(record), regression.html_run(record)):
        assert "None" not in text and "0/0" not in text
        assert "ConnectionError" in text and "503" in text
    assert "Not run: 1 row(s): openai/gpt-4.1-mini / c3 / repeat 0" in regression.markdown_run(record)
    html = regression.html_run(record)
    assert "no answer: the request failed with ConnectionError (HTTP 503): upstream reset" in html
    assert "not run" in html
    unrun = make_record(models=("a", "b"), case_ids=("c1",))
    unrun["runs"] = [row for row in unrun["runs"] if row["model"] == "a"]
    unrun["summary"] = regression.summary(unrun["runs"], ["a", "b"], 1, unrun["config"]["cases"])
    markdown = regression.markdown_run(unrun)
    assert "| b | not run |" in markdown and "0/0" not in markdown


# ====================================================================== 14.12: the README's flows, as written

import re  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402

README = "\n".join(path.read_text(encoding="utf-8")  # the README and every docs page
                   for path in [HERE / "README.md", *sorted(HERE.glob("docs/*.md"))])

README_COMMANDS = [
    "python regression.py --suite suites/support-guardrails.json --provider echo --out old.json",
    "python regression.py --provider replay --replay old.json --suite suites/support-guardrails.json "
    "--out regraded.json",
    "python compare_runs.py old.json regraded.json",
    "python compare_runs.py before.json after.json --all",
    "python compare_runs.py before.json after.json | grep -c NEW_FAILURE",
]
INSTALLED_COMMANDS = ["agent-regression --suite suites/agent-tools.json --dry-run",
                      "compare-runs --demo offline-demo-2"]


def project_copy(folder):
    for name in ("regression.py", "compare_runs.py"):
        shutil.copy(HERE / name, folder / name)
    shutil.copytree(HERE / "suites", folder / "suites")
    return folder


def readme_run(command, cwd):
    """A README command exactly as written, `python` meaning this interpreter (pipes through sh)."""
    assert command in README, command
    text = shlex.quote(sys.executable) + command[len("python"):]
    return subprocess.run(text, shell=True, cwd=cwd, env=offline_env(), capture_output=True, text=True, timeout=120)


def test_readme_regrade_flow(tmp_path):
    cwd = project_copy(tmp_path)
    first = readme_run(README_COMMANDS[0], cwd)
    assert first.returncode == 1, first.stderr  # echo fails 3 of the 4 cases, as the README says
    rows = json.loads((cwd / "old.json").read_text(encoding="utf-8"))["runs"]
    assert sorted(row["case_id"] for row in rows if not row["passed"]) == [
        "card-number-not-echoed", "no-data-loss-promise", "refund-policy"]
    # "edit a check of a case": password-reset now also requires "link"
    suite_path = cwd / "suites" / "support-guardrails.json"
    text = suite_path.read_text(encoding="utf-8")
    data = json.loads(text)
    position = next(n for n, case in enumerate(data["cases"]) if case["id"] == "password-reset")
    suite_path.write_text(text.replace('"reset"\n', '"reset",\n        "link"\n', 1), encoding="utf-8")
    assert json.loads(suite_path.read_text())["cases"][position]["contains"] == ["reset", "link"]
    regraded = readme_run(README_COMMANDS[1], cwd)
    assert regraded.returncode == 1, regraded.stderr
    compared = readme_run(README_COMMANDS[2], cwd)
    assert compared.returncode == 1, compared.stdout
    lines = compared.stdout.splitlines()
    assert lines[0] == "REGRADE: the same stored responses graded with changed checks; cases whose checks changed: " \
                       "password-reset"
    assert [line.split()[:3] for line in lines if "NEW_FAILURE" in line] == [["NEW_FAILURE", "echo", "password-reset"]]
    assert "STILL_FAILING 3" in compared.stdout


def test_readme_compare_flags_and_grep(tmp_path):
    before = make_record(case_ids=("c1", "c2", "c3"), repeats=2)
    after = make_record(case_ids=("c1", "c2", "c3"), repeats=2,
                        failing={("m/one", "c2", 0): ["wrong_code"], ("m/one", "c3", 1): ["too_long"]})
    write_json(tmp_path / "before.json", before)
    write_json(tmp_path / "after.json", after)
    project_copy(tmp_path)
    everything = readme_run(README_COMMANDS[3], tmp_path)
    assert everything.returncode == 1
    assert sum(line.split()[:1] == ["PASS"] for line in everything.stdout.splitlines()) == 4
    counted = readme_run(README_COMMANDS[4], tmp_path)
    assert counted.stdout.strip() == "2"  # grep -c: exactly the two new-failure rows


def test_readme_every_flow_command_is_in_the_readme():
    for command in README_COMMANDS + INSTALLED_COMMANDS:
        assert command in README, command
    for phrase in ("`qualified`", "flat form", "three of its four cases", "`details` is there only when",
                   "`agent-regression`", "`compare-runs`", "own `--max-cost-usd` cap", "SIGTERM",
                   "143", "Regrade a record", "llama.cpp", "Ollama", "vLLM", "LM Studio", "--approve-failing"):
        assert phrase in README, phrase


@pytest.mark.skipif(not shutil.which("agent-regression", path=os.path.dirname(sys.executable)),
                    reason="the console scripts are installed by pip install -e .")
def test_readme_installed_commands(tmp_path):
    cwd = project_copy(tmp_path)
    bin_dir = os.path.dirname(sys.executable)
    for command, code in zip(INSTALLED_COMMANDS, (0, 1)):
        argv = shlex.split(command)
        result = subprocess.run([os.path.join(bin_dir, argv[0]), *argv[1:]], cwd=cwd, env=offline_env(),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == code, result.stdout + result.stderr
    assert (cwd / "offline-demo-2" / "after.json").exists()


def test_readme_local_server_commands_are_valid_set_ups(tmp_path):
    """Each local-server line of the README passes every check before sending (a dry run)."""
    section = README.split("## Local servers", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in re.findall(r"^python regression\.py .*$", section, re.M)]
    assert len(commands) == 4
    cwd = project_copy(tmp_path)
    for command, port in zip(commands, ("8080", "11434", "8000", "1234")):
        assert f"http://127.0.0.1:{port}/v1" in command
        result = subprocess.run([sys.executable, *shlex.split(command)[1:], "--dry-run"], cwd=cwd,
                                env=offline_env(), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "nothing was sent" in result.stdout


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(replayed_from=st.one_of(JSON_VALUES, st.fixed_dictionaries({"created_at": st.sampled_from(
           ["2026-01-01T00:00:00+00:00", None, 5])})),
       field=st.sampled_from(["cases", "sources", "models", "repeats", "tool"]), value=JSON_VALUES,
       side=st.sampled_from(["before", "after", "both"]))
def test_crafted_replay_pairs_never_crash_compare(tmp_path, capsys, replayed_from, field, value, side):
    records = {"before": make_record(), "after": make_record(replayed_from=replayed_from)}
    for name in (("before", "after") if side == "both" else (side,)):
        records[name]["config"][field] = value
    code, out, err = run_main(compare_runs.main, [write_json(tmp_path / "b.json", records["before"]),
                                                  write_json(tmp_path / "a.json", records["after"])], capsys)
    assert code in (0, 1, 2) and err == ""
    if code == 2:
        assert out.startswith("NOT_COMPARABLE: ") and out.count("\n") == 1, out
