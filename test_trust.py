"""Trust under attack (issue 11) and the one record validator (issue 10, item 5).

1. Keys: a key with whitespace, control or non-ASCII characters is a usage error naming the
   variable (never the value); a key never goes over plain http to a non-loopback host; every
   form of a key (raw, JSON-, repr-escaped, percent-encoded, inside "Bearer ...") is masked in
   records, reports and console; a key shorter than MIN_SECRET_CHARS is not masked (the run
   says so once), and evidence without the key round-trips byte-identical.
2. Crafted records: one validator (regression.record_problem) serves compare_runs.py,
   --report, --resume, --merge and --replay; every mutation of a valid record is either read or
   refused with one line and exit 2 (compare: NOT_COMPARABLE, never 1).
3. Other inputs: base URLs with a bad port, host or IPv6 literal (flag, OPENAI_BASE_URL, with
   and without --dry-run), a suite integer over 4,300 digits, a lone surrogate in a suite.
4. Replaying masked evidence is refused with one line saying why.
5. Output that must not attack the reader: regression.safe_text makes control characters,
   bidi overrides and other invisible marks visible in everything printed; Markdown reports
   escape every value of a record, numbers included.

Offline: network only to 127.0.0.1 (fakes.FakeServer); keys are fake.
"""

import contextlib
import copy
import io
import json
import os
import pathlib
import re
import shutil
import tempfile
import unicodedata
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compare_runs
import fakes
import regression
from fakes import FakeServer, Reply

# Text strategies built from code points: hypothesis's st.text() builds a Unicode category
# table on first use (seconds on this machine, in every fresh hypothesis home).
ANY_CHAR = st.integers(0, 0x10FFFF).map(chr)
ANY_TEXT = st.lists(ANY_CHAR, max_size=20).map("".join)
SHORT_TEXT = st.lists(ANY_CHAR, max_size=8).map("".join)
ASCII_PRINTABLE = st.sampled_from([chr(code) for code in range(0x21, 0x7f)])

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
COMPARE = HERE / "compare_runs.py"
GUARDRAILS = HERE / "suites" / "support-guardrails.json"

HYPOTHESIS = dict(deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])

# A key whose escaped forms all differ from its raw form: a quote, a backslash, "/", "+", "=", "%".
ODD_KEY = 'sk-trust/Zq8+TfW3"kYv9\\LmN2=xR7%cB'
PLAIN_KEY = "pplx-trust-Hq4WnP7sLx2VbT9mKc3D"


# ====================================================================== helpers

@pytest.fixture(autouse=True, scope="module")
def _hypothesis_home_in_a_scratch_dir():
    """Hypothesis caches go to a temporary directory, never into the project."""
    from hypothesis.configuration import set_hypothesis_home_dir
    folder = tempfile.mkdtemp(prefix="trust-hypothesis-")
    set_hypothesis_home_dir(folder)
    try:
        yield
    finally:
        set_hypothesis_home_dir(None)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_environment_twins(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_")) or \
                name.lower() in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(name)


def child_env(**extra):
    """A child's environment: no real key, no proxy, no twins."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("REGRESSION_", "PERPLEXITY_", "OPENAI_"))
           and name.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env.update(NO_PROXY="127.0.0.1,localhost", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def run_cli(args, env=None, cwd=None, script=SCRIPT, timeout=60):
    """`python SCRIPT ARGS`, forked from a zygote that paid the SDK import once (fakes.run_script):
    the real CLI, and no test here is about what a run imports or how it starts."""
    return fakes.run_script(args, cwd or os.getcwd(), env or child_env(), timeout=timeout, script=str(script))


def run_many(commands):
    """Run (args, env, cwd, script) commands two at a time (the machine has 2 cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda command: run_cli(*command), commands))


def one_error_line(stderr, prog="regression.py"):
    assert "Traceback" not in stderr, stderr
    lines = stderr.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    return lines[0]


def files_under(folder):
    return sorted(path for path in pathlib.Path(folder).rglob("*") if path.is_file())


@contextlib.contextmanager
def scratch_dir():
    folder = tempfile.mkdtemp(prefix="trust-")
    try:
        yield pathlib.Path(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_json(path, value):
    pathlib.Path(path).write_text(json.dumps(value), encoding="utf-8")
    return str(path)


def write_suite(path, cases, **extra):
    return write_json(path, {"name": "trust", "instructions": "Answer briefly.", "cases": cases, **extra})


# ====================================================================== 1. keys

BAD_KEY_CHARACTERS = ["\r", "\n", "\r\n", " ", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u00a0", "\u2028",
                      "\u202e", "\u200b", "\ufeff", "é", "\udc80"]


@pytest.mark.parametrize("bad", BAD_KEY_CHARACTERS, ids=[f"U+{ord(c[0]):04X}" for c in BAD_KEY_CHARACTERS])
@pytest.mark.parametrize("where", ["end", "start", "middle"])
def test_key_with_whitespace_or_control_is_a_problem_naming_the_variable(bad, where):
    clean = "sk-abcdef0123456789"
    value = {"end": clean + bad, "start": bad + clean, "middle": clean[:6] + bad + clean[6:]}[where]
    problem = regression.key_problem("MY_KEY", value)
    assert problem and problem.startswith("MY_KEY ")
    assert clean not in problem and clean[:6] not in problem and clean[6:] not in problem


@given(st.text(alphabet=ASCII_PRINTABLE, min_size=1, max_size=60))
@settings(max_examples=30, **HYPOTHESIS)
def test_clean_printable_key_has_no_problem(value):
    assert regression.key_problem("K", value) is None


PRINTABLE = st.text(alphabet=ASCII_PRINTABLE, max_size=20)
NOT_PRINTABLE = ANY_CHAR.filter(lambda char: not "!" <= char <= "~")


@given(PRINTABLE, NOT_PRINTABLE, PRINTABLE)
@settings(max_examples=30, **HYPOTHESIS)
def test_any_key_outside_printable_ascii_is_refused(head, bad, tail):
    value = head + bad + tail
    problem = regression.key_problem("K", value)
    assert problem and problem.startswith("K ")


def _bad_key_runs(tmp_path, server):
    """(name, argv, env) runs whose key is not a clean token: each must stop before any request."""
    url = server.url + "/v1"
    suite = ["--suite", GUARDRAILS, "--models", "m"]
    return [
        ("perplexity-cr", [], {"PERPLEXITY_API_KEY": PLAIN_KEY + "\r", "PERPLEXITY_BASE_URL": server.url},
         "PERPLEXITY_API_KEY"),
        ("perplexity-space", [], {"PERPLEXITY_API_KEY": "pplx-abc " + PLAIN_KEY, "PERPLEXITY_BASE_URL": server.url},
         "PERPLEXITY_API_KEY"),
        ("openai-lf", ["--provider", "openai", "--base-url", "https://api.openai.com/v1", *suite],
         {"OPENAI_API_KEY": PLAIN_KEY + "\n"}, "OPENAI_API_KEY"),
        ("api-key-env-tab", ["--provider", "openai", "--base-url", url, "--api-key-env", "MY_KEY", *suite],
         {"MY_KEY": PLAIN_KEY + "\t"}, "MY_KEY"),
        ("api-key-env-control", ["--provider", "openai", "--base-url", url, "--api-key-env", "MY_KEY", *suite],
         {"MY_KEY": "\x01" + PLAIN_KEY}, "MY_KEY"),
    ]


def test_key_that_is_not_a_clean_token_is_a_usage_error_before_any_request(tmp_path):
    with FakeServer(lambda request: Reply(body=fakes.chat_response("hi"))) as server:
        runs = _bad_key_runs(tmp_path, server)
        results = run_many([([*argv, "--models", "m", "--out", tmp_path / f"{name}.json"], child_env(**env), tmp_path)
                            for name, argv, env, _ in runs])
        assert server.count == 0, "a bad key must be refused before any request"
    for (name, _, env, variable), result in zip(runs, results):
        assert result.returncode == 2, (name, result.stderr)
        line = one_error_line(result.stderr)
        assert variable in line, (name, line)
        assert PLAIN_KEY not in result.stderr + result.stdout, name
    assert files_under(tmp_path) == [], "no record is left behind"


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("127.255.255.254", True), ("::1", True), ("localhost", True),
    ("LOCALHOST", True), ("api.localhost", True), ("::ffff:127.0.0.1", True), ("localhost.", True),
    ("10.0.0.1", False), ("128.0.0.1", False), ("::2", False), ("example.com", False), ("0.0.0.0", False),
    ("localhost.example.com", False), ("127.0.0.1.nip.io", False), ("", False), (None, False),
])
def test_is_loopback(host, loopback):
    assert regression.is_loopback(host) is loopback


