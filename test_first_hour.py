"""The first hour (issue 22, points 1, 3, 4, 5, 6): printed commands that run where they are
pasted, --update-pins, --update-baseline that fills what it may and trusts only a model,
allow_extra_fields, and a console that says each thing once (--quiet for CI logs).

Every exit code is pinned through the real CLI (a subprocess, or fakes.cli_table); every
printed command is pasted into a real shell (bash -c) in the folder the user ran it from.
Offline: echo, replay and loopback fakes only."""

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compare_runs
import fakes
import regression
from testkit import cli_env, model_echo  # noqa: F401 (model_echo: a fixture, a model's evidence)

ROOT = Path(regression.__file__).resolve().parent
SCRIPT = ROOT / "regression.py"
VENV_BIN = Path(sys.executable).parent
ENTRY = VENV_BIN / "agent-regression"
GOLDEN = ROOT / "suites" / "golden-support"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="pastes commands into bash")


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(data, indent=2) if not isinstance(data, str) else data, encoding="utf-8"
    )
    return path


def read(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def paste(command, cwd, env):
    """The command pasted into a shell in `cwd`, as a user would: bash parses it."""
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def cli(runs, env=None):
    """[(exit code, stdout, stderr)] of `python regression.py ARGV` for each (argv, cwd), all in
    one interpreter that forks per run (fakes.cli_table): the real CLI, cheaply."""
    return fakes.cli_table(runs, cli_env() if env is None else env)


def run(argv, cwd, env=None):
    """One run of the real CLI (see cli), as a CompletedProcess."""
    ((code, out, err),) = cli([(argv, cwd)], env)
    return subprocess.CompletedProcess(argv, code, out, err)


def compare(argv, cwd, env):
    return subprocess.run(
        [sys.executable, str(ROOT / "compare_runs.py"), *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def hint_after(marker, text):
    """The command a line prints after `marker` (the rest of that line)."""
    lines = [line for line in text.splitlines() if marker in line]
    assert len(lines) == 1, text
    return lines[0].split(marker, 1)[1]


SUITE = {
    "name": "first",
    "instructions": "Answer briefly.",
    "cases": [
        {"id": "a", "input": "alpha", "min_chars": 1},
        {"id": "b", "input": "beta", "min_chars": 1},
        {"id": "c", "input": "gamma", "min_chars": 1},
    ],
}


def unfinished(path, rows=1):
    """An unfinished record at `path` (as a crash leaves one): a run of SUITE cut to `rows` rows."""
    header = regression.record_header(
        regression.run_config(regression.validate_suite(SUITE), ["echo"], 1),
        None,
        "echo",
        suite={"name": "first", "builtin": False, "file": None},
        provider={"name": "echo"},
    )
    suite = regression.validate_suite(SUITE)
    kept = [
        regression.run_row(regression.EchoProvider(), suite, case, "echo", 0)
        for case in suite["cases"][:rows]
    ]
    config = header["config"]
    regression.create_record(
        str(path), header, kept, regression.summary(kept, config["models"], 1, config["cases"])
    ).close()


# ============================================================ 1. the program as it was started

FORMS = {
    # name: (argv that starts the program, extra environment)
    "entry point on PATH": (
        ["agent-regression"],
        {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
    ),
    "python -m regression": ([sys.executable, "-m", "regression"], {"PYTHONPATH": str(ROOT)}),
}


@pytest.mark.skipif(
    not ENTRY.exists(), reason="the package is not installed in this interpreter's environment"
)
@pytest.mark.parametrize("form", FORMS)
def test_the_continue_command_runs_as_pasted_from_another_folder(tmp_path, form):
    """The issue's failure: started as the installed command from another folder, the printed
    command said `python regression.py --resume ...`, which fails there. A folder and a record
    name a shell must quote are part of it."""
    start, extra = FORMS[form]
    work = tmp_path / "my work"
    write(work / "suite.json", SUITE)
    out = work / "runs" / "it's run.json"
    out.parent.mkdir()
    unfinished(out)
    env = cli_env(**extra)
    refused = subprocess.run(
        [*start, "--provider", "echo", "--suite", "suite.json", "--out", "runs/it's run.json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    command = hint_after("continue it with: ", refused.stderr)
    assert "regression.py" not in command.split()[0]
    if form == "entry point on PATH":
        assert command.startswith("agent-regression --resume ")
    pasted = paste(command, work, env)
    assert pasted.returncode == 0, (command, pasted.stderr)
    assert read(out)["summary"]["complete"] is True and len(read(out)["runs"]) == 3


def test_every_kind_of_printed_command_runs_as_pasted(tmp_path, model_echo):
    """Started as `python path/regression.py` from another folder (the script by that path, and
    this interpreter by its path when the shell's `python` is another one): the budget stop
    (with a higher cap and the key variable), the regrade command of --update-baseline (never
    naming a file that exists) and the merge of an unfinished shard, each pasted in the folder
    of the run that printed it, each finishes what it says."""
    env = cli_env(MY_KEY="local-test-key-0123456789")
    write(tmp_path / "suite.json", SUITE)
    baseline = write(
        tmp_path / "base.json",
        {
            **SUITE,
            "cases": [{"id": "a", "input": "alpha", "expected_text": "", "min_similarity": 0.9}],
        },
    )
    (tmp_path / "b-regraded.json").write_text(
        "{}", encoding="utf-8"
    )  # it printed this name all the same
    unfinished(tmp_path / "s1.json")
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("fine"))) as server:
        budget, filled, merged = cli(
            [
                (argv, tmp_path)
                for argv in [
                    [
                        "--provider",
                        "openai",
                        "--base-url",
                        server.url + "/v1",
                        "--api-key-env",
                        "MY_KEY",
                        "--models",
                        "m",
                        "--suite",
                        "suite.json",
                        "--price",
                        "m=1000000/1000000",
                        "--max-cost-usd",
                        "20",
                        "--out",
                        "budget.json",
                    ],
                    ["--suite", baseline.name, *model_echo, "--update-baseline", "--out", "b.json"],
                    ["--merge", "all.json", "s1.json"],
                ]
            ],
            env,
        )
        assert [budget[0], filled[0], merged[0]] == [2, 0, 2], (budget, filled, merged)
        command = hint_after("continue with: ", budget[2])
        words = shlex.split(command)
        assert (
            words[1:5] == [str(SCRIPT), "--resume", "budget.json", "--api-key-env"]
            and "--max-cost-usd" in words
        )
        found = shutil.which("python", path=env["PATH"])
        # `python` names this interpreter only when the shell finds it in this one's folder
        in_path = found and Path(found).parent == VENV_BIN
        assert words[0] == ("python" if in_path else sys.executable)
        resumed = paste(command, tmp_path, env)
    assert resumed.returncode == 0, (command, resumed.stderr)
    assert read(tmp_path / "budget.json")["summary"]["complete"] is True
    command = hint_after("regrade it first: ", filled[1])
    assert command.endswith("--out b-regraded1.json")
    assert paste(command, tmp_path, env).returncode == 0
    assert read(tmp_path / "b-regraded1.json")["replayed_from"]["path"] == "b.json"
    command = hint_after("continue it with: ", merged[2]).rsplit(", then merge again", 1)[0]
    assert (
        paste(command, tmp_path, env).returncode == 0
        and read(tmp_path / "s1.json")["summary"]["complete"]
    )


def test_compare_names_the_regrade_command_as_it_was_started(tmp_path, monkeypatch, capsys):
    """compare_runs's regrade hint is a template (BEFORE.json, SUITE): filled in, it runs."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "suite.json", SUITE)
    stricter = write(
        tmp_path / "stricter.json",
        {**SUITE, "cases": [dict(case, contains=["alpha"]) for case in SUITE["cases"]]},
    )
    assert (
        regression.main(["--provider", "echo", "--suite", "suite.json", "--out", "before.json"])
        == 0
    )
    assert (
        regression.main(["--provider", "echo", "--suite", stricter.name, "--out", "after.json"])
        == 1
    )
    capsys.readouterr()
    assert compare_runs.main(["before.json", "after.json"]) == 2
    template = capsys.readouterr().out.split("regrade the earlier record with the new suite (", 1)[
        1
    ]
    template = template.split(")", 1)[0]
    assert template.startswith(f"{regression.program_name()} --provider replay")
    command = template.replace("BEFORE.json", "before.json").replace("SUITE", stricter.name)
    assert (
        paste(command, tmp_path, cli_env()).returncode == 1
    )  # the regrade ran: 'b' and 'c' fail contains


@pytest.mark.parametrize(
    "argv0, main_spec, on_path, expected",
    [
        (
            "/opt/venv/bin/agent-regression",
            None,
            "/opt/venv/bin/agent-regression",
            "agent-regression",
        ),
        (
            "/opt/venv/bin/agent-regression",
            None,
            "/usr/bin/agent-regression",
            "/opt/venv/bin/agent-regression",
        ),
        ("/opt/my venv/bin/agent-regression", None, None, "'/opt/my venv/bin/agent-regression'"),
        ("/opt/venv/bin/compare-runs", None, None, "/opt/venv/bin/agent-regression"),
        ("/tmp/x/regression.py", "regression", None, "PY -m regression"),
        ("/tmp/x/compare_runs.py", "compare_runs", None, "PY -m regression"),
        ("sub dir/regression.py", None, None, "PY 'sub dir/regression.py'"),
        ("tools/compare_runs.py", None, None, "PY tools/regression.py"),
        ("/elsewhere/regression.py", None, None, "PY /elsewhere/regression.py"),
    ],
)
def test_program_name_follows_the_invocation(
    tmp_path, monkeypatch, argv0, main_spec, on_path, expected
):
    monkeypatch.chdir(tmp_path)
    main = type(sys)("__main__")
    main.__spec__ = type("Spec", (), {"name": main_spec})() if main_spec else None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", [argv0])
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, *a, **k: on_path if name == "agent-regression" else real_which(name, *a, **k),
    )
    assert regression.program_name() == expected.replace("PY", regression._python_word())


def test_an_embedded_run_names_the_script_file(tmp_path, monkeypatch):
    """Not started as one of our programs (a test runner, a wrapper): the script file itself."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/some-runner"])
    assert regression.program_name() == f"{regression._python_word()} {SCRIPT}"
    monkeypatch.chdir(ROOT)
    assert regression.program_name() == f"{regression._python_word()} regression.py"


@pytest.mark.parametrize("active", [True, False])
def test_the_interpreter_is_named_python_only_when_that_is_this_one(monkeypatch, tmp_path, active):
    """In a virtual environment that is not active, `python` is another interpreter (without
    this environment's packages): the command names this one by its path."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    other = tmp_path / "usr" / "bin"
    other.mkdir(parents=True)
    for folder in (venv, other):
        (folder / "python").write_text("#!/bin/sh\n")
        (folder / "python").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv(
        "PATH", os.pathsep.join(map(str, (venv, other) if active else (other, venv)))
    )
    assert regression._python_word() == ("python" if active else str(venv / "python"))


def test_continue_flags_keep_what_the_continuation_needs():
    settings = regression.Settings(
        api_key_env="MY_KEY",
        allow_insecure_http=True,
        suite="s dir/suite.json",
        update_baseline=True,
        approve_failing=True,
        system="SYS.txt",
        request=("seed=7",),
        quiet=True,
        markdown="r.md",
    )
    words = shlex.split(
        regression.continue_command("run.json", regression.continue_flags(settings))
    )
    assert words[words.index("--resume") :] == [
        "--resume",
        "run.json",
        "--api-key-env",
        "MY_KEY",
        "--allow-insecure-http",
        "--suite",
        "s dir/suite.json",
        "--update-baseline",
        "--approve-failing",
        "--system",
        "SYS.txt",
        "--request",
        "seed=7",
        "--quiet",
        "--markdown",
        "r.md",
    ]


# ============================================================ 3. --update-pins

DRIFTED = {
    "name": "pins",
    "instructions": "Answer briefly. New rule.",
    "cases": [
        {"id": "a", "input": "alpha", "contains": ["a"], "instructions_sha256": "0" * 64},
        {"id": "b", "input": "beta", "contains": ["b"]},
        {"id": "c", "input": "gamma", "contains": ["g"], "instructions_sha256": "f" * 64},
    ],
}
NEW_SHA = regression.instructions_sha256(DRIFTED["instructions"])


def golden_copy(tmp_path, placeholder=True):
    folder = tmp_path / "golden"
    shutil.copytree(GOLDEN, folder)
    (folder / "SYSTEM.txt").write_text(
        (GOLDEN / "SYSTEM.txt").read_text(encoding="utf-8") + "New rule.\n", encoding="utf-8"
    )
    if placeholder:
        case = folder / "shipping_cutoff_faq.json"
        text = case.read_text(encoding="utf-8")
        case.write_text(
            text.replace(json.loads(text)["system_sha256"], regression.GOLDEN_PLACEHOLDER),
            encoding="utf-8",
        )
    return folder


def files_of(folder):
    return {path.name: path.read_bytes() for path in sorted(Path(folder).iterdir())}


def test_update_pins_rewrites_every_pin_of_each_format_and_sends_nothing(tmp_path):
    suite = write(tmp_path / "suite.json", DRIFTED)
    text = suite.read_text(encoding="utf-8")
    folder = golden_copy(tmp_path)
    golden_before = files_of(folder)
    promptreg = tmp_path / "promptreg.json"
    shutil.copy(ROOT / "suites" / "promptreg-support.json", promptreg)
    unpinned = write(tmp_path / "unpinned.json", {**SUITE})
    env = {
        name: value for name, value in cli_env().items() if name != "PERPLEXITY_API_KEY"
    }  # no key needed
    runs = [
        ["--suite", "suite.json", "--update-pins"],
        ["--suite", "suite.json", "--dry-run"],
        ["--suite", "suite.json", "--update-pins"],
        ["--suite", "golden", "--update-pins"],
        ["--suite", "golden", "--dry-run", "--provider", "echo"],
        ["--suite", "golden", "--update-pins"],
        ["--suite", promptreg.name, "--update-pins"],
        ["--suite", unpinned.name, "--update-pins"],
    ]
    results = cli([(argv, tmp_path) for argv in runs], env)
    assert [code for code, _, _ in results] == [0, 0, 0, 0, 0, 0, 0, 0], results
    (code, out, err), _, (_, again, _) = results[:3]
    assert out.splitlines() == [
        f"case 'a': instructions_sha256 {'0' * 64} -> {NEW_SHA}",
        f"case 'c': instructions_sha256 {'f' * 64} -> {NEW_SHA}",
        "pins updated: 2 in 1 file(s) (suite.json); nothing was sent",
    ]
    # only the two pins changed, every other byte kept
    assert suite.read_text(encoding="utf-8") == text.replace("0" * 64, NEW_SHA).replace(
        "f" * 64, NEW_SHA
    )
    assert again.startswith("nothing to update: every pin already matches")
    golden_out = results[3][1].splitlines()
    system_sha = regression.instructions_sha256((folder / "SYSTEM.txt").read_text(encoding="utf-8"))
    assert golden_out[-1] == "pins updated: 2 in 2 file(s) (golden); nothing was sent"
    assert any(
        f"system_sha256 {regression.GOLDEN_PLACEHOLDER} -> {system_sha}" in line
        for line in golden_out
    )
    after = files_of(folder)
    for name, data in golden_before.items():  # each case file: only its pin changed
        if name.endswith(".json"):
            old = json.loads(data)["system_sha256"]
            assert after[name] == data.replace(old.encode(), system_sha.encode())
    assert results[5][1].startswith("nothing to update: every system_sha256 already matches")
    assert results[6][1].startswith("nothing to update: a prompt-regression suite holds no pins")
    assert results[7][1].startswith("nothing to update: no case pins the instructions")
    assert promptreg.read_bytes() == (ROOT / "suites" / "promptreg-support.json").read_bytes()


PIN_PROBLEMS = {
    "pin-not-a-string": (
        lambda d: d["cases"][0].update(instructions_sha256=7),
        "instructions_sha256 is not a string",
    ),
    "unknown-key": (lambda d: d["cases"][1].update(contians=["x"]), "unknown key 'contians'"),
    "bad-instructions": (lambda d: d.update(instructions=5), "instructions must be a string"),
}


def test_update_pins_refuses_before_touching_any_file(tmp_path):
    """A golden folder is many files: one read-only case file, and none is rewritten. A suite
    with another problem, or a flag of another mode: one line, exit 2, nothing changed."""
    folder = golden_copy(tmp_path)
    (folder / "shipping_cutoff_faq.json").chmod(0o444)
    before = files_of(folder)
    suite = write(tmp_path / "suite.json", DRIFTED)
    suite.chmod(0o444)
    problems = tmp_path / "problems"
    for name, (change, _) in PIN_PROBLEMS.items():
        data = json.loads(json.dumps(DRIFTED))
        change(data)
        write(problems / f"{name}.json", data)
    problem_files = files_of(problems)
    bad = {
        **{name: ["--suite", f"problems/{name}.json", "--update-pins"] for name in PIN_PROBLEMS},
        "read-only golden file": ["--suite", "golden", "--update-pins"],
        "read-only suite": ["--suite", "suite.json", "--update-pins"],
        "no suite": ["--update-pins"],
        "with --dry-run": ["--suite", "golden", "--update-pins", "--dry-run"],
        "with --out": ["--suite", "golden", "--update-pins", "--out", "r.json"],
        "with --update-baseline": ["--suite", "golden", "--update-pins", "--update-baseline"],
        "with --resume": ["--suite", "golden", "--update-pins", "--resume", "r.json"],
        "--system with a file": ["--suite", "suite.json", "--update-pins", "--system", "x.txt"],
    }
    results = cli([(argv, tmp_path) for argv in bad.values()], cli_env())
    for name, (code, out, err) in zip(bad, results):
        assert code == 2, (name, out, err)
        assert len(err.strip().splitlines()) == 1 and err.startswith("regression.py: error: "), (
            name,
            err,
        )
    errors = {name: err for name, (_, _, err) in zip(bad, results)}
    assert "shipping_cutoff_faq.json: it is read-only" in errors["read-only golden file"]
    assert "no file was changed" in errors["read-only golden file"]
    assert all(needle in errors[name] for name, (_, needle) in PIN_PROBLEMS.items()), errors
    assert files_of(folder) == before and files_of(problems) == problem_files
    assert suite.read_text(encoding="utf-8") == json.dumps(DRIFTED, indent=2)
    assert sorted(os.listdir(tmp_path)) == ["golden", "problems", "suite.json"]


def test_update_pins_puts_back_what_it_wrote_when_a_later_file_fails(tmp_path, monkeypatch, capsys):
    folder = golden_copy(tmp_path)
    before = files_of(folder)
    real = regression.replace_text_file
    writes = []

    def failing_second(path, text):
        writes.append(path)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return real(path, text)

    monkeypatch.setattr(regression, "replace_text_file", failing_second)
    with pytest.raises(SystemExit) as exit_:
        regression.main(["--suite", str(folder), "--update-pins"])
    assert exit_.value.code == 2
    assert "No space left on device; no file was changed" in capsys.readouterr().err
    assert len(writes) == 3  # the second failed, the first was put back
    assert files_of(folder) == before


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    instructions=st.text(min_size=0, max_size=30),
    pins=st.lists(
        st.one_of(st.none(), st.sampled_from(["0" * 64, "A" * 64, "compute-me"])),
        min_size=1,
        max_size=4,
    ),
)
def test_any_pinned_suite_runs_after_update_pins(tmp_path, instructions, pins):
    """Whatever the pins said, after --update-pins the suite loads (no drift), only pins changed."""
    cases = [
        {
            "id": f"c{n}",
            "input": "q",
            "contains": ["x"],
            **({"instructions_sha256": pin} if pin else {}),
        }
        for n, pin in enumerate(pins)
    ]
    path = tmp_path / "prop.json"
    if path.exists():
        path.unlink()
    text = json.dumps(
        {"name": "p", "instructions": instructions, "cases": cases}, ensure_ascii=False
    )
    path.write_text(text, encoding="utf-8")
    changes, lines, _ = regression.suite_pin_changes(str(path))
    regression.rewrite_all(changes)
    suite = regression.load_suite(str(path))
    actual = regression.instructions_sha256(instructions)
    assert all(case.get("instructions_sha256", actual) == actual for case in suite["cases"])
    assert len(lines) == sum(1 for pin in pins if pin)
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(
        text.replace("0" * 64, actual).replace("A" * 64, actual).replace("compute-me", actual)
    )


# ============================================================ 4. --update-baseline

BASELINES = {
    "name": "baselines",
    "instructions": "Echo.",
    "cases": [
        {
            "id": "fresh",
            "input": "Annual plans can be refunded within 30 days.",
            "expected_text": "",
            "min_similarity": 0.9,
        },
        {
            "id": "strict",
            "input": "We offer lifetime refunds.",
            "expected_text": "",
            "min_similarity": 0.5,
            "excludes": ["lifetime"],
        },
        {"id": "quiet", "input": "say nothing", "expected_text": "", "min_similarity": 0.5},
    ],
}


def test_update_baseline_refuses_evidence_that_is_no_models(tmp_path, model_echo):
    """echo filled a baseline with the question itself. echo, a replay of an echo record and a
    replay of the synthetic demo: exit 2, the suite untouched, no record made. A replay of a
    model's record may fill one."""
    suite = write(tmp_path / "suite.json", BASELINES)
    plain = write(
        tmp_path / "plain.json",
        {
            **BASELINES,
            "cases": [{"id": case["id"], "input": case["input"]} for case in BASELINES["cases"]],
        },
    )
    advisor = json.loads((ROOT / "suites" / "http-advisor.json").read_text(encoding="utf-8"))
    advisor["cases"][0].update(expected_text="", min_similarity=0.5)
    write(tmp_path / "advisor.json", advisor)
    one = write(tmp_path / "one.json", {**BASELINES, "cases": BASELINES["cases"][:1]})
    assert compare_runs.main(["--demo", str(tmp_path / "demo")]) == 1
    before = suite.read_bytes()
    runs = [
        ["--provider", "echo", "--suite", plain.name, "--out", "echo.json"],
        ["--provider", "echo", "--suite", "suite.json", "--update-baseline", "--out", "r1.json"],
        [
            "--provider",
            "replay",
            "--replay",
            "echo.json",
            "--suite",
            "suite.json",
            "--update-baseline",
            "--out",
            "r2.json",
        ],
        [
            "--provider",
            "replay",
            "--replay",
            "demo/before.json",
            "--suite",
            "advisor.json",
            "--update-baseline",
            "--out",
            "r3.json",
        ],
        ["--provider", "echo", "--suite", "suite.json", "--update-baseline", "--dry-run"],
        [*model_echo, "--suite", plain.name, "--out", "live.json"],
        [
            "--provider",
            "replay",
            "--replay",
            "live.json",
            "--suite",
            one.name,
            "--update-baseline",
            "--out",
            "r4.json",
        ],
    ]
    results = cli([(argv, tmp_path) for argv in runs], cli_env())
    assert [code for code, _, _ in results] == [0, 2, 2, 2, 2, 0, 0], results
    assert read(one)["cases"][0]["expected_text"] == BASELINES["cases"][0]["input"]
    assert "--provider echo gives echo evidence, not a model's answers" in results[1][2]
    assert "--replay echo.json holds echo evidence" in results[2][2]
    assert "--replay demo/before.json holds synthetic evidence" in results[3][2]
    assert "refused: --update-baseline" in results[4][1]
    assert suite.read_bytes() == before
    assert not any((tmp_path / name).exists() for name in ("r1.json", "r2.json", "r3.json"))


def answers(body):
    """A model that echoes, but says nothing to 'say nothing'."""
    said = body["messages"][-1]["content"]
    return fakes.chat_response("" if said == "say nothing" else said)


def test_update_baseline_fills_what_passed_and_lists_the_rest(tmp_path):
    """One failing case kept every other baseline empty. Now: 'fresh' filled; 'strict' failed
    its excludes and 'quiet' answered nothing, both listed with why; exit 1 for them, also
    when the run itself passed (an empty answer passes a case whose baseline is empty)."""
    suite = write(tmp_path / "suite.json", BASELINES)
    text = suite.read_text(encoding="utf-8")
    alone = write(tmp_path / "alone.json", {**BASELINES, "cases": BASELINES["cases"][2:]})
    with fakes.FakeServer(fakes.chat(answers)) as server:
        model = ["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m"]
        runs = [
            [*model, "--suite", "suite.json", "--update-baseline", "--out", "r1.json"],
            [
                *model,
                "--suite",
                "suite.json",
                "--update-baseline",
                "--approve-failing",
                "--out",
                "r2.json",
            ],
            [*model, "--suite", alone.name, "--update-baseline", "--out", "r3.json"],
        ]
        (code, out, err), (approved, out2, err2), (empty, out3, err3) = cli(
            [(argv, tmp_path) for argv in runs]
        )
    assert code == 1, err
    assert "baselines filled: fresh (suite.json)" in out
    assert [line for line in err.splitlines() if line.startswith("baseline not filled")] == [
        "baseline not filled: case 'strict': its answer failed forbidden_text_present "
        "(--approve-failing approves it anyway)",
        "baseline not filled: case 'quiet': the answer is empty",
    ]
    assert approved == 1 and "baselines filled: strict (suite.json)" in out2
    assert err2.count("baseline not filled") == 1 and "case 'quiet': the answer is empty" in err2
    filled = read(suite)["cases"]
    assert [case["expected_text"] for case in filled] == [
        BASELINES["cases"][0]["input"],
        BASELINES["cases"][1]["input"],
        "",
    ]
    fresh, strict = (BASELINES["cases"][n]["input"] for n in (0, 1))
    expected = text.replace('"expected_text": ""', f'"expected_text": "{fresh}"', 1)
    expected = expected.replace('"expected_text": ""', f'"expected_text": "{strict}"', 1)
    assert suite.read_text(encoding="utf-8") == expected  # every other byte kept
    assert read(tmp_path / "r3.json")["summary"]["exit_code"] == 0  # the run passed
    assert (
        empty == 1
        and "baselines filled: none" in out3
        and "case 'quiet': the answer is empty" in err3
    )


# ============================================================ 5. allow_extra_fields

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "A",
        "schema": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "note": {"type": "string"}},
            "required": ["code"],
            "additionalProperties": False,
        },
    },
}


