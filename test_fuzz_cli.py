"""The command line and environment of regression.py and compare_runs.py fuzzed: any flag value,
twin variable or combination is a correct run or one clear line and exit 2 before anything is
sent, never a traceback, an overwritten file or a printed key. Each defect the fuzzing found is
pinned through the real CLI (fakes.cli_table, forked from the zygote, -W error)."""

import contextlib
import io
import json
import os
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import compare_runs
import fakes
import regression
from testkit import ROOT, cli_env

SUITE = ROOT / "suites" / "support-guardrails.json"
QUICK = dict(max_examples=60, deadline=None, database=None, derandomize=True,
             suppress_health_check=list(HealthCheck))
# any JSON value: what a --request value or a twin may decode to
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)


def cli_rows(tmp_path, runs, script="regression.py", env=None):
    """[(exit code, stdout, stderr, files left)] of each argv run by the real CLI (-W error) in
    its own new folder under tmp_path, which holds a copy of the support-guardrails suite. An
    argv may be (argv, {variable: value}): that run's environment has them too."""
    results = []
    for number, argv in enumerate(runs):
        argv, extra = argv if isinstance(argv, tuple) else (argv, {})
        folder = tmp_path / f"run{number}"
        folder.mkdir()
        (folder / "suite.json").write_bytes(SUITE.read_bytes())
        (code, out, err), = fakes.cli_table([(argv, folder)], env={**(env or cli_env()), **extra},
                                            script=script, flags=("-W", "error"))
        results.append((code, out, err, sorted(os.listdir(folder))))
    return results


def one_line(err, prog="regression.py"):
    """The one line of a usage error: no traceback, no warning, nothing else."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: "), err
    return err[len(prog) + 9:-1]


ECHO = ["--provider", "echo", "--models", "echo", "--suite", "suite.json"]


# ---------------------------------------------------------------------- --request KEY=JSON

DEEP = "[" * 985 + "]" * 985  # parses, then overflowed the record writer (RecursionError)
REQUEST_REFUSED = {
    # a number beyond a double reads as infinity: it went out as `Infinity` (not JSON) and the
    # record's config said "inf", a string
    "temperature=1e400": "--request 'temperature=1e400': request 'temperature' is not plain "
                         "JSON (NaN, Infinity or nested over 100 deep)",
    "seed=-1e400": "--request 'seed=-1e400': request 'seed' is not plain JSON (NaN, Infinity or "
                   "nested over 100 deep)",
    "seed=" + DEEP: "--request 'seed=" + "[" * 52 + "...': request 'seed' is not plain JSON "
                    "(NaN, Infinity or nested over 100 deep)",
}


def test_request_values_no_json_body_can_carry_exit_2_with_one_line(tmp_path):
    """Before: 1e400 ran (sent as Infinity), and a value nested 985 deep was a RecursionError
    traceback with exit 1 (a "check failed") once the record header was written."""
    runs = [[*ECHO, "--request", item] for item in REQUEST_REFUSED]
    for said, (code, out, err, files) in zip(REQUEST_REFUSED.values(), cli_rows(tmp_path, runs)):
        assert (code, one_line(err), files) == (2, said, ["suite.json"]), err
        assert out == ""


def test_a_suite_request_nested_past_the_writer_is_refused_like_the_flag(tmp_path):
    suite = json.loads(SUITE.read_text())
    suite["request"] = {"seed": json.loads("[" * 101 + "]" * 101)}
    (tmp_path / "deep.json").write_text(json.dumps(suite))
    with pytest.raises(regression.SuiteError, match="nested over 100 deep"):
        regression.load_suite(str(tmp_path / "deep.json"))


# what a --request value may be: any JSON text, a number past a double, or nesting of any depth
REQUEST_TEXTS = st.one_of(JSON.map(json.dumps), st.sampled_from(["1e400", "-1e999", "[1e309]"]),
                          st.integers(1, 1200).map(lambda depth: "[" * depth + "]" * depth))


@settings(**QUICK)
@given(REQUEST_TEXTS)
def test_any_request_value_is_refused_or_fits_a_json_body(text):
    """Whatever --request KEY=JSON decodes to: UsageError, or a value that serialises as strict
    JSON inside a record's config, back to the same value."""
    try:
        options = regression.request_options(regression.Settings(request=[f"seed={text}"]))
    except regression.UsageError as exc:
        assert str(exc).startswith("--request 'seed=")
        return
    nested = {"config": {"request": options}}
    assert json.loads(regression.dumps(nested)) == nested