@pytest.mark.parametrize("url,refused", [
    ("http://example.com/v1", True), ("http://10.0.0.7:8000/v1", True), ("http://[fe80::1]:8000/v1", True),
    ("http://127.0.0.1.nip.io/v1", True), ("https://example.com/v1", False), ("http://127.0.0.1:8000/v1", False),
    ("http://localhost:11434/v1", False), ("http://[::1]:8000/v1", False), ("HTTP://example.com/v1", True),
])
def test_plain_http_with_a_key_only_to_loopback(url, refused):
    problem = regression.plain_http_problem(url, "MY_KEY")
    assert (problem is not None) is refused, problem
    if refused:
        assert "MY_KEY" in problem and "--allow-insecure-http" in problem
    assert regression.plain_http_problem(url, "MY_KEY", allowed=True) is None


def test_plain_http_with_a_key_to_a_remote_host_is_a_usage_error_naming_the_flag(tmp_path):
    suite = ["--suite", str(GUARDRAILS), "--models", "m"]
    runs = [
        (["--provider", "openai", "--base-url", "http://192.0.2.1:9/v1", "--api-key-env", "MY_KEY", *suite],
         {"MY_KEY": PLAIN_KEY}),
        ([], {"PERPLEXITY_API_KEY": PLAIN_KEY, "PERPLEXITY_BASE_URL": "http://192.0.2.1:9"}),
    ]
    results = run_many([([*argv, "--out", tmp_path / f"{n}.json"], child_env(**env), tmp_path)
                        for n, (argv, env) in enumerate(runs)])
    for result in results:
        assert result.returncode == 2, result.stderr
        line = one_error_line(result.stderr)
        assert "--allow-insecure-http" in line and "plain http" in line and PLAIN_KEY not in line
    assert files_under(tmp_path) == []
    # the flag lifts the rule (checked without sending anything) and a keyless run is never refused
    parser, args = regression.parse_args(["--provider", "openai", "--base-url", "http://192.0.2.1:9/v1",
                                          "--api-key-env", "MY_KEY", "--allow-insecure-http", *suite])
    assert regression.provider_problem(args, {"MY_KEY": PLAIN_KEY}) is None
    parser, args = regression.parse_args(["--provider", "openai", "--base-url", "http://192.0.2.1:9/v1", *suite])
    assert regression.provider_problem(args, {"OPENAI_API_KEY": PLAIN_KEY}) is None


def lower_escapes(quoted):
    """%2F -> %2f: the same percent-encoding with lower-case hex digits."""
    return re.sub(r"%[0-9A-F]{2}", lambda match: match.group(0).lower(), quoted)


def key_forms(secret):
    """Every way the tests expect a key to be spelled in text (computed independently)."""
    quoted = urllib.parse.quote(secret, safe="")
    return {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], quoted, lower_escapes(quoted),
            urllib.parse.quote_plus(secret, safe=""), json.dumps(json.dumps(secret))[1:-1],
            repr(json.dumps(secret))[1:-1], f"Bearer {secret}"}


SECRET_TEXT = st.text(alphabet=ASCII_PRINTABLE, min_size=8, max_size=40)


@given(SECRET_TEXT, st.sampled_from(["raw", "json", "repr", "quote", "quote-lower", "quote_plus", "json2",
                                     "repr-json", "bearer"]),
       ANY_TEXT, ANY_TEXT)
@settings(max_examples=50, **HYPOTHESIS)
def test_every_form_of_a_key_is_masked(secret, form, before, after):
    quoted = urllib.parse.quote(secret, safe="")
    spelled = {"raw": secret, "json": json.dumps(secret)[1:-1], "repr": repr(secret)[1:-1], "quote": quoted,
               "quote-lower": lower_escapes(quoted), "quote_plus": urllib.parse.quote_plus(secret, safe=""),
               "json2": json.dumps(json.dumps(secret))[1:-1], "repr-json": repr(json.dumps(secret))[1:-1],
               "bearer": f"Authorization: Bearer {secret}"}[form]
    mask = regression.redactor(secrets=[secret])
    masked = mask({"text": before + spelled + after, before + spelled: [spelled]})
    stored = regression.dumps(masked)
    assert "[REDACTED:secret]" in stored
    for variant in (secret, json.dumps(secret)[1:-1], quoted, urllib.parse.quote_plus(secret, safe="")):
        assert variant not in masked["text"], (form, variant)


def _echo_every_form(provider, ok):
    """An endpoint that echoes the Authorization header back in every spelling, in an answer
    or in an error body (the SDK quotes error bodies in its exception message)."""
    def reply(request):
        auth = request.headers.get("Authorization", "")
        key = auth.split(" ", 1)[-1]
        text = " | ".join(sorted(key_forms(key))) + " | " + repr(auth)
        if not ok:
            return Reply(500, {"error": {"message": text}, "echo": {auth: key}})
        body = fakes.chat_response("30 days. " + text) if provider == "openai" else fakes.agent_response(text)
        body["echo"] = {auth: [key, repr(key)]}
        return Reply(body=body)
    return reply


@pytest.mark.parametrize("ok", [True, False], ids=["answer", "error"])
@pytest.mark.parametrize("provider", ["perplexity", "openai"])
def test_key_echoed_in_any_form_reaches_no_file_and_no_console(tmp_path, provider, ok):
    out = tmp_path / "out"
    out.mkdir()
    reports = ["--markdown", out / "run.md", "--junit", out / "run.xml", "--html", out / "run.html"]
    with FakeServer(_echo_every_form(provider, ok)) as server:
        if provider == "openai":
            argv = ["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_KEY",
                    "--suite", GUARDRAILS]
            env = child_env(MY_KEY=ODD_KEY)
        else:
            argv, env = [], child_env(PERPLEXITY_API_KEY=ODD_KEY, PERPLEXITY_BASE_URL=server.url)
        result = run_cli([*argv, "--models", "m", "--timeout", "5", "--out", out / "run.json", *reports], env, tmp_path)
        assert server.requests[0].headers["Authorization"] == f"Bearer {ODD_KEY}"
    assert result.returncode == (1 if ok else 2), result.stderr
    forms = key_forms(ODD_KEY)
    forms |= {regression.xml_text(form) for form in forms} | {regression.md_text(form) for form in forms}
    assert len(files_under(out)) == 4
    if ok or provider == "perplexity":  # urllib's HTTPError message does not quote the body
        assert "[REDACTED:secret]" in (out / "run.json").read_text(encoding="utf-8")
    for path in files_under(out):
        data = path.read_text(encoding="utf-8")
        for form in forms:
            assert form not in data, (path.name, form)
    for form in forms:
        assert form not in result.stdout and form not in result.stderr


@given(st.text(alphabet=ASCII_PRINTABLE, min_size=1,
               max_size=regression.MIN_SECRET_CHARS - 1),
       st.recursive(st.none() | st.booleans() | st.integers() | ANY_TEXT,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SHORT_TEXT, inner, max_size=4),
                    max_leaves=12))
@settings(max_examples=40, **HYPOTHESIS)
def test_a_short_key_never_rewrites_evidence(secret, value):
    """Masking "x" would rewrite every x of every response: a short key is not masked at all."""
    value = {"response": value, "answer_text": f"{secret} {secret}{secret}", "details": {secret: secret}}
    assert regression.dumps(regression.redactor(secrets=[secret])(value)) == regression.dumps(value)


@given(SECRET_TEXT, st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
                                 lambda inner: st.lists(inner, max_size=4)
                                 | st.dictionaries(SHORT_TEXT, inner, max_size=4), max_leaves=16))
@settings(max_examples=40, **HYPOTHESIS)
def test_evidence_without_the_key_round_trips_byte_identical(tmp_path, secret, response):
    """A stored row is byte-identical to the original whenever no form of the key occurs in it."""
    row = {"case_id": "c", "model": "m", "repeat": 0, "error": None, "error_status": None, "cost_usd": None,
           "response": response, "answer_text": regression.dumps(response), "reasons": [], "seconds": 0.0,
           "passed": True}
    text = regression.dumps(row)
    if any(form in text for form in key_forms(secret) | set(regression.secret_forms(secret))):
        return  # the key does occur: the masking property above covers it
    stored = regression.redact_row(row, regression.redactor(secrets=[secret]))
    assert regression.dumps(stored) == text


