"""Helpers shared by the provider and trajectory tests: a scrubbed environment, the CLI as a
subprocess or in-process, and JSON files. Not a test module (pytest collects test_*.py only)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fakes
import regression

ROOT = Path(regression.__file__).resolve().parent
# No real key, base URL, twin variable or proxy may reach a test run.
SCRUBBED_PREFIXES = ("PERPLEXITY_", "OPENAI_", "ANTHROPIC_", "REGRESSION_", "MY_ENDPOINT_KEY", "UNSET_KEY_VAR")
PROXY_VARIABLES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No real key, base URL, twin variable or proxy leaks in; files land in tmp_path."""
    for name in list(os.environ):
        if name.startswith(SCRUBBED_PREFIXES) or name.lower() in PROXY_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def cli_env(**extra):
    """The environment of a CLI subprocess: scrubbed, loopback never proxied, plus `extra`."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(SCRUBBED_PREFIXES) and name.lower() not in PROXY_VARIABLES}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


def run_cli(args, cwd, env=None, timeout=60):
    """python -W error regression.py ARGS as a subprocess."""
    return subprocess.run([sys.executable, "-W", "error", str(ROOT / "regression.py"), *map(str, args)],
                          cwd=cwd, env=env if env is not None else cli_env(), capture_output=True,
                          text=True, timeout=timeout)


def run_forked(args, cwd, env=None, timeout=60):
    """run_cli's `python -W error regression.py ARGS`, forked from a zygote started with -W error
    that paid the SDK import once (fakes.run_script): for a test not about imports or start-up."""
    return fakes.run_script(args, cwd, env if env is not None else cli_env(), timeout=timeout,
                            flags=("-W", "error"))


def run_main(argv):
    """regression.main(argv) in-process; a usage error's SystemExit becomes its code."""
    try:
        return regression.main([str(arg) for arg in argv])
    except SystemExit as exc:
        return exc.code


def read_record(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_suite(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """A real record of played rows (openai provider, scripted refund agents, the example
    agent-trajectories suite): refund-claims fails every case, refund-correct passes every case.
    (Import this fixture into a test module to use it.)"""
    out = tmp_path_factory.mktemp("played") / "run.json"
    with fakes.FakeServer(fakes.refund_agent()) as server:
        assert run_main(["--suite", ROOT / "suites" / "agent-trajectories.json", "--provider",
                         "openai", "--base-url", server.url + "/v1", "--models", "refund-correct",
                         "refund-claims", "--out", out]) == 1
    return read_record(out)


@pytest.fixture
def model_echo():
    """The flags of a model on a loopback server that answers each case with its input. Its
    answers are a model's evidence ("live"), so --update-baseline may approve them; --provider
    echo's are refused. (Import this fixture into a test module to use it.)"""
    import fakes
    echo = fakes.chat(lambda body: fakes.chat_response(body["messages"][-1]["content"]))
    with fakes.FakeServer(echo) as server:
        yield ["--provider", "openai", "--base-url", server.url + "/v1", "--models", "model"]
