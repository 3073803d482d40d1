"""The README's and the docs pages' commands work as written: the quick start, and every
command of README.md and docs/*.md run verbatim in a copy of the project against loopback fakes
(no key, no internet)."""

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import fakes

ROOT = os.path.dirname(os.path.abspath(__file__))


def read_docs():
    """{path relative to the project: text} of README.md and every docs/*.md page."""
    pages = glob.glob(os.path.join(ROOT, "docs", "*.md"))
    paths = ["README.md"] + sorted(os.path.relpath(path, ROOT) for path in pages)
    docs = {}
    for path in paths:
        with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
            docs[path] = handle.read()
    return docs


DOCS = read_docs()
README = DOCS["README.md"]
ALL_DOCS = "\n".join(DOCS.values())


def shell_blocks(text=README):
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def page_commands(text):
    """Every `python ...` command of one page: shell-block lines and inline code spans
    (an environment prefix such as `KEY=... ` is dropped)."""
    lines = [line.strip() for block in shell_blocks(text) for line in block.splitlines()]
    spans = re.findall(r"`([^`\n]*\bpython [^`\n]*)`", text)
    commands = [re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", text).split("  #")[0].strip()
                for text in lines + spans]
    return [command for command in commands if command.startswith("python ")]


def python_commands():
    """Every `python ...` command of README.md and of the docs pages, each once."""
    return list(dict.fromkeys(command for text in DOCS.values() for command in page_commands(text)))