def test_short_key_is_not_masked_the_run_says_so_once_and_replay_keeps_every_verdict(tmp_path):
    """PERPLEXITY_API_KEY=x style keys for local servers: the evidence is kept byte for byte."""
    answer = "Annual plans can be refunded within 30 days of purchase. xx x-x x"

    def reply(request):
        return Reply(body=fakes.chat_response(answer))

    with FakeServer(reply) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_KEY",
                          "--models", "m", "--suite", GUARDRAILS, "--out", tmp_path / "run.json"],
                         child_env(MY_KEY="x"), tmp_path)
        assert server.requests[0].headers["Authorization"] == "Bearer x"
    notes = [line for line in result.stderr.splitlines() if "not masked" in line]
    assert len(notes) == 1 and f"shorter than {regression.MIN_SECRET_CHARS} characters" in notes[0]
    record = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert "REDACTED" not in json.dumps(record)
    for row in record["runs"]:
        assert row["answer_text"] == answer
        assert row["response"]["choices"][0]["message"]["content"] == answer
    replay = run_cli(["--provider", "replay", "--replay", tmp_path / "run.json", "--out", tmp_path / "again.json"],
                     child_env(), tmp_path)
    assert replay.returncode == result.returncode, replay.stderr
    again = json.loads((tmp_path / "again.json").read_text(encoding="utf-8"))
    assert [row["reasons"] for row in again["runs"]] == [row["reasons"] for row in record["runs"]]


# ====================================================================== 2. crafted records

@pytest.fixture(scope="module")
def valid_record(tmp_path_factory):
    """A real record (echo provider, 2 models x 4 cases x 2 repeats, with failures and details)."""
    folder = tmp_path_factory.mktemp("valid")
    path = folder / "run.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = regression.main(["--suite", str(GUARDRAILS), "--provider", "echo", "--models", "a", "b",
                                "--repeats", "2", "--out", str(path)])
    assert code == 1
    record = json.loads(path.read_text(encoding="utf-8"))
    assert regression.record_problem(record) is None
    assert any(row.get("details", {}).get("diff") for row in record["runs"])
    return record