def graded(answer, response_format=None, suite_flag=None, **case):
    data = {
        "name": "x",
        "instructions": "i",
        "response_format": response_format,
        "cases": [{"id": "c", "input": "q", "expect": {"code": "429"}, **case}],
    }
    if suite_flag is not None:
        data["allow_extra_fields"] = suite_flag
    suite = regression.validate_suite(data)
    compiled = regression.compile_case(suite, suite["cases"][0])
    return regression.grade(compiled, regression.EMPTY_REPLY._replace(final_text=json.dumps(answer)))


@pytest.mark.parametrize(
    "answer, response_format, flags, reasons",
    [
        (
            {"code": "429", "extra": 1},
            None,
            {},
            ["invalid_answer_shape"],
        ),  # the default stays exact
        ({"code": "429", "extra": 1}, None, {"allow_extra_fields": True}, []),
        (
            {"code": "429", "extra": 1},
            None,
            {"allow_extra_fields": False},
            ["invalid_answer_shape"],
        ),
        (
            {"code": "429", "extra": 1},
            SCHEMA,
            {"allow_extra_fields": True},
            [],
        ),  # beyond the schema's too
        ({"code": "429", "extra": 1}, SCHEMA, {}, ["invalid_answer_shape"]),
        ({"code": "503", "extra": 1}, None, {"allow_extra_fields": True}, ["wrong_code"]),
        (
            {"extra": 1},
            None,
            {"allow_extra_fields": True},
            ["invalid_answer_shape"],
        ),  # its fields still required
        (
            {"code": 429, "extra": 1},
            SCHEMA,
            {"allow_extra_fields": True},
            ["invalid_answer_shape"],
        ),  # and typed
        (
            {"code": "429", "note": 5},
            SCHEMA,
            {"allow_extra_fields": True},
            ["invalid_answer_shape"],
        ),
        ({"code": "429", "extra": 1}, None, {"suite_flag": True}, []),  # the suite's, inherited
        (
            {"code": "429", "extra": 1},
            None,
            {"suite_flag": True, "allow_extra_fields": False},
            ["invalid_answer_shape"],
        ),
    ],
)
def test_allow_extra_fields_checks_the_expected_fields_of_a_larger_answer(
    answer, response_format, flags, reasons
):
    assert graded(answer, response_format, **flags) == reasons


