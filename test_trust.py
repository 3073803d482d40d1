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
import subprocess
import sys
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
    return subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, env=env or child_env(),
                          capture_output=True, text=True, timeout=timeout)


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
@settings(max_examples=60, **HYPOTHESIS)
def test_clean_printable_key_has_no_problem(value):
    assert regression.key_problem("K", value) is None


PRINTABLE = st.text(alphabet=ASCII_PRINTABLE, max_size=20)
NOT_PRINTABLE = ANY_CHAR.filter(lambda char: not "!" <= char <= "~")


@given(PRINTABLE, NOT_PRINTABLE, PRINTABLE)
@settings(max_examples=60, **HYPOTHESIS)
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
@settings(max_examples=100, **HYPOTHESIS)
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
@settings(max_examples=80, **HYPOTHESIS)
def test_a_short_key_never_rewrites_evidence(secret, value):
    """Masking "x" would rewrite every x of every response: a short key is not masked at all."""
    value = {"response": value, "answer_text": f"{secret} {secret}{secret}", "details": {secret: secret}}
    assert regression.dumps(regression.redactor(secrets=[secret])(value)) == regression.dumps(value)


@given(SECRET_TEXT, st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ANY_TEXT,
                                 lambda inner: st.lists(inner, max_size=4)
                                 | st.dictionaries(SHORT_TEXT, inner, max_size=4), max_leaves=16))
@settings(max_examples=80, **HYPOTHESIS)
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