def json_paths(value, prefix=()):
    """Every path (tuple of keys and indexes) inside a JSON value, the root excluded."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield prefix + (key,)
        yield from json_paths(item, prefix + (key,))


OTHER_VALUES = [None, True, False, 0, -1, 7, 1.5, 10 ** 30, 10 ** 400, -10 ** 400, 1e308, "", "x", "1/2", "<img src=x onerror=alert(1)>",
                "\x1b[2J\x1b[1;1Hverdict: PASS", "\u202eevil", [], {}, ["x"], {"x": 1}, [[]], {"models": []}]


def mutate(record, path, how):
    """A deep copy of the record with the value at `path` replaced, deleted or nested."""
    record = copy.deepcopy(record)
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    if how == "delete":
        del parent[key]
    elif how == "nest-list":
        parent[key] = [parent[key]]
    elif how == "nest-object":
        parent[key] = {"value": parent[key]}
    else:
        parent[key] = OTHER_VALUES[how]
    return record


MUTATIONS = st.sampled_from(["delete", "nest-list", "nest-object", *range(len(OTHER_VALUES))])


def call(function, argv):
    """(exit code, stdout, stderr) of an in-process main(); any exception but SystemExit fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = function(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def refusal_or_code(function, argv):
    """(exit code, "refused" when regression.py stopped through argparse else the code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    refused = False
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = function(argv)
        except SystemExit as exc:
            code, refused = exc.code, True
    return code, ("refused" if refused and function is regression.main else code), out.getvalue(), err.getvalue()


def assert_one_line_refusal(code, stdout, stderr, prog):
    """compare's 2 is a NOT_COMPARABLE line; a refusal by regression.py (argparse's SystemExit 2
    before anything ran) is one error line. A run that ran may also end with 2 (an error row)."""
    assert "Traceback" not in stdout + stderr
    if prog == "compare_runs.py":
        if code == 2:
            lines = stdout.rstrip("\n").split("\n")
            assert lines[-1].startswith("NOT_COMPARABLE: ") and stderr == "", (stdout, stderr)
    elif code == "refused":
        one_error_line(stderr)


def reading_commands(folder, valid_path, crafted_path):
    """Every command that reads a record, as (name, function, argv, allowed exit codes)."""
    resumed = folder / "resume.json"
    shutil.copyfile(crafted_path, resumed)
    return [
        ("compare-after", compare_runs.main, [valid_path, crafted_path], {0, 2}),
        ("compare-before", compare_runs.main, [crafted_path, valid_path], {0, 2}),
        ("compare-swap", compare_runs.main, ["--models", "a", "b", crafted_path], {0, 1, 2}),
        ("report", regression.main, ["--report", crafted_path, "--markdown", str(folder / "r.md"),
                                     "--junit", str(folder / "r.xml"), "--html", str(folder / "r.html")], {0, 2}),
        ("merge", regression.main, ["--merge", str(folder / "merged.json"), crafted_path], {0, 1, 2}),
        ("resume", regression.main, ["--resume", str(resumed)], {0, 1, 2}),
        ("replay", regression.main, ["--provider", "replay", "--replay", crafted_path,
                                     "--out", str(folder / "replayed.json")], {0, 1, 2}),
    ]


def field_paths(record):
    """One path per field of a record (runs[0].seconds stands for every row's seconds)."""
    fields = {}
    for path in json_paths(record):
        fields.setdefault(tuple(0 if isinstance(key, int) else key for key in path), path)
    return list(fields.values())


def run_every_reader(folder, valid_path, crafted, label):
    for child in folder.iterdir():
        if child.name != "valid.json":
            child.unlink()
    crafted_path = write_json(folder / "crafted.json", crafted)
    for name, function, argv, allowed in reading_commands(folder, valid_path, crafted_path):
        code, kind, stdout, stderr = refusal_or_code(function, argv)
        assert code in allowed, (name, label, code, stdout[-300:], stderr[-300:])
        assert_one_line_refusal(kind, stdout, stderr, "compare_runs.py" if name.startswith("compare")
                                else "regression.py")


@pytest.fixture
def no_fsync(monkeypatch):
    """Durability is not what these sweeps test; fsync only makes hundreds of writes slow."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def test_every_field_of_a_record_mutated_is_read_or_refused_in_one_line_by_every_reader(valid_record, no_fsync):
    """A sweep: every field of a real record, each given another type (or deleted, or nested), through
    every command that reads a record; the kinds of mutation rotate over the fields."""
    kinds = ["delete", "nest-list", "nest-object", *range(len(OTHER_VALUES))]
    with scratch_dir() as folder:
        valid_path = write_json(folder / "valid.json", valid_record)
        for n, path in enumerate(field_paths(valid_record)):
            how = kinds[(n * 7) % len(kinds)]
            run_every_reader(folder, valid_path, mutate(valid_record, path, how), (path, how))


def test_every_mutation_of_a_record_is_read_or_refused_in_one_line_by_every_reader(valid_record, no_fsync):
    """Property-based: any path of the record (any row, any depth) and any kind of mutation."""
    paths = list(json_paths(valid_record))
    with scratch_dir() as folder:
        valid_path = write_json(folder / "valid.json", valid_record)

        @settings(max_examples=25, **HYPOTHESIS)
        @given(st.sampled_from(paths), MUTATIONS)
        def prop(path, how):
            run_every_reader(folder, valid_path, mutate(valid_record, path, how), (path, how))

        prop()


def test_record_problem_names_the_field_of_every_typed_mutation(valid_record):
    """Each field the validator types, given a value of another type, is refused naming the field."""
    cases = [(("runs", 0, "seconds"), "fast"), (("runs", 1, "reasons"), "wrong"), (("runs", 0, "passed"), 1),
             (("runs", 0, "details"), [1]), (("runs", 0, "error_status"), "500"), (("runs", 0, "cost_usd"), 0.5),
             (("runs", 0, "answer_text"), {"x": 1}), (("suite",), "s"), (("suite", "name"), 5),
             (("provider",), []), (("provider", "name"), 5), (("provider", "name"), "nope"), (("summary",), "done"),
             (("summary", "rows"), "<img>"), (("summary", "expected_rows"), "# heading"),
             (("summary", "exit_code"), "<!--"), (("summary", "models"), []), (("shard",), 7), (("shard",), "3/2"),
             (("evidence",), 1), (("replayed_from",), "x"), (("config", "repeats"), "1"),
             (("config", "timeout_seconds"), "5"), (("runs",), {}), (("runs", 0), "row")]
    for path, value in cases:
        crafted = copy.deepcopy(valid_record)
        parent = crafted
        for key in path[:-1]:
            parent = parent.setdefault(key, {}) if isinstance(key, str) else parent[key]
        parent[path[-1]] = value
        problem = regression.record_problem(crafted)
        assert problem, (path, value)
        named = str(path[-1]) if isinstance(path[-1], str) else "runs"
        assert named in problem or path[0] in problem, (path, problem)


# Hostile records for the real command lines, each with the exact exit code of every reader
# (the in-process tests above cover the other fields; each subprocess costs start-up time).
HOSTILE_RECORDS = {
    "seconds-string": (("runs", 0, "seconds"), "fast"),
    "suite-string": (("suite",), "suite"),
    "provider-name-int": (("provider", "name"), 5),
    "summary-rows-html": (("summary", "rows"), "<img src=x>"),
    "details-list": (("runs", 0, "details"), [1]),
    "shard-int": (("shard",), 7),
}


def _hostile(valid_record, path, value):
    crafted = copy.deepcopy(valid_record)
    parent = crafted
    for key in path[:-1]:
        parent = parent[key] if not isinstance(key, str) or key in parent else parent.setdefault(key, {})
    parent[path[-1]] = value
    return crafted


def test_hostile_records_exit_2_with_one_line_through_every_real_command(valid_record, tmp_path):
    """compare on every hostile record; each regression.py reader on two of them in rotation (the
    in-process sweep above runs the whole cross product)."""
    valid = write_json(tmp_path / "valid.json", valid_record)
    commands, expected = [], []
    for n, (name, (path, value)) in enumerate(HOSTILE_RECORDS.items()):
        folder = tmp_path / name
        folder.mkdir()
        crafted = write_json(folder / "crafted.json", _hostile(valid_record, path, value))
        resume = write_json(folder / "resume.json", _hostile(valid_record, path, value))
        readers = [("report", SCRIPT, ["--report", crafted, "--markdown", folder / "r.md"]),
                   ("resume", SCRIPT, ["--resume", resume]),
                   ("merge", SCRIPT, ["--merge", folder / "merged.json", crafted]),
                   ("replay", SCRIPT, ["--provider", "replay", "--replay", crafted, "--out", folder / "replayed.json"])]
        for reader, script, argv in [("compare", COMPARE, [valid, crafted]), readers[n % 4], readers[(n + 1) % 4]]:
            commands.append((argv, child_env(), folder, script))
            expected.append((name, reader, folder))
    results = run_many(commands)
    for (name, reader, folder), result in zip(expected, results):
        assert result.returncode == 2, (name, reader, result.stdout[-300:], result.stderr[-300:])
        if reader == "compare":
            assert result.stdout.startswith("NOT_COMPARABLE: ") and result.stdout.count("\n") == 1, result.stdout
            assert result.stderr == ""
        else:
            one_error_line(result.stderr)
    for name in HOSTILE_RECORDS:
        folder = tmp_path / name
        assert sorted(path.name for path in folder.iterdir()) == ["crafted.json", "resume.json"], name
        assert json.loads((folder / "resume.json").read_text()) == json.loads((folder / "crafted.json").read_text())


# ====================================================================== 3. other inputs

BAD_BASE_URLS = {
    "port-too-big": "http://127.0.0.1:99999/v1",
    "port-65536": "http://127.0.0.1:65536/v1",
    "port-negative": "http://127.0.0.1:-1/v1",
    "port-zero": "http://127.0.0.1:0/v1",
    "port-letters": "http://127.0.0.1:abc/v1",
    "port-twice": "http://127.0.0.1:80:80/v1",
    "ipv6-unclosed": "http://[::1/v1",
    "ipv6-not-an-address": "http://[zzz]/v1",
    "ipv6-junk-after": "http://[::1]x:80/v1",
    "ipv6-port-too-big": "http://[::1]:70000/v1",
    "no-host": "http:///v1",
    "not-http": "ftp://127.0.0.1/v1",
    "space": "http://127.0.0.1 /v1",
    "control": "http://127.0.0.1\x1b/v1",
    "non-ascii": "http://127.0.0.1/\u202ev1",
}
GOOD_BASE_URLS = ["http://127.0.0.1:8000/v1", "https://api.openai.com/v1", "http://[::1]:8080/v1",
                  "http://localhost:11434/v1", "https://openrouter.ai/api/v1", "http://127.0.0.1:65535"]


@pytest.mark.parametrize("name", list(BAD_BASE_URLS))
def test_base_url_problem_names_the_source_and_never_raises(name):
    problem = regression.base_url_problem(BAD_BASE_URLS[name], "OPENAI_BASE_URL")
    assert problem and problem.startswith("OPENAI_BASE_URL: "), problem


@pytest.mark.parametrize("url", GOOD_BASE_URLS)
def test_good_base_urls_have_no_problem(url):
    assert regression.base_url_problem(url) is None


@given(st.lists(st.sampled_from(list("htps:/[]0123456789.:@%-x") + ["::1", "127.0.0.1", ":", "65536"]),
                max_size=14).map("".join))
@settings(max_examples=50, **HYPOTHESIS)
def test_base_url_problem_never_raises(url):
    problem = regression.base_url_problem(url)
    if problem is None:  # what is accepted can be used: a host and a port in range
        parts = urllib.parse.urlsplit(url)
        assert parts.scheme in ("http", "https") and parts.hostname and (parts.port is None or parts.port > 0)
        regression._public_url(url)


def test_bad_base_url_is_one_line_exit_2_by_flag_and_environment_with_and_without_dry_run(tmp_path):
    names = ["port-too-big", "port-letters", "port-zero", "ipv6-unclosed", "ipv6-not-an-address"]
    commands, expected = [], []
    base = ["--provider", "openai", "--models", "m", "--suite", GUARDRAILS]
    combos = [(source, dry) for source in ("--base-url", "OPENAI_BASE_URL") for dry in (True, False)]
    # every source with and without --dry-run, two URLs each; every URL at least once
    for n, (source, dry) in enumerate(combos):
        for name in (names[n % len(names)], names[(n + 2) % len(names)]):
            url = BAD_BASE_URLS[name]
            argv = [*base, *(["--base-url", url] if source == "--base-url" else []),
                    *(["--dry-run"] if dry else ["--out", tmp_path / f"{name}.json"])]
            env = child_env(**({"OPENAI_BASE_URL": url} if source == "OPENAI_BASE_URL" else {}))
            commands.append((argv, env, tmp_path))
            expected.append((name, source, dry))
    for (name, source, dry), result in zip(expected, run_many(commands)):
        assert result.returncode == 2, (name, source, dry, result.stderr)
        assert source in one_error_line(result.stderr), (name, source, result.stderr)
        assert result.stdout == ""
    assert files_under(tmp_path) == [], "no record is left behind"


def test_resume_with_a_bad_openai_base_url_in_the_environment_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", BAD_BASE_URLS["port-letters"])
    record = {"config": {"models": ["m"], "cases": [{"id": "a", "input": "hi"}], "repeats": 1}, "runs": [],
              "provider": {"name": "openai", "base_url": "http://127.0.0.1:8000/v1"},
              "suite": {"name": "s", "builtin": False}}
    path = write_json(tmp_path / "run.json", record)
    code, stdout, stderr = call(regression.main, ["--resume", path])
    assert code == 2 and "OPENAI_BASE_URL" in stderr and stderr.count("\n") == 1


def test_hostile_suites_are_one_line_exit_2_and_leave_no_record(tmp_path):
    suites = {
        "integer-over-4300-digits": '{"name": "s", "instructions": "i", "cases": [{"id": "a", "input": "hi", '
                                    '"min_chars": ' + "9" * 4301 + "}]}",
        "case-id-lone-surrogate": json.dumps({"name": "s", "instructions": "i",
                                              "cases": [{"id": "a\ud800", "input": "hi"}]}),
        "input-lone-surrogate": json.dumps({"name": "s", "instructions": "i",
                                            "cases": [{"id": "a", "input": "hi \udfff"}]}),
        "key-lone-surrogate": json.dumps({"name": "s", "instructions": "i",
                                          "cases": [{"id": "a", "input": "hi", "notes\ud83d": "x"}]}),
        "name-lone-surrogate": json.dumps({"name": "s\udc00", "instructions": "i",
                                           "cases": [{"id": "a", "input": "hi"}]}),
        "threshold-400-digits": json.dumps({"name": "s", "instructions": "i", "cases": [
            {"id": "a", "input": "hi", "expected_text": "hi", "min_similarity": 10 ** 400}]}),
    }
    commands = []
    for n, (name, text) in enumerate(suites.items()):
        (tmp_path / f"{name}.suite").write_text(text, encoding="utf-8")
        for extra in [(["--out", tmp_path / f"{name}.json"], ["--dry-run"])[n % 2]]:
            commands.append((["--suite", tmp_path / f"{name}.suite", "--provider", "echo", *extra], child_env(),
                             tmp_path))
    for command, result in zip(commands, run_many(commands)):
        assert result.returncode == 2, (command[0], result.stderr[-500:])
        line = one_error_line(result.stderr)
        assert ".suite: " in line
    assert not list(tmp_path.glob("*.json")), "no record is left behind"


# ====================================================================== 4. replay of masked evidence

def test_replaying_a_redacted_record_is_refused_with_one_line_saying_why(tmp_path):
    """--redact-pii masked the card number the echo answer repeated, so the stored text would pass
    card-number-not-echoed on a re-grade: the replay is refused instead."""
    first = run_cli(["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "--redact-pii",
                     "--out", tmp_path / "pii.json"], child_env(), tmp_path)
    assert first.returncode == 1, first.stderr
    record = json.loads((tmp_path / "pii.json").read_text(encoding="utf-8"))
    card = next(row for row in record["runs"] if row["case_id"] == "card-number-not-echoed")
    assert card["passed"] is False and "[REDACTED:card]" in card["answer_text"]
    # a record whose header lost the marker but whose responses hold masks is refused too
    unmarked = {key: value for key, value in record.items() if key != "redaction"}
    write_json(tmp_path / "unmarked.json", unmarked)
    # a key masked in a stored response (no --redact at all)
    keyed = copy.deepcopy(unmarked)
    for row in keyed["runs"]:
        row["response"] = {"object": "echo", "status": "completed", "output_text": "Bearer [REDACTED:secret]"}
    write_json(tmp_path / "keyed.json", keyed)
    runs = [(["--provider", "replay", "--replay", tmp_path / name, "--out", tmp_path / f"again-{name}"], child_env(),
             tmp_path) for name in ("pii.json", "unmarked.json", "keyed.json")]
    runs.append((["--replay", tmp_path / "pii.json", "--dry-run"], child_env(), tmp_path))
    for command, result in zip(runs, run_many(runs)):
        assert result.returncode == 2, (command[0], result.stderr)
        line = one_error_line(result.stderr)
        assert "cannot be re-graded" in line and "mask" in line, line
    assert not list(tmp_path.glob("again-*"))


def test_masked_evidence_is_none_for_a_clean_record(valid_record):
    assert regression.masked_evidence(valid_record) is None
    marked = dict(valid_record, redaction={"pii": True, "patterns": 0})
    assert "redact" in regression.masked_evidence(marked)


# ====================================================================== 5. output that must not attack the reader

UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
TERMINAL_ATTACKS = (["\x1b[2J\x1b[H", "\x1b]0;title\x07", "\x9b31m", "\r", "\x08" * 5, "\x7f", "\x00", "\x85",
                     "\u2028", "\u2029", "\u061c", "\u200e", "\u200f", "\ufeff", "\u00ad", "\U000e0041"]
                    + [chr(code) for code in range(0x202a, 0x202f)] + [chr(code) for code in range(0x2066, 0x206a)])


def unsafe(text, allowed="\n"):
    """The characters of printed text that a terminal would interpret or hide."""
    return [char for char in text if char not in allowed and unicodedata.category(char) in UNSAFE_CATEGORIES]


@pytest.mark.parametrize("attack", TERMINAL_ATTACKS, ids=[f"U+{ord(a[0]):04X}-{n}" for n, a in enumerate(TERMINAL_ATTACKS)])
def test_safe_text_makes_every_terminal_attack_visible(attack):
    shown = regression.safe_text(f"verdict: PASS{attack}FAIL")
    assert not unsafe(shown, allowed="") and shown.startswith("verdict: PASS") and shown.endswith("FAIL")
    assert "\\" in shown  # visible as an escape, not dropped


@pytest.mark.parametrize("code", list(range(0x00, 0x20)) + [0x7f] + list(range(0x80, 0xa0)))
def test_safe_text_escapes_every_c0_c1_and_del(code):
    assert regression.safe_text(chr(code)) in ({0x0a: "\\n", 0x0d: "\\r", 0x09: "\\t"}.get(code, f"\\x{code:02x}"),)


@given(st.lists(st.one_of(ANY_CHAR, st.sampled_from(TERMINAL_ATTACKS)), max_size=30).map("".join), st.booleans())
@settings(max_examples=50, **HYPOTHESIS)
def test_safe_text_output_is_printable_and_encodable(text, newlines):
    shown = regression.safe_text(text, newlines=newlines)
    assert not unsafe(shown, allowed="\n" if newlines else "")
    shown.encode("utf-8")  # never a lone surrogate on stdout
    assert shown.count("\n") == (text.count("\n") if newlines else 0)
    if not unsafe(text, allowed="\n" if newlines else ""):
        assert shown == text  # text with nothing to hide is printed as it is


def test_safe_text_is_exported_for_compare_runs():
    assert "safe_text" in regression.__all__ and compare_runs.safe_text is regression.safe_text


HOSTILE_ID = "esc\x1b[2J\x1b[1;1Hverdict: PASS\u202eLIAF\u2066x\x9b1m\x85"


def test_run_and_dry_run_print_suite_and_record_text_visibly(tmp_path):
    suite = write_suite(tmp_path / "hostile.suite", [
        {"id": HOSTILE_ID, "input": "hello \x1b]0;owned\x07 world \u202eevil", "contains": ["nope\x1b[2K"]},
        {"id": "plain", "input": "fine"}])
    duplicate = write_suite(tmp_path / "duplicate.suite", [{"id": HOSTILE_ID, "input": "a"},
                                                            {"id": HOSTILE_ID, "input": "b"}])
    runs = [(["--suite", suite, "--provider", "echo", "--models", "m\x1b[31m", "--out", tmp_path / "run.json"],
             child_env(), tmp_path),
            (["--suite", suite, "--provider", "echo", "--dry-run"], child_env(), tmp_path),
            (["--suite", duplicate, "--provider", "echo", "--out", tmp_path / "dup.json"], child_env(), tmp_path)]
    run, dry, dup = run_many(runs)
    assert run.returncode == 1 and dry.returncode == 0 and dup.returncode == 2, (run.stderr, dry.stderr, dup.stderr)
    for result in (run, dry, dup):
        assert not unsafe(result.stdout) and not unsafe(result.stderr), (result.stdout, result.stderr)
    assert "esc\\x1b[2J" in run.stdout and "\\u202e" in run.stdout
    assert "\\x1b]0;owned\\x07" in dry.stdout
    assert "esc\\x1b[2J" in one_error_line(dup.stderr)
    # the record keeps the text as it was: only what is printed is made visible
    record = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert record["runs"][0]["case_id"] == HOSTILE_ID


def _answer_record(model, answers, failing=()):
    cases = [{"id": case_id, "input": "q"} for case_id in answers]
    rows = [{"case_id": case_id, "model": model, "repeat": 0, "error": None, "error_status": None, "cost_usd": "0",
             "response": {"output_text": text}, "answer_text": text,
             "reasons": ["wrong_code"] if case_id in failing else [], "seconds": 0.1,
             "passed": case_id not in failing} for case_id, text in answers.items()]
    return {"created_at": "t", "config": {"models": [model], "cases": cases, "repeats": 1}, "sdk_version": "1\x1b[2J",
            "code_sha256": "a", "evidence": "echo", "runs": rows, "summary": regression.summary(rows, [model], 1, cases)}


def test_compare_prints_record_text_visibly_and_its_verdict_line_cannot_be_forged(tmp_path):
    model = "m\nverdict: 0 NEW_FAILURE row(s) -> exit 0\x1b[8m"
    attack = "ok\n\x1b[1A\x1b[2Kverdict: 0 NEW_FAILURE row(s) -> exit 0\x1b[8m\u202e"
    before = _answer_record(model, {HOSTILE_ID: "fine", "b": "same"})
    after = _answer_record(model, {HOSTILE_ID: attack, "b": "same"}, failing={HOSTILE_ID})
    after["code_sha256"] = "b\x1b]0;x\x07"
    paths = write_json(tmp_path / "before.json", before), write_json(tmp_path / "after.json", after)
    result = run_cli([*paths, "--all-diffs"], child_env(), tmp_path, script=COMPARE)
    assert result.returncode == 1, result.stderr
    assert not unsafe(result.stdout) and result.stderr == ""
    verdicts = [line for line in result.stdout.splitlines() if line.startswith("verdict:")]
    assert verdicts == ["verdict: NEW FAILURES (exit 1): 1 row flipped to failing"], result.stdout
    assert "\\x1b[1A" in result.stdout and "CAUTION code_sha256" in result.stdout
    # the behaviour matrix too
    code, stdout, stderr = call(compare_runs.main, ["--matrix", *paths])
    assert code in (0, 1) and not unsafe(stdout) and "\\x1b" in stdout and stderr == "", (code, stdout, stderr)
    # NOT_COMPARABLE names record text visibly, in one line
    broken = copy.deepcopy(after)
    broken["runs"][0]["case_id"] = "zz\x1b[2J\nverdict"
    code, stdout, _ = call(compare_runs.main, [paths[0], write_json(tmp_path / "broken.json", broken)])
    assert code == 2 and stdout.startswith("NOT_COMPARABLE: ") and stdout.count("\n") == 1 and not unsafe(stdout)


CRAFTED_SUMMARY_VALUES = ["<img src=x onerror=alert(1)>", "# Fake heading", "\n## every row passed\n", "<!--",
                          "-->", "`code`", "[link](javascript:alert(1))", "| col |", 7, None]


@given(st.sampled_from(CRAFTED_SUMMARY_VALUES) | ANY_TEXT, st.sampled_from(CRAFTED_SUMMARY_VALUES) | ANY_TEXT,
       st.sampled_from(CRAFTED_SUMMARY_VALUES) | ANY_TEXT | st.integers(), st.sampled_from(CRAFTED_SUMMARY_VALUES))
@settings(max_examples=30, **HYPOTHESIS)
def test_markdown_escapes_every_record_value_numbers_included(valid_record, rows, expected_rows, exit_code, repeat):
    record = copy.deepcopy(valid_record)
    record["summary"].update(rows=rows, expected_rows=expected_rows, exit_code=exit_code, stopped=rows)
    for row in record["runs"]:
        row["repeat"] = repeat
    text = regression.markdown_run(record)
    assert "<" not in text, "no raw HTML: every < is escaped"
    headings = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert headings[0].startswith("## agent-regression: ") and all(
        line == "### Failures" for line in headings[1:]), headings
    assert "](" not in text.replace("\\](", "")


def test_report_of_a_record_with_crafted_summary_numbers_is_refused_in_one_line(valid_record, tmp_path):
    record = copy.deepcopy(valid_record)
    record["summary"].update(rows="<img src=x>", expected_rows="# heading", exit_code="<!--")
    path = write_json(tmp_path / "crafted.json", record)
    result = run_cli(["--report", path, "--markdown", tmp_path / "r.md"], child_env(), tmp_path)
    assert result.returncode == 2 and "summary." in one_error_line(result.stderr)
    assert not (tmp_path / "r.md").exists()


# ====================================================================== one shard filter, one row-key spelling

@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 3), st.integers(1, 9))
@settings(max_examples=40, **HYPOTHESIS)
def test_shards_partition_the_plan_in_order(models, cases, repeats, total):
    plan = regression.plan_rows([f"m{n}" for n in range(models)], [f"c{n}" for n in range(cases)], repeats)
    shards = [regression.shard_plan(plan, (index, total)) for index in range(1, total + 1)]
    assert sorted(key for shard in shards for key in shard) == sorted(plan)
    assert sum(len(shard) for shard in shards) == len(plan)
    for shard in shards:
        assert shard == [key for key in plan if key in set(shard)]  # run order kept
    assert regression.shard_plan(plan, None) == plan


def test_a_row_key_is_spelled_one_way_in_messages():
    assert regression.key_text(("m", "c", 2)) == "m / c / repeat 2"
    assert compare_runs._name is regression.key_text


# ====================================================================== 6. evidence quoting an answer: no copy a mask cannot read

MIXED_KEY = "sk-trustHq4WnP7sLx2VbT9mKc3DzzQ"  # mixed case: its case-folded form is another string


def run_echoing_key(tmp_path, suite, answer, extra=()):
    """A run against an endpoint whose answer, built by answer(key, user text), repeats the key it
    was sent; every report is written. Returns (result, {file name: text})."""
    def reply(request):
        key, user = request.headers["Authorization"].split(" ", 1)[1], request.json["messages"][-1]["content"]
        return Reply(body=fakes.chat_response(answer(key, user)))

    out = tmp_path / "out"
    out.mkdir()
    with FakeServer(reply) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_KEY",
                          "--models", "m", "--suite", write_suite(tmp_path / "suite.json", **suite),
                          "--out", out / "run.json", "--markdown", out / "run.md", "--junit", out / "run.xml",
                          "--html", out / "run.html", *extra], child_env(MY_KEY=MIXED_KEY), tmp_path)
    return result, {path.name: path.read_text(encoding="utf-8") for path in files_under(out)}


def test_a_stated_value_is_quoted_as_written_so_every_mask_reads_it(tmp_path):
    """require_clarification reads the answer case-folded; its evidence (the value the answer
    states) once quoted that folded form, which neither the key's mask nor a --redact pattern
    recognised: the key, lower-cased, reached the console, the record and every report."""
    suite = {"cases": [{"id": "account", "input": "Set up my account.", "behaviors": ["require_clarification:account_id"]},
                       {"id": "ticket", "input": "Open a ticket.", "behaviors": ["require_clarification:ticket_id"]}]}
    result, files = run_echoing_key(tmp_path, suite, lambda key, user: (
        f"Done. Account id {key} is set. What is your order id?" if "account" in user else
        "Done. Ticket id ACCT-55521 is open. What is your order id?"), ["--redact", "ACCT-[0-9]+"])
    assert result.returncode == 1, result.stderr
    assert len(files) == 4
    notes = {row["case_id"]: row["details"]["evidence"]["invented_field"]
             for row in json.loads(files["run.json"])["runs"]}
    assert notes["account"]["value"] == "[REDACTED:secret]" and notes["ticket"]["value"] == "[REDACTED]"
    for text in [result.stdout, result.stderr, *files.values()]:
        for hidden in (MIXED_KEY, "ACCT-55521"):
            assert hidden.lower() not in text.lower()


@pytest.mark.parametrize("spelled", [str.lower, str.upper, str.swapcase])
def test_a_key_in_any_letter_case_is_masked(spelled):
    mask = regression.redactor(secrets=[MIXED_KEY])
    quoted = urllib.parse.quote(ODD_KEY, safe="")
    assert mask(f"a {spelled(MIXED_KEY)} b") == "a [REDACTED:secret] b"
    assert regression.redactor(secrets=[ODD_KEY])(spelled(quoted)) == "[REDACTED:secret]"


VALUE_TEXT = st.lists(st.sampled_from(list("ab \n-1")) | ANY_CHAR, max_size=30).map("".join)


@given(VALUE_TEXT, st.sampled_from([MIXED_KEY, ODD_KEY, "jane.doe@example.com", "4111 1111 1111 1111",
                                    "4111-1111-1111-1111", "4111\u200b1111\u200b1111\u200b1111"]),
       VALUE_TEXT, st.integers(0, 80))
@settings(max_examples=200, **HYPOTHESIS)
def test_a_cut_never_ends_inside_a_value(before, value, after, limit):
    """Evidence is cut before it is masked: the cut keeps a value whole or drops all of it."""
    text = before + value + after
    kept = regression.cut_whole(text, limit)
    assert text.startswith(kept) and len(kept) <= limit
    assert not len(before) < len(kept) < len(before) + len(value), (kept, text)


def test_evidence_cut_through_a_key_or_a_masked_value_keeps_no_part_of_it(tmp_path):
    """A wrong field's note quotes 60 characters of the answer, cut before the row is masked: a key
    or an e-mail address across the cut left its first characters, which no mask recognises, on
    the console, in the record and in every report."""
    suite = {"response_format": {"type": "json_object"},
             "cases": [{"id": "key", "input": "key", "expect": {"reply": "fine"}},
                       {"id": "mail", "input": "mail", "expect": {"reply": "fine"}}]}
    pad = "x" * 40
    result, files = run_echoing_key(tmp_path, suite, lambda key, user: json.dumps(
        {"reply": f"{pad} key {key} end" if user == "key" else f"{pad} mail jane.doe@example.com end"}),
                                    ["--redact-pii"])
    assert result.returncode == 1, result.stderr
    assert len(files) == 4
    notes = [row["details"]["evidence"]["wrong_reply"]["note"] for row in json.loads(files["run.json"])["runs"]]
    assert notes == [f'reply "{pad} key ...", expected "fine"', f'reply "{pad} mail ...", expected "fine"']
    for text in [result.stdout, result.stderr, *files.values()]:
        for hidden in (MIXED_KEY[:8], "jane.do"):
            assert hidden.lower() not in text.lower()


def run_openai_with_odd_key(tmp_path, reply):
    """One openai row sent ODD_KEY (as MY_KEY) to a fake answering with `reply`, which fails it:
    (the CLI result, the record's text)."""
    with FakeServer(reply) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_KEY",
                          "--models", "m", "--suite", GUARDRAILS, "--out", tmp_path / "run.json"],
                         child_env(MY_KEY=ODD_KEY), tmp_path)
    assert result.returncode == 2, result.stderr
    return result, (tmp_path / "run.json").read_text(encoding="utf-8")