# ---------------------------------------------------------------------- --redact REGEX

NOT_VALID = ("--redact is not a valid regular expression; the pattern is not shown, since it can "
             "be the secret itself (escape a literal's ( [ \\ with a backslash)")
EMPTY = ("--redact can match an empty text, so it would mask nothing and scatter [REDACTED] "
         "through every stored answer; give a pattern that matches the secret itself (it is not "
         "shown)")
REDACT_REFUSED = {
    # `--redact "$UNSET"`: stored every answer as [REDACTED]W[REDACTED]h[REDACTED]a..., 11 times
    # its size, and masked nothing
    "": EMPTY, "\\b": EMPTY,
    # POSIX classes Python reads as a set of [ : d i g t then "]+": ran, masking no digit, with a
    # FutureWarning on stderr (a traceback under -W error)
    "[[:digit:]]{4}": NOT_VALID,
    # invalid, but Python warned first: the error came after two warning lines
    "[[[": NOT_VALID,
}


def test_redact_patterns_that_mask_wrongly_exit_2_with_one_line(tmp_path):
    runs = [[*ECHO, "--redact", pattern] for pattern in REDACT_REFUSED]
    for said, (code, out, err, files) in zip(REDACT_REFUSED.values(), cli_rows(tmp_path, runs)):
        assert (code, one_line(err), files) == (2, said, ["suite.json"]), err


def test_a_sources_path_python_would_read_otherwise_is_refused():
    suite = {"name": "kb", "instructions": "x", "cases": [{"id": "c", "input": "q"}],
             "sources": {"field": "links", "hosts": ["docs.example.com"],
                         "path": "/kb/([[:alnum:]]+)"}}
    with pytest.raises(regression.SuiteError, match="sources.path is not a valid regular "
                                                    "expression: Possible nested set"):
        regression.validate_suite(suite)


@settings(**QUICK)
@given(st.text(st.sampled_from("[]:&-|~*?+\\b(){}^$ax1"), max_size=10))
@example("[[:alpha:]]").via("a POSIX class")
@example("").via("an unset variable")
def test_any_redact_pattern_is_refused_or_masks_only_what_it_matches(pattern):
    """Under -W error: a pattern is refused in one UsageError, or it compiles without a warning
    and masks only non-empty spans (a text of no match stays as it was)."""
    try:
        regression._check_redact_patterns([pattern])
    except regression.UsageError as exc:
        assert str(exc).startswith(("--redact is not a valid", "--redact can match an empty"))
        return
    text = "Ab1 -_. plain answer"
    assert all(match.end() > match.start() for match in re.finditer(pattern, text))
    if not re.search(pattern, text):
        assert regression.redactor([pattern])(text) == text


# ---------------------------------------------------------------------- environment twins

TWIN_REFUSED = {
    # each named the flag the command line never gave (--shard, --max-cost-usd, --models, --out,
    # --base-url): a CI log pointed at a flag that is nowhere in the job
    ("REGRESSION_SHARD", "0/0"): "REGRESSION_SHARD '0/0': use I/N with 1 <= I <= N, e.g. 2/4",
    ("REGRESSION_MAX_COST_USD", "abc"): "REGRESSION_MAX_COST_USD 'abc' is not a number",
    ("REGRESSION_MODELS", "a,a"): "REGRESSION_MODELS: each model may appear only once",
    ("REGRESSION_OUT", "suite.json"): "REGRESSION_OUT: suite.json already exists (records and "
                                      "reports never overwrite a file)",
    ("PROMPTREG_BASE_URL", "nope"): "PROMPTREG_BASE_URL: not an http(s) URL with a host",
}


def test_a_bad_twin_value_is_named_by_its_variable(tmp_path):
    runs = [(["--provider", "openai", "--suite", "suite.json"] if name.endswith("BASE_URL")
             or name.endswith("MODEL") else ["--provider", "echo", "--suite", "suite.json"],
             {name: value}) for name, value in TWIN_REFUSED]
    runs.append(([*ECHO, "--shard", "0/0"], {"REGRESSION_SHARD": "1/2"}))  # the flag's, named so
    said = [*TWIN_REFUSED.values(), "--shard '0/0': use I/N with 1 <= I <= N, e.g. 2/4"]
    for line, (code, out, err, files) in zip(said, cli_rows(tmp_path, runs), strict=True):
        assert (code, one_line(err), files) == (2, line, ["suite.json"]), err


# ---------------------------------------------------------------------- output paths