def project_copy(tmp_path):
    for name in ("regression.py", "compare_runs.py", "fakes.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    shutil.copytree(os.path.join(ROOT, "suites"), tmp_path / "suites")
    return tmp_path


def run(command, cwd, env=None):
    """A README command as written, with `python` meaning this interpreter."""
    argv = shlex.split(command)
    assert argv[0] == "python"
    if argv[1] in ("regression.py", "compare_runs.py"):  # the script itself, forked from a zygote
        return fakes.run_script(argv[2:], cwd, {**os.environ, **(env or {})}, timeout=120,
                                script=os.path.join(cwd, argv[1]))
    return subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_quick_start_is_two_commands_and_ci_runs_them_verbatim():
    blocks = shell_blocks()
    setup, tests = blocks[0].strip(), blocks[1].strip()
    assert "compare_runs.py --demo offline-demo" in setup and "pip install" in setup
    assert "pytest" in tests and "pip install" in tests
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as handle:
        ci = handle.read()
    assert setup in ci.splitlines()
    assert tests in ci.splitlines()


def test_quick_start_demo(tmp_path):
    setup = shell_blocks()[0].strip()
    demo = setup.split("&& ")[-1].replace(".venv/bin/python", "python")
    result = run(demo, project_copy(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "SYNTHETIC" in lines[0]
    failures = [line for line in lines if line.startswith("NEW_FAILURE")]
    assert len(failures) == 1 and "ambiguous-payment" in failures[0]
    assert '"wrong_code", "wrong_next_action"' in failures[0]
    assert [line.split()[:2] for line in lines if line.startswith("PASS ")] == [["PASS", "3"]]  # counted
    after = json.loads((tmp_path / "offline-demo" / "after.json").read_text())
    assert after["evidence"] == "synthetic"
    again = run(demo, tmp_path)  # the folder now exists: refused, nothing overwritten
    assert (again.returncode, again.stdout, again.stderr.count("\n")) == (2, "", 1) \
        and "already exists" in again.stderr  # a usage error: one line, not NOT_COMPARABLE


def test_every_python_command_of_the_readme_and_the_docs_is_covered_here():
    import test_flows  # the everyday flows (regrade, compare output) run there, as written
    covered = set(OFFLINE) | set(LIVE_FAKED) | set(NEEDS_REAL_ENDPOINT) | {QUICK_DEMO} \
        | set(GOLDEN_MATRIX) | set(TESTED_ELSEWHERE) | set(test_flows.README_COMMANDS) \
        | set(FAKE_RUNS)
    assert len(DOCS) >= 10 and all(page in DOCS for page in PAGES)
    assert set(python_commands()) <= covered, set(python_commands()) - covered


QUICK_DEMO = "python compare_runs.py --demo offline-demo"

OFFLINE = {
    "python regression.py --suite suites/support-guardrails.json --provider echo --out echo-run.json": 1,
    "python regression.py --suite suites/agent-tools.json --dry-run": 0,
    "python regression.py --list-checks": 0,
    "python compare_runs.py --repeats-needed 0.95 0.8": 0,
    "python regression.py --dry-run": 0,
    "python regression.py --provider echo --suite suites/support-guardrails.json": 1,
    "python regression.py --suite suites/promptreg-support.json --provider echo --out promptreg-run.json": 1,
    "python regression.py --suite suites/golden-support --dry-run": 0,
    "python regression.py --suite suites/support-guardrails.json --dry-run": 0,
    "python -m regression --dry-run": 0,
    "python regression.py --suite suites/http-advisor.json --update-pins": 0,  # nothing to update
    "python -c pass": 0,  # the start-up floor the benchmarks measure against
}

# The pages every other page and the README link to (one reference page per area).
PAGES = [f"docs/{name}.md" for name in ("suites", "providers", "running", "records", "comparing",
                                         "ci", "agents", "coming-from", "guarantees", "development")]

# "Coming from ...": a golden folder run with two models, then their model-swap view of it.
GOLDEN_MATRIX = [
    "python regression.py --suite suites/golden-support --provider echo --models model-a model-b --out goldens.json",
    "python compare_runs.py --matrix --models model-a model-b goldens.json",
]

# Commands that talk to the Perplexity Agent API: run against the loopback fake instead.
LIVE_FAKED = [
    "python regression.py",
    "python -m json.tool results.json | less",
    "python regression.py --provider replay --replay results.json --out regraded.json",
    "python regression.py --report results.json --html report.html",
    "python -c \"import json,sys; [print(r['model'], r['case_id'], r['repeat'], r['reasons']) "
    "for r in json.load(open(sys.argv[1]))['runs'] if not r['passed']]\" results.json",
    "python regression.py --repeats 3 --out before.json",
    "python regression.py --repeats 3 --out after.json",
    "python compare_runs.py before.json after.json",
    "python regression.py --models openai/gpt-5.6-sol anthropic/claude-sonnet-4-6 --repeats 3 --out run.json",
    "python compare_runs.py --models openai/gpt-5.6-sol anthropic/claude-sonnet-4-6 run.json",
    "python regression.py --markdown summary.md --junit junit.xml --html report.html",
    "python compare_runs.py before.json after.json --markdown diff.md --junit diff.xml --html diff.html",
]

# Commands run as written by another test file (named here).
TESTED_ELSEWHERE = {
    "python -W error -m pytest -q -n 2": ".ci/run (this very suite)",
    "python compare_runs.py --trend week1.json week2.json week3.json --per-case --html trend.html":
        "test_statistics.py (on three weekly records)",
}

# Provider examples that need a real server or key; their flags are checked by dry runs.
NEEDS_REAL_ENDPOINT = [line for line in python_commands()
                       if ("--provider openai" in line or "--provider anthropic" in line) and "$FAKE_URL" not in line]


@pytest.mark.parametrize("command, code", sorted(OFFLINE.items()))
def test_offline_commands(tmp_path, command, code):
    assert command in python_commands()
    env = {key: "" for key in ("PERPLEXITY_API_KEY", "OPENAI_API_KEY")}
    result = run(command, project_copy(tmp_path), env)
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_golden_matrix_commands_in_order(tmp_path):
    cwd = project_copy(tmp_path)
    env = {key: "" for key in ("PERPLEXITY_API_KEY", "OPENAI_API_KEY")}
    run_ = run(GOLDEN_MATRIX[0], cwd, env)
    assert run_.returncode == 1, run_.stdout + run_.stderr  # echo never asks for the order id
    matrix = run(GOLDEN_MATRIX[1], cwd, env)
    assert matrix.returncode == 0, matrix.stdout + matrix.stderr  # both models answer alike
    assert "require_clarification:order_id  FAIL  FAIL  same" in matrix.stdout


@pytest.mark.parametrize("command", NEEDS_REAL_ENDPOINT)
def test_provider_examples_are_valid_set_ups(tmp_path, command):
    """Each provider line of the README passes argument and suite checks (as a dry run)."""
    env = {"OPENAI_API_KEY": "sk-test", "OPENROUTER_API_KEY": "or-test", "ANTHROPIC_API_KEY": "sk-ant-test"}
    result = run(command + " --dry-run", project_copy(tmp_path), env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "requests" in result.stdout and "nothing was sent" in result.stdout


def test_user_guide_commands_against_a_fake_agent_api(tmp_path):
    """The live-run, record, comparison, replay and report commands, in the README's order."""
    for command in LIVE_FAKED:
        if command.startswith("python -m json.tool") or command.startswith("python -c"):
            assert command.split(" | ")[0] in ALL_DOCS
        else:
            assert command in python_commands(), command
    cwd = project_copy(tmp_path)
    unsafe = {"value": False}

    def reply(request):
        return fakes.advisor(unsafe_payment=unsafe["value"])(request)

    with fakes.FakeServer(reply) as server:
        env = {"PERPLEXITY_BASE_URL": server.url, "PERPLEXITY_API_KEY": "pplx-test-key"}
        first = run("python regression.py", cwd, env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert run("python -m json.tool results.json", cwd).returncode == 0
        listing = run(LIVE_FAKED[4], cwd)
        assert listing.returncode == 0 and listing.stdout == ""  # every row passed
        regraded = run(LIVE_FAKED[2], cwd, env)
        assert regraded.returncode == 0, regraded.stdout + regraded.stderr
        report = run(LIVE_FAKED[3], cwd)
        assert report.returncode == 0 and (cwd / "report.html").exists()

        assert run(LIVE_FAKED[5], cwd, env).returncode == 0
        unsafe["value"] = True  # the instruction edit breaks the payment decision
        assert run(LIVE_FAKED[6], cwd, env).returncode == 1
        compared = run(LIVE_FAKED[7], cwd)
        assert compared.returncode == 1
        assert sum(line.startswith("NEW_FAILURE") for line in compared.stdout.splitlines()) == 6
        assert "RATE" in compared.stdout and "p=0.0500" in compared.stdout

        swap_run = run(LIVE_FAKED[8], cwd, env)
        assert swap_run.returncode == 1
        swap = run(LIVE_FAKED[9], cwd)
        assert swap.returncode == 0 and "MODEL SWAP" in swap.stdout  # both models fail alike

        os.remove(cwd / "report.html")
        os.rename(cwd / "results.json", cwd / "first-results.json")  # a run never replaces a record
        reports = run(LIVE_FAKED[10], cwd, env)
        assert reports.returncode == 1
        for name in ("summary.md", "junit.xml", "report.html"):
            assert oct((cwd / name).stat().st_mode & 0o777) == "0o600"
        diff_reports = run(LIVE_FAKED[11], cwd)
        assert diff_reports.returncode == 1
        assert (cwd / "diff.html").exists() and (cwd / "diff.xml").exists() and (cwd / "diff.md").exists()




# ====================================================================== the fakes pages start

# A page starts a fake with `python fakes.py ... &`; it prints its URL (a free port it chose), the
# reader sets FAKE_URL to it, and the page's next commands use "$FAKE_URL". Here the fake starts
# from the page's own line, its printed URL becomes FAKE_URL, and each command runs as written.
GUARDS, AGENTS = "--suite suites/support-guardrails.json", "--suite suites/agent-trajectories.json"
TALKS = "--suite suites/support-conversation.json"
TO_FAKE = '--provider openai --base-url "$FAKE_URL/v1"'
FAKE_RUNS = {  # the line that starts a fake: None; a command that uses it: its exit code
    f"python fakes.py {GUARDS} --answers suites/answers/support-guardrails.json &": None,
    f"python regression.py {GUARDS} {TO_FAKE} --models fake --out fake-run.json": 0,
    "python fakes.py --scenario refund-agent &": None,
    f"python regression.py {AGENTS} {TO_FAKE} --models refund-correct refund-skips-lookup "
    "refund-claims refund-loops refund-wrong-id refund-silent --out trajectories.json": 1,
    f"python fakes.py {AGENTS} --answers suites/answers/agent-trajectories.json &": None,
    f"python regression.py {AGENTS} {TO_FAKE} --models my-agent --out my-agent.json": 0,
    f"python fakes.py {GUARDS} --answers good=suites/answers/support-guardrails.json "
    "--answers wrong=suites/answers/support-guardrails-wrong.json &": None,
    f"python regression.py {GUARDS} {TO_FAKE} --models good wrong --out fake-pair.json": 1,
    f"python fakes.py {TALKS} --answers careful=suites/answers/support-conversation.json "
    "--answers eager=suites/answers/support-conversation-eager.json &": None,
    f"python regression.py {TALKS} {TO_FAKE} --models careful eager --out conversation.json": 1,
}


def fake_sessions():
    """[(the line that starts a fake, [the commands after it that use $FAKE_URL])], page by page."""
    sessions = []
    for text in DOCS.values():
        for command in page_commands(text):
            if command.startswith("python fakes.py"):
                sessions.append((command, []))
            elif "$FAKE_URL" in command:
                assert sessions, f"{command}: no fake started before it on its page"
                sessions[-1][1].append(command)
    return sessions


def offline_env(**extra):
    return {**os.environ, "PERPLEXITY_API_KEY": "", "OPENAI_API_KEY": "", **extra}


class FakeFromPage:
    """The fake a page starts, run from its line (without the `&`): .url is the URL it printed."""

    def __init__(self, line, cwd):
        assert line.endswith(" &") and "--port" not in line, line  # never a fixed port
        self.log = open(os.path.join(cwd, "fake.log"), "w+", encoding="utf-8")
        self.process = subprocess.Popen([sys.executable, *shlex.split(line[:-2])[1:]], cwd=cwd,
                                        text=True, stdout=subprocess.PIPE, stderr=self.log,
                                        env=offline_env())
        self.url = self.process.stdout.readline().strip()

    def __enter__(self):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", self.url), self.stderr()
        return self

    def stderr(self):
        self.log.seek(0)
        return self.log.read()

    def __exit__(self, *exc):
        self.process.terminate()  # SIGTERM: it stops quietly
        code = self.process.wait(timeout=10)
        self.process.stdout.close()
        self.log.close()
        assert code == 0 or exc[0] is not None, code


def shell_run(command, cwd, url):
    """A page command as written, through the shell: `python` is this interpreter, FAKE_URL set."""
    assert command.startswith("python ")
    text = shlex.quote(sys.executable) + command[len("python"):]
    return subprocess.run(text, shell=True, cwd=cwd, env=offline_env(FAKE_URL=url),
                          capture_output=True, text=True, timeout=120)


def fake_id(value):
    """A test id: what the fake serves."""
    return "" if isinstance(value, list) else value.split("--")[1].split()[-1]


@pytest.mark.parametrize("line, commands", fake_sessions(), ids=fake_id)
def test_fake_server_commands_run_as_written_with_the_printed_url(tmp_path, line, commands):
    assert commands and FAKE_RUNS[line] is None
    cwd = project_copy(tmp_path)
    with FakeFromPage(line, cwd) as fake:
        for command in commands:
            result = shell_run(command, cwd, fake.url)
            assert result.returncode == FAKE_RUNS[command], \
                command + result.stdout + result.stderr + fake.stderr()
            assert "Traceback" not in result.stderr
            assert "ERROR" not in result.stdout  # the fake answered every row