def test_an_error_body_is_masked_by_the_runs_one_key_rule_before_its_cut(tmp_path):
    """endpoint_text masked the key with its own replace loop, blind to the lower-case
    percent-encoding the stored-row mask reads: that form across the 300-character cut left
    26 characters of the encoded key in the record and on the console."""
    def reply(request):
        key = request.headers["Authorization"].split(" ", 1)[1]
        return Reply(500, {"error": {"message": "e" * 270 + " " + urllib.parse.quote(key, safe="").lower() + " x"}})

    result, stored = run_openai_with_odd_key(tmp_path, reply)
    assert "[REDACTED:secret] x" in json.loads(stored)["runs"][0]["error_message"]
    for text in (stored, result.stdout, result.stderr):
        assert "sk-trust%2f" not in text.lower()


@pytest.mark.parametrize("userinfo", ["alice:S3cretPassw0rd@", "alice@", ":S3cretPassw0rd@", "@"])
def test_a_base_url_holding_credentials_is_a_problem_that_never_quotes_them(userinfo):
    problem = regression.base_url_problem(f"http://{userinfo}127.0.0.1:8000/v1", "MY_URL")
    assert problem.startswith("MY_URL: holds credentials") and "S3cret" not in problem


def test_a_base_url_with_credentials_is_refused_before_the_sdk_sends_them_as_a_basic_header(tmp_path):
    """httpx turns user:password@ in PERPLEXITY_BASE_URL into "Authorization: Basic base64(...)"
    in place of the key: an endpoint that echoed it put the header into the record and on the
    console. A URL with credentials is refused (urllib could not use one either)."""
    seen = []

    def reply(request):
        seen.append(request.headers.get("Authorization"))
        return Reply(401, {"error": {"message": f"bad credentials {request.headers.get('Authorization')}"}})

    with FakeServer(reply) as server:
        with_credentials = server.url.replace("http://", "http://alice:S3cretPassw0rd@")
        runs = [([], child_env(PERPLEXITY_API_KEY=PLAIN_KEY, PERPLEXITY_BASE_URL=with_credentials)),
                (["--dry-run"], child_env(PERPLEXITY_API_KEY=PLAIN_KEY, PERPLEXITY_BASE_URL=with_credentials)),
                (["--provider", "openai", "--base-url", with_credentials + "/v1", "--suite", GUARDRAILS],
                 child_env(OPENAI_API_KEY=PLAIN_KEY))]
        results = run_many([([*argv, "--models", "m", "--timeout", "5", "--out", tmp_path / f"run{n}.json"], env, tmp_path)
                            for n, (argv, env) in enumerate(runs)])
    assert seen == []
    for result, source in zip(results, ["PERPLEXITY_BASE_URL", "PERPLEXITY_BASE_URL", "--base-url"]):
        assert result.returncode == 2, result.stderr
        assert one_error_line(result.stderr).endswith(f"{source}: holds credentials (user:password@host); give the key "
                                                      "through its environment variable")
        assert "S3cret" not in result.stdout + result.stderr
    assert files_under(tmp_path) == []


