"""The yardsticks of the start-up and live fixed-cost benchmarks measure what they claim.

bench/startup.py and bench/live_cost.py hold regression.py to bench/tutorial_runner.py (the
plain runner a team writes from the Perplexity tutorial). A yardstick that sent nothing, or
a fake that served one side only, would make either ratio lie; these pin both in-process.
"""

import importlib.util
import json

import pytest

import fakes
from testkit import ROOT, read_record, run_main

BENCH = ROOT / "bench"


def load(name):
    """A bench/ script as a module (bench/ is no package; its scripts put it on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def live_server(monkeypatch):
    """The live_cost benchmark's fake, with the environment its children get."""
    live_cost = load("live_cost")
    with fakes.FakeServer(live_cost.reply) as server:
        for name, value in live_cost.common.child_env(server.url).items():
            monkeypatch.setenv(name, value)
        yield server


def test_tutorial_runner_sends_its_four_cases_on_the_sdk_chat_route(live_server, tmp_path,
                                                                     monkeypatch):
    """Its dry run sends nothing; its run sends 4 chat completions and writes 4 passed rows."""
    tutorial = load("tutorial_runner")
    monkeypatch.setattr("sys.argv", ["tutorial_runner.py", "--dry-run"])
    assert tutorial.main() == 0 and live_server.count == 0
    out = tmp_path / "results.json"
    monkeypatch.setattr("sys.argv", ["tutorial_runner.py", "--out", str(out)])
    assert tutorial.main() == 0
    assert [request.path for request in live_server.requests] == ["/chat/completions"] * 4
    assert [row["passed"] for row in json.loads(out.read_text())] == [True] * 4


def test_live_cost_fake_answers_the_runners_four_requests(live_server, tmp_path):
    """The runner's side of the same fake: 4 Agent API requests, every row passed (exit 0)."""
    assert run_main(["--models", "m1", "--out", tmp_path / "r.json"]) == 0
    assert [request.path for request in live_server.requests] == ["/v1/responses"] * 4
    assert len(read_record(tmp_path / "r.json")["runs"]) == 4


def test_startup_times_every_form_of_the_dry_run_and_the_tutorial(tmp_path):
    """The console script beside the interpreter is measured; without one, no silent gap."""
    startup = load("startup")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    with pytest.raises(startup.MeasureError, match="no agent-regression beside"):
        startup.build_commands(str(python), True)
    script = bin_dir / "agent-regression"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    commands = {label: (build("scratch"), extra)
                for label, build, _, extra in startup.build_commands(str(python), True)}
    assert commands[startup.CACHED[1]][0] == [str(script), "--dry-run"]
    assert commands[startup.TUTORIAL][0][1:] == [str(BENCH / "tutorial_runner.py"), "--dry-run"]
    assert commands[startup.TUTORIAL][1] == {"PERPLEXITY_API_KEY": startup.common.TEST_KEY}
    assert {startup.SCRIPT, startup.CACHED[0]} <= set(commands)
    assert len(startup.build_commands(str(python), False)) == 3


def test_text_calls_bench_reads_answers_that_hold_no_call(capsys):
    """Its hostile answers make every reader work yet hold no call: the figures measure the
    readers' worst path, not a call found early."""
    text_calls = load("text_calls")
    assert text_calls.main(["--runs", "1", "--size", "20000"]) == 0
    printed = capsys.readouterr().out
    assert all(kind in printed for kind in text_calls.UNITS) and "goal:" in printed