def test_a_report_path_naming_a_folder_is_refused_before_the_run(tmp_path):
    """Before: "x.md/" and "suite.json/." passed the up-front check (abspath drops the slash),
    so the whole run was made and paid for, then the report failed: exit 2 after the fact."""
    long = "a" * 300 + ".html"  # the same after the run: File name too long
    runs = [[*ECHO, "--markdown", "new.md/"], [*ECHO, "--junit", "suite.json/."],
            [*ECHO, "--out", "new.json/"], [*ECHO, "--html", long]]
    gone = " is not an existing folder; create it first (nothing was run)"
    said = ["--markdown new.md/: {}/new.md" + gone, "--junit suite.json/.: {}/suite.json" + gone,
            "--out new.json/: {}/new.json" + gone, f"--html {long}: the file name is longer "
            "than the 255 bytes a name may have there (nothing was run)"]
    for number, (line, (code, out, err, files)) in enumerate(zip(said, cli_rows(tmp_path, runs),
                                                                 strict=True)):
        line = line.format(tmp_path / f"run{number}")
        assert (code, out, one_line(err), files) == (2, "", line, ["suite.json"])


def test_a_model_name_with_terminal_escapes_is_shown_not_obeyed_in_the_markdown(tmp_path):
    """Before: --models $'a\\x1b[31m\\u202e' reached the Markdown report raw (the console and the
    record escaped it): `cat report.md` in a CI log turned it red and reversed the line."""
    (code, _, err, files), = cli_rows(tmp_path, [[
        "--provider", "echo", "--models", "a\x1b[31m\u202e", "--suite", "suite.json",
        "--markdown", "r.md"]])
    report = (tmp_path / "run0" / "r.md").read_text(encoding="utf-8")
    assert (code, files) == (1, ["r.md", "results.json", "suite.json"]), err
    assert "\x1b" not in report and "\u202e" not in report
    assert "| a\\x1b\\[31m\\u202e | 1/4 = 0.25" in report


def test_two_outputs_naming_one_file_through_a_linked_folder_are_refused_before_the_run(tmp_path):
    """Before: --out d/x.json --markdown link/x.json (link -> d) passed the "named twice" check
    (abspath), the whole run was made, then the report found its file taken: exit 2 after it."""
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to("d")
    demo = tmp_path / "demo"
    with contextlib.redirect_stdout(io.StringIO()):
        compare_runs.demo(str(demo))
    pair = [str(demo / "before.json"), str(demo / "after.json")]
    runs = [[*ECHO, "--out", "../d/x.json", "--markdown", "../link/x.json"],
            [*ECHO, "--html", "../d/r.html", "--junit", "../link/r.html"]]
    said = ["--markdown ../link/x.json: the same file is named twice; every output needs its own "
            "file", "--junit ../link/r.html: the same file is named twice; every output needs its "
            "own file"]
    for line, (code, out, err, files) in zip(said, cli_rows(tmp_path, runs), strict=True):
        assert (code, out, one_line(err), files) == (2, "", line, ["suite.json"])
    (code, out, err, _), = cli_rows(tmp_path / "d", [[*pair, "--html", "../../link/c.html",
                                                       "--markdown", "../c.html"]],
                                    script="compare_runs.py")
    assert (code, out, one_line(err, "compare_runs.py")) == (
        2, "", "--markdown ../c.html: the same file is named twice; every report needs its own "
               "file; see --help")
    assert os.listdir(tmp_path / "d") == ["run0"]


# ---------------------------------------------------------------------- compare_runs.py

def test_compare_refuses_a_report_with_no_folder_before_comparing(tmp_path):
    """Before: the comparison printed, then `cannot create nodir/x.md` (its verdict, exit 1,
    lost to exit 2 after the fact); `--demo ""` said `cannot create : No such file`."""
    demo = tmp_path / "demo"
    with contextlib.redirect_stdout(io.StringIO()):
        compare_runs.demo(str(demo))
    pair = [str(demo / "before.json"), str(demo / "after.json")]
    runs = [[*pair, "--markdown", "nodir/x.md"], ["--trend", *pair, "--html", "suite.json/x"],
            [*pair, "--junit", "new.xml/"], [*pair, "--html", "a" * 256], ["--demo", ""]]
    said = ["--markdown nodir/x.md: {}/nodir is not an existing folder; create it first",
            "--html suite.json/x: {}/suite.json is not an existing folder; create it first",
            "--junit new.xml/: {}/new.xml is not an existing folder; create it first",
            "--html " + "a" * 256 + ": the file name is longer than the 255 bytes a name may "
            "have there",
            "--demo: the folder name is empty (an unset variable?)"]
    rows = cli_rows(tmp_path, runs, script="compare_runs.py")
    for number, (line, (code, out, err, files)) in enumerate(zip(said, rows, strict=True)):
        line = line.format(tmp_path / f"run{number}") + "; see --help"
        assert (code, out, one_line(err, "compare_runs.py"), files) == (2, "", line,
                                                                        ["suite.json"])