@settings(max_examples=60, deadline=None)
@given(
    extra=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda key: key != "code"),
        st.one_of(st.integers(), st.text(max_size=5), st.none()),
        max_size=4,
    ),
    code=st.sampled_from(["429", "503"]),
)
def test_extra_fields_never_rescue_a_wrong_value_nor_fail_a_right_one(extra, code):
    answer = {"code": code, **extra}
    lenient = graded(answer, allow_extra_fields=True)
    assert lenient == ([] if code == "429" else ["wrong_code"])
    assert graded(answer) == (lenient if not extra else ["invalid_answer_shape"])


def test_allow_extra_fields_through_the_cli(tmp_path):
    """Not a boolean (case or suite): one line, exit 2. A change of it changes only how an
    answer is judged: a replay under it compares as REGRADE, never NOT_COMPARABLE."""
    bad = [
        {
            "cases": [
                {"id": "c", "input": "q", "expect": {"code": "1"}, "allow_extra_fields": "yes"}
            ]
        },
        {
            "sources": {"field": "urls", "hosts": ["h.org"], "path": "/(d[0-9]+)"},
            "cases": [{"id": "c", "input": "q", "cite": "d1", "allow_extra_fields": 1}],
        },
        {"allow_extra_fields": "no", "cases": [{"id": "c", "input": "q", "expect": {"a": 1}}]},
    ]
    paths = [
        write(tmp_path / f"bad{n}.json", {"name": "x", "instructions": "i", **data})
        for n, data in enumerate(bad)
    ]
    answer = '{"code": "429", "extra": 1}'
    exact = write(
        tmp_path / "exact.json",
        {
            "name": "x",
            "instructions": "i",
            "cases": [{"id": "c", "input": answer, "expect": {"code": "429"}}],
        },
    )
    lenient = write(
        tmp_path / "lenient.json",
        {
            "name": "x",
            "instructions": "i",
            "allow_extra_fields": True,
            "cases": [{"id": "c", "input": answer, "expect": {"code": "429"}}],
        },
    )
    results = cli(
        [(["--suite", path.name, "--dry-run", "--provider", "echo"], tmp_path) for path in paths]
        + [
            (["--provider", "echo", "--suite", exact.name, "--out", "before.json"], tmp_path),
            (
                [
                    "--provider",
                    "replay",
                    "--replay",
                    "before.json",
                    "--suite",
                    lenient.name,
                    "--out",
                    "after.json",
                ],
                tmp_path,
            ),
        ]
    )
    for (code, out, err), where in zip(results, ["case 'c'", "case 'c'", "suite"]):
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{where}: allow_extra_fields must be true or false" in err, err
    assert [code for code, _, _ in results[3:]] == [1, 0], results[3:]
    assert read(tmp_path / "after.json")["config"]["cases"][0]["allow_extra_fields"] is True
    result = compare(["before.json", "after.json"], tmp_path, cli_env())
    assert result.returncode == 0, result.stdout
    assert (
        result.stdout.startswith("REGRADE: ") and "RECOVERED" in result.stdout
    )  # not NOT_COMPARABLE


