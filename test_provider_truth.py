"""Providers that tell the truth (issue 12) and a provider table that is real (issue 10 item 1).

Every endpoint is a loopback fakes.FakeServer; keys are fake strings; files go under tmp_path.
Fixed hostile inputs run through the real CLI (a subprocess) and pin their exit code.
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fakes
import regression
from fakes import FakeServer, Reply

ROOT = Path(regression.__file__).resolve().parent
SUITES = ROOT / "suites"
AGENT_TOOLS = SUITES / "agent-tools.json"
GUARDRAILS = SUITES / "support-guardrails.json"
SECRET = "sk-test-TRUTH0123456789abcdef"
SCRUBBED_PREFIXES = ("PERPLEXITY_", "OPENAI_", "REGRESSION_", "MY_ENDPOINT_KEY")
PROXY_VARIABLES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No real key, base URL, twin variable or proxy leaks in; the default --out lands in tmp_path."""
    for name in list(os.environ):
        if name.startswith(SCRUBBED_PREFIXES) or name.lower() in PROXY_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def cli_env(**extra):
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


def run_main(argv):
    try:
        return regression.main([str(arg) for arg in argv])
    except SystemExit as exc:
        return exc.code


def read_record(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_suite(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def error_line(stderr):
    """The one error line of a refused run (notes may precede it), never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.strip().splitlines() if line.startswith("regression.py: error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def openai_args(server, *extra, models=("m",), suite=AGENT_TOOLS, out=None):
    argv = ["--provider", "openai", "--base-url", server.url + "/v1", "--models", *models, "--suite", suite]
    return [*argv, *(["--out", out] if out else []), *extra]


# ====================================================================== A. the provider table (issue 10 item 1)

DECLARED = ("name", "key_variable", "key_required", "key_hosts", "base_url_flag", "base_url_variable",
            "default_base_url", "evidence", "default_models", "server_search", "tool_loops", "reports_cost")


@pytest.mark.parametrize("name", sorted(regression.PROVIDERS))
def test_every_provider_declares_its_set_up(name):
    cls = regression.PROVIDERS[name]
    assert issubclass(cls, regression.Provider)
    assert cls.name == name
    for attribute in DECLARED:
        assert hasattr(cls, attribute), attribute
    for method in ("endpoint", "problem", "from_settings", "identity", "sdk_version", "cost_reported"):
        assert callable(getattr(cls, method)), method
    assert callable(getattr(cls, "request"))
    assert cls.replays_record or callable(getattr(cls, "parse"))  # a replay parses as its record's provider
    # what a key or endpoint variable is, is a name, never a value
    for variable in (cls.key_variable, cls.base_url_variable):
        assert variable is None or variable.isupper()


def _provider_classes():
    tree = ast.parse((ROOT / "regression.py").read_text(encoding="utf-8"))
    names = {cls.__name__ for cls in regression.PROVIDERS.values()} | {"Provider"}
    return tree, [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name in names]


def test_no_provider_name_dispatch_outside_the_provider_classes():
    """`if provider == "openai"` (or `in ("echo", ...)`) lives nowhere but in the classes (issue 10)."""
    tree, classes = _provider_classes()
    inside = {id(node) for cls in classes for node in ast.walk(cls)}
    offenders = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or id(node) in inside:
            continue
        sides = [node.left, *node.comparators]
        constants = [side.value for side in sides if isinstance(side, ast.Constant)]
        constants += [item.value for side in sides if isinstance(side, (ast.Tuple, ast.List, ast.Set))
                      for item in side.elts if isinstance(item, ast.Constant)]
        if any(value in regression.PROVIDERS for value in constants if isinstance(value, str)) and \
                "provider" in ast.unparse(node):
            offenders.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


class ToyProvider(regression.Provider):
    """toy: a provider added as one class, to prove the CLI loops over the table."""

    name = "toy"
    key_variable, key_required = "TOY_API_KEY", True
    base_url_variable, default_base_url = "TOY_BASE_URL", "https://toy.invalid/v1"
    evidence = "toy-evidence"
    default_models = ["toy-small", "toy-large"]
    reports_cost = True

    @classmethod
    def from_settings(cls, settings, env):
        return cls(), env[cls.key_variable]

    def request(self, model, suite, case, repeat=0):
        return {"output_text": f"{model} says hello", "status": "completed",
                "usage": {"cost": {"currency": "USD", "total_cost": 0.001}}}

    parse = staticmethod(regression.echo_trace)


def test_a_new_provider_is_one_class(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(regression.PROVIDERS, "toy", ToyProvider)
    suite = write_suite(tmp_path / "s.json", {"name": "toy", "instructions": "",
                                              "cases": [{"id": "hi", "input": "hi", "contains": ["hello"]}]})
    out = tmp_path / "run.json"
    # its key rule comes from the class
    assert run_main(["--provider", "toy", "--suite", suite, "--out", out]) == 2
    assert "TOY_API_KEY is not set" in capsys.readouterr().err
    assert not out.exists()
    # --base-url belongs to the providers that declare it
    assert run_main(["--provider", "toy", "--base-url", "http://127.0.0.1:9/v1", "--suite", suite, "--out", out]) == 2
    err = capsys.readouterr().err
    assert "--base-url goes with --provider openai" in err and "TOY_BASE_URL" in err
    monkeypatch.setenv("TOY_API_KEY", "toy-key")
    monkeypatch.setenv("TOY_BASE_URL", "https://user:pw@toy.example/v2?sig=1")
    assert run_main(["--provider", "toy", "--suite", suite, "--out", out]) == 0
    record = read_record(out)
    assert record["provider"] == {"name": "toy", "base_url": "https://toy.example/v2"}
    assert record["evidence"] == "toy-evidence"
    assert record["config"]["models"] == ["toy-small", "toy-large"]
    assert [row["answer_text"] for row in record["runs"]] == ["toy-small says hello", "toy-large says hello"]
    # resume against another endpoint is refused, naming both
    capsys.readouterr()
    monkeypatch.setenv("TOY_BASE_URL", "https://elsewhere.example/v1")
    assert run_main(["--resume", out]) == 2
    err = capsys.readouterr().err
    assert "https://toy.example/v2" in err and "https://elsewhere.example/v1" in err


@pytest.mark.parametrize("name", ["openai", "perplexity"])
def test_identity_never_stores_credentials_or_query(name, monkeypatch):
    cls = regression.PROVIDERS[name]
    settings = regression.argparse.Namespace(base_url=None, api_key_env=None, replay=None, timeout=1.0)
    url = "https://user:hunter2@api.example:8443/v1?key=hunter2#frag"
    if cls.base_url_flag:
        settings.base_url = url
    env = {cls.base_url_variable: url}
    assert cls.identity(settings, env) == {"name": name, "base_url": "https://api.example:8443/v1"}