# ---------------------------------------------------------------------- flags given twice

def test_a_model_priced_twice_exits_2_before_anything(tmp_path):
    """Before: the last --price won silently, and with it every cost estimate and the cap."""
    runs = [[*ECHO, "--price", "m=1/1", "--price", " m=0.000000001/0.000000001",
             "--max-cost-usd", "1"]]
    (code, out, err, files), = cli_rows(tmp_path, runs)
    assert (code, out, one_line(err), files) == (
        2, "", "--price m: given twice; give each model's price once", ["suite.json"])


# ---------------------------------------------------------------------- any argv, any twin

KEY = "sk-fuzz-0123456789abcdefSECRET"
ODD = st.sampled_from([
    "", " ", "0", "-1", "1", "2", "64", "65", "101", "3601", "0.1", "nan", "inf", "-inf", "1e309",
    "1e400", "sNaN", "1e-999999999", "9" * 400, "٣", "１", "1_0", " 2 ", "\x1b[2J", "é", "\udcff",
    "seed=1e400", "seed=[[[[]]]]", "seed=" + "[" * 150 + "]" * 150, "m=1/1", "m=NaN/1", "=1/1",
    "1/0", "0/0", "2/1", "1/2", "[[:digit:]]", "x*", "(", ".", "/dev/null", "missing.json",
    "http://127.0.0.1:0", "http://[::1", "http://u:p@127.0.0.1:9", "ftp://x", "echo", "openai",
    "replay", "compatible", "MYKEY", "a,a", "holm", KEY[:4]])
ARG = ODD | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=12)
ACTIONS = {flag: action for action in regression.build_parser()._actions
           for flag in action.option_strings if flag.startswith("--") and flag != "--help"}
TWINS = sorted({name for _, name, _ in regression.ENV_TWINS} | {
    *regression._base_url_variables(), "PERPLEXITY_BASE_URL", "ANTHROPIC_BASE_URL"})


@st.composite
def command_lines(draw):
    """(argv, env): any flags with any values (given twice too), any twins with any values."""
    argv = []
    for flag in draw(st.lists(st.sampled_from(sorted(ACTIONS)), max_size=6)):
        count = {0: 0, None: 1}.get(ACTIONS[flag].nargs, draw(st.integers(1, 2)))
        argv += [flag, *(draw(ARG) for _ in range(count))]
    env = dict(draw(st.dictionaries(st.sampled_from(TWINS), ARG, max_size=4)))
    return argv, {**env, "MYKEY": KEY, "OPENAI_API_KEY": KEY, "PERPLEXITY_API_KEY": KEY}


def resolved_or_one_line(argv, env, capsys):
    """regression.parse_args: Settings, or SystemExit(2) with one clear line; never a key."""
    try:
        regression.parse_args(argv, env)
        code = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        regression.release_record()
    out, err = capsys.readouterr()
    assert KEY not in out + err and KEY[4:] not in out + err
    if code != 0:
        assert code == 2 and one_line(err), (argv, env, err)


def test_any_command_line_and_environment_resolves_or_is_one_line(tmp_path, monkeypatch, capsys):
    """Run under -W error: a warning (a FutureWarning of re, a RuntimeWarning of decimal) is a
    failure too. Nothing is sent: parse_args only resolves."""
    monkeypatch.chdir(tmp_path)

    @settings(**{**QUICK, "max_examples": 150})
    @given(command_lines())
    def prop(case):
        resolved_or_one_line(*case, capsys)

    prop()
    assert os.listdir(tmp_path) == []


def test_a_report_into_a_folder_this_user_may_not_write_is_refused_up_front(tmp_path,
                                                                            monkeypatch):
    """As root every folder is writable, so the refusal is shown with os.access saying no: the
    report of a paid run into a read-only folder failed only after the run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(regression.os, "access", lambda path, mode: path != str(tmp_path))
    with pytest.raises(regression.UsageError, match=f"--html r.html: {tmp_path} is not a folder "
                                                    "this user may create files in"):
        regression.resolve(regression.build_parser().parse_args(
            ["--provider", "echo", "--html", "r.html"]), {})