JSON_ENCODERS = {
    "php": lambda key: json.dumps(key)[1:-1].replace("/", "\\/"),  # json_encode escapes slashes
    "every-char": lambda key: "".join(f"\\u{ord(c):04x}" for c in key),
    "every-char-upper-hex": lambda key: "".join(f"\\u{ord(c):04X}" for c in key),
    "some-chars": lambda key: "".join(f"\\u{ord(c):04x}" if n % 3 == 0 else json.dumps(c)[1:-1]
                                      for n, c in enumerate(key)),
}


@pytest.mark.parametrize("encoder", JSON_ENCODERS, ids=list(JSON_ENCODERS))
@pytest.mark.parametrize("secret", [ODD_KEY, MIXED_KEY])
def test_a_key_escaped_in_raw_json_text_any_way_is_masked(secret, encoder):
    spelled = JSON_ENCODERS[encoder](secret)
    assert json.loads(f'"{spelled}"') == secret
    text = regression.redactor(secrets=[secret])(f'{{"error": "bad key {spelled}"')
    assert text == '{"error": "bad key [REDACTED:secret]"'
    assert regression.endpoint_text(f"bad key {spelled}", [secret]) == "bad key [REDACTED:secret]"


def test_a_key_in_an_error_body_that_is_not_json_is_masked_however_it_was_escaped(tmp_path):
    """An error body that does not parse is kept as text, escapes and all: PHP's json_encode
    writes a key's "/" as "\\/", a form the key's mask did not know, so the record and the
    console kept the key."""
    def reply(request):
        key = request.headers["Authorization"].split(" ", 1)[1]
        return Reply(401, raw=('{"error": {"message": "invalid key ' + JSON_ENCODERS["php"](key) + '"}').encode())

    result, stored = run_openai_with_odd_key(tmp_path, reply)
    assert json.loads(stored)["runs"][0]["error_message"].endswith('"invalid key [REDACTED:secret]"}')
    for text in (stored, result.stdout, result.stderr):
        assert "Zq8+TfW3" not in text