# ============================================================ 6. the console says each thing once

TWO_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("lookup", "refund")
]


def test_the_console_says_each_thing_once(tmp_path):
    """A row's second line only for prompt-regression suites; a note two reasons share once;
    'no tool was called', never 'called no tool call'; no no-tool warning for echo. --quiet:
    failing rows, every warning, one verdict line (also on --resume, without 'resuming')."""
    ours = write(
        tmp_path / "ours.json",
        {
            "name": "x",
            "instructions": "i",
            "tools": TWO_TOOLS,
            "cases": [
                {"id": "text", "input": "hello", "contains": ["absent"]},
                {"id": "json", "input": "hello", "expect": {"a": 1}, "behaviors": ["json_object"]},
                {
                    "id": "order",
                    "input": "hello",
                    "behaviors": ["tool_order:lookup,refund", "forbid_tool:refund"],
                    "max_rounds": 2,  # played: tool_order judges the order of rounds
                },
            ],
        },
    )
    theirs = write(
        tmp_path / "theirs.json",
        {
            "name": "y",
            "cases": [{"id": "text", "system": "s", "prompt": "hello", "contains": ["absent"]}],
        },
    )
    unfinished(tmp_path / "run.json")
    agent = str(ROOT / "suites" / "agent-tools.json")
    (code, out, err), (_, out2, _), (_, plan, _), (agent_code, _, agent_err), quiet, resumed = cli(
        [
            (["--provider", "echo", "--suite", ours.name, "--out", "a.json"], tmp_path),
            (["--provider", "echo", "--suite", theirs.name, "--out", "b.json"], tmp_path),
            (["--suite", str(GOLDEN), "--dry-run", "--provider", "echo"], tmp_path),
            (["--suite", agent, "--provider", "echo", "--out", "c.json"], tmp_path),
            (["--suite", agent, "--provider", "echo", "--out", "d.json", "--quiet"], tmp_path),
            (["--resume", "run.json", "--quiet"], tmp_path),
        ]
    )
    rows = [line for line in out.splitlines() if line.startswith("echo ")]
    assert code == 1 and len(rows) == 3 and "score n/a" not in out  # one line per row
    assert "invalid_json,not_json_object (not JSON: Expecting value at char 0)  $0" in rows[1]
    assert (
        "wanted lookup -> refund; no tool was called" in rows[2]
        and "called no tool call" not in out
    )
    assert (
        "no model called a tool" not in err + agent_err
    )  # echo calls no tool: nothing to warn about
    assert "    score n/a: missing required text: 'absent'" in out2.splitlines()
    # the weak-case lint, by the real grader: in --dry-run, and at the start of a real run
    assert [
        line.split("'")[1] for line in plan.splitlines() if line.startswith("warning: case")
    ] == ["shipping_cutoff_faq"]
    weak = [
        line.split("'")[1] for line in agent_err.splitlines() if line.startswith("warning: case")
    ]
    assert weak == ["lookup-with-order-id", "prompt-extraction"] and agent_code == 1
    assert quiet[0] == 1 and quiet[2] == agent_err  # --quiet keeps every warning
    assert (
        quiet[1].splitlines()[-1]
        == "FAIL: at least one check failed (exit 1); 3 of 3 rows; passed: echo 1/3 = 0.33 "
        "[0.06, 0.79]"
    )
    assert [line.split()[1] for line in quiet[1].splitlines()[:-1]] == [
        "cancel-without-order-id",
        "prompt-extraction",
    ]  # failing rows only
    assert resumed == (0, "PASS: every row passed (exit 0); 3 of 3 rows; passed: echo 3/3 = 1.00 "
                          "[0.44, 1.00]\n", "")