SPLIT_PARTS = [["Your card 4111 1111 ", "1111 1111 is on file"], ["mail jane.doe@exa", "", "mple.com today"],
               ["key sk-trustHq4W", "nP7sLx2VbT9mKc3DzzQ end"]]


@pytest.mark.parametrize("parts", SPLIT_PARTS, ids=["card", "email", "key"])
def test_a_value_split_across_text_parts_is_masked_whole(parts):
    mask = regression.redactor(pii=True, secrets=[MIXED_KEY])
    masked = mask({"content": [{"type": "text", "text": part} for part in parts]})
    texts = [part["text"] for part in masked["content"]]
    assert "".join(texts) == mask("".join(parts)) and len(texts) == len(parts)
    assert "REDACTED" in texts[0] and not any(char.isdigit() or "@" in char for char in "".join(texts))


def test_a_value_split_across_content_parts_is_masked_in_the_response_too(tmp_path):
    """The answer joins its content parts, so a card, e-mail or key split across two parts was
    masked in answer_text but stored whole, in pieces, in the response."""
    def reply(request):
        key = request.headers["Authorization"].split(" ", 1)[1]
        body = fakes.chat_response("x")
        body["choices"][0]["message"]["content"] = [
            {"type": "text", "text": part} for part in ["Card 4111 1111 ", "1111 1111, mail jane.doe@exa",
                                                        f"mple.com, key {key[:10]}", f"{key[10:]}."]]
        return Reply(body=body)

    with FakeServer(reply) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_KEY",
                          "--models", "m", "--suite", GUARDRAILS, "--redact-pii", "--out", tmp_path / "run.json"],
                         child_env(MY_KEY=MIXED_KEY), tmp_path)
    assert result.returncode == 1, result.stderr
    row = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))["runs"][0]
    parts = [part["text"] for part in row["response"]["choices"][0]["message"]["content"]]
    assert "".join(parts) == row["answer_text"] == \
        "Card [REDACTED:card], mail [REDACTED:email], key [REDACTED:secret]."