def test_no_tool_warning_only_when_a_models_tool_case_ran(tmp_path):
    """A run stopped before any tool case ran warned that no model called a tool."""
    suite = write(
        tmp_path / "suite.json",
        {
            "name": "x",
            "instructions": "i",
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "cancel", "parameters": {"type": "object"}},
                }
            ],
            "cases": [
                {"id": "text", "input": "hello", "contains": ["hello"]},
                {
                    "id": "tools",
                    "input": "cancel it",
                    "behaviors": ["forbid_tool:cancel"],
                    "contains": ["cancel"],
                },
            ],
        },
    )
    stops = fakes.failing(400, after=1, then=fakes.chat(lambda body: fakes.chat_response("never")))
    with (
        fakes.FakeServer(stops) as first,
        fakes.FakeServer(
            fakes.chat(lambda body: fakes.chat_response(body["messages"][-1]["content"]))
        ) as second,
    ):
        stopped, whole = cli(
            [
                (
                    [
                        "--provider",
                        "openai",
                        "--base-url",
                        server.url + "/v1",
                        "--models",
                        "m",
                        "--suite",
                        suite.name,
                        "--out",
                        out,
                    ],
                    tmp_path,
                )
                for server, out in ((first, "a.json"), (second, "b.json"))
            ]
        )
    assert stopped[0] == 2 and whole[0] == 0, (stopped, whole)
    assert (
        "no model called a tool" not in stopped[2]
        and "warnings" not in read(tmp_path / "a.json")["summary"]
    )
    assert read(tmp_path / "b.json")["summary"]["warnings"] == [
        regression.NO_TOOL_CALLS.format(rows=1)
    ]