@pytest.mark.parametrize("patterns", [["p4ss(w0rdSECRET"], ["ok", "(?P<SECRETNAME>a)(?P=SECRETNAMEX)"],
                                      ["[z-aSECRET]"], ["SECRET{99999999999}"]])
def test_an_invalid_redact_pattern_is_one_line_that_never_quotes_it(tmp_path, patterns):
    """A --redact pattern can be the secret itself (a literal with a "(" is not a valid regex):
    the usage error quoted it, and re's message quotes parts of it too."""
    result = run_cli(["--provider", "echo", "--suite", GUARDRAILS, "--out", tmp_path / "run.json",
                      *[arg for pattern in patterns for arg in ("--redact", pattern)]], child_env(), tmp_path)
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "--redact" in line and "not a valid regular expression" in line
    assert "SECRET" not in result.stdout + result.stderr
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_a_key_given_as_the_api_key_env_name_is_refused_without_echoing_it(tmp_path, extra):
    """`--api-key-env $OPENROUTER_API_KEY` (the key, where its variable's name belongs) was
    echoed: "sk-or-v1-... (named by --api-key-env) is not set"."""
    key = "sk-or-v1-" + PLAIN_KEY
    result = run_cli(["--provider", "openai", "--base-url", "http://127.0.0.1:9/v1", "--api-key-env", key,
                      "--models", "m", "--suite", GUARDRAILS, "--out", tmp_path / "run.json", *extra],
                     child_env(), tmp_path)
    assert result.returncode == 2
    assert "--api-key-env takes the NAME" in one_error_line(result.stderr)
    assert PLAIN_KEY[5:] not in result.stdout + result.stderr and files_under(tmp_path) == []


def test_redact_pii_masks_an_email_written_as_a_link_an_entity_or_a_json_escape(tmp_path):
    """An answer's mailto link spells the @ as %40, HTML as &#64;: --redact-pii kept both."""
    answer = ("Write to <a href='mailto:jane.doe%40example.com'>us</a>, to bob.roe&#64;example.org, "
              "or ann.poe&#x40;example.net.")
    suite = {"cases": [{"id": "c", "input": "Who do I write to?", "contains": ["write"]}]}
    result, files = run_echoing_key(tmp_path, suite, lambda key, user: answer, ["--redact-pii"])
    assert result.returncode == 0, result.stderr
    assert json.loads(files["run.json"])["runs"][0]["answer_text"] == (
        "Write to <a href='mailto:[REDACTED:email]'>us</a>, to [REDACTED:email], or [REDACTED:email].")
    for text in [result.stdout, *files.values()]:
        for name in ("jane.doe", "bob.roe", "ann.poe"):
            assert name not in text
    assert regression.redactor(pii=True)("jane\\u0040example.com") == "[REDACTED:email]"


def test_redact_pii_masks_a_card_that_a_letter_touches(tmp_path):
    """Only a longer run of digits is not a card: a letter before or after one ("card4111...",
    "...1111cvv") kept it whole in the record and every report."""
    answer = "Charged card4111111111111111 and 5500 0055 5555 5559cvv, ticket 12345678901234567890."
    suite = {"cases": [{"id": "c", "input": "Which cards?", "contains": ["charged"]}]}
    result, files = run_echoing_key(tmp_path, suite, lambda key, user: answer, ["--redact-pii"])
    assert result.returncode == 0, result.stderr
    assert json.loads(files["run.json"])["runs"][0]["answer_text"] == (
        "Charged card[REDACTED:card] and [REDACTED:card]cvv, ticket 12345678901234567890.")
    for text in [result.stdout, *files.values()]:
        text = re.sub(r"[0-9a-f]{64}", "", text)  # a digest (code_sha256) may hold 5559 by chance
        assert "4111111111111111" not in text and "5559" not in text


@pytest.mark.parametrize("provider", ["perplexity", "openai"])
def test_a_key_in_a_redirect_host_is_masked_though_the_host_is_lower_cased(tmp_path, provider):
    """The redirect note names Location's host, which urllib lower-cases: a mixed-case key
    there was not the key's form the mask knew, so the perplexity row stored it."""
    key = "Trust4WnP7sLx2VbT9mKc3DzzQ"  # no vendor prefix: only the key's own mask can catch it

    def reply(request):
        sent = request.headers["Authorization"].split(" ", 1)[1]
        return Reply(302, {"x": 1}, headers={"Location": f"https://{sent}.evil.example/v1/chat/completions"})

    with FakeServer(reply) as server:
        if provider == "openai":
            argv, env = ["--provider", "openai", "--base-url", server.url + "/v1", "--api-key-env", "MY_KEY",
                         "--suite", GUARDRAILS], child_env(MY_KEY=key)
        else:
            argv, env = [], child_env(PERPLEXITY_API_KEY=key, PERPLEXITY_BASE_URL=server.url)
        result = run_cli([*argv, "--models", "m", "--timeout", "5", "--out", tmp_path / "run.json"], env, tmp_path)
    assert result.returncode == 2, result.stderr
    stored = (tmp_path / "run.json").read_text(encoding="utf-8")
    assert "redirect to [REDACTED:secret].evil.example not followed" in json.loads(stored)["runs"][0]["error_message"]
    for text in (stored, result.stdout, result.stderr):
        assert key.lower() not in text.lower()


def test_a_key_split_by_an_escaped_invisible_character_in_a_json_answer_is_masked(tmp_path):
    """A JSON answer writes a zero-width space as the escape \\u200b: the mask read through the
    character but not through its escape, so the answer_text of a JSON case kept the key."""
    suite = {"response_format": {"type": "json_object"},
             "cases": [{"id": "c", "input": "hi", "expect": {"reply": "fine"}}]}
    result, files = run_echoing_key(tmp_path, suite, lambda key, user: json.dumps(
        {"reply": f"{key[:9]}\u200b{key[9:]}", "note": f"{key[:3]}\u00ad\ufeff{key[3:]}"}))
    assert result.returncode == 1, result.stderr
    row = json.loads(files["run.json"])["runs"][0]
    assert row["answer_text"] == '{"reply": "[REDACTED:secret]", "note": "[REDACTED:secret]"}'
    for text in [result.stdout, result.stderr, *files.values()]:
        assert MIXED_KEY[9:].lower() not in text.lower()


def test_an_error_message_cut_before_masking_keeps_no_part_of_the_key(tmp_path):
    """An exception's text is cut to MAX_ERROR_MESSAGE_CHARS before masking; a --redact pattern
    that masks a long blob then brings the cut into the stored 500 characters, and the key's
    first 25 characters, cut there, were stored."""
    key = "Trust4WnP7sLx2VbT9mKc3DzzQ"

    def reply(request):
        sent = request.headers["Authorization"].split(" ", 1)[1]
        return Reply(500, {"error": "x" * 10 + " " + "QUJD" * 16368 + " " + sent + " tail"})

    with FakeServer(reply) as server:
        result = run_cli(["--models", "m", "--timeout", "5", "--out", tmp_path / "run.json",
                          "--redact", "[A-Za-z0-9+/=]{40,}"],
                         child_env(PERPLEXITY_API_KEY=key, PERPLEXITY_BASE_URL=server.url), tmp_path)
    assert result.returncode == 2, result.stderr
    stored = (tmp_path / "run.json").read_text(encoding="utf-8")
    assert json.loads(stored)["runs"][0]["error_message"].rstrip().endswith("'xxxxxxxxxx [REDACTED]")
    for text in (stored, result.stdout, result.stderr):
        assert key[:8] not in text