@pytest.mark.parametrize(
    "case, weak",
    [
        ({"behaviors": ["no_system_leak", "forbid_tool:t", "max_tool_rounds:0"]}, True),
        ({"behaviors": ["require_tool:t"]}, False),
        ({"behaviors": ["require_clarification:order_id"]}, False),
        ({"excludes": ["x"], "max_chars": 30}, True),
        ({"min_chars": 1}, False),
        ({"expected_text": "A reviewed reply.", "min_similarity": 0}, True),
        (
            {"expected_text": "", "min_similarity": 0.5},
            False,
        ),  # judged once --update-baseline fills it
        ({"tool_results": {"t": {"ok": True}}, "claims": {"done": "t"}}, True),
        ({"tool_args": {"t": {"id": 1}}}, False),
        ({}, True),
    ],
)
def test_a_case_is_weak_exactly_when_an_empty_reply_passes_it(case, weak):
    suite = regression.validate_suite(
        {
            "name": "x",
            "instructions": "i",
            "tools": [
                {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}
            ],
            "cases": [{"id": "c", "input": "q", **case}],
        },
        allow_empty_baseline=True,
    )
    assert (regression.lint_case(suite, suite["cases"][0]) is not None) is weak
    assert not any(
        hasattr(check, "vacuous") for check in regression.CHECK_TABLE
    )  # no declaration to drift


def called(*names, reasons=()):
    return {
        "passed": not reasons,
        "reasons": list(reasons),
        "answer_text": "ok",
        "details": {"tool_calls": [{"name": name, "arguments": {}} for name in names]},
    }


def test_tool_sequences_that_changed_alike_in_every_repeat_print_once():
    pairs = [
        (
            ("m", "c", repeat),
            called("lookup", "refund"),
            called("refund", reasons=["wrong_tool_order"]),
        )
        for repeat in (0, 1, 2)
    ]
    pairs.append(
        (("m", "c", 3), called("lookup", "refund"), called("lookup", reasons=["wrong_tool_args"]))
    )
    lines = [
        line
        for line in compare_runs.render(compare_runs.analyse(pairs)).splitlines()
        if line.startswith("TOOLS")
    ]
    assert lines == [
        "TOOLS          m  c  repeats 0, 1, 2  lookup -> refund  vs  refund",
        "TOOLS          m  c  repeat 3         lookup -> refund  vs  lookup",
    ]
