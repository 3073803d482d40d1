"""The test zygote (fakes.run_script, fakes.cli_table, testkit.run_forked) reports a run exactly
as a cold start of `python -W error SCRIPT` would: its exit code, stdout and stderr, byte for
byte, for a run that raises, exits 1 or 2, writes to stderr or leaves a warning; and nothing one
forked run changes reaches the next. Each probe is a tiny script run both ways (a cold start of
one costs some 30 ms: it imports no SDK)."""

import os
import re
import subprocess
import sys

import pytest

import fakes
from testkit import cli_env

FLAGS = ("-W", "error")

# name -> the probe script's body: every way a run can end that a test must see
ENDINGS = {
    "raises": "def f():\n    raise ValueError('boom')\nprint('before')\nf()\n",
    "raises-chained": "try:\n    {}['k']\nexcept KeyError:\n    raise RuntimeError('during')\n",
    "exit-1": "import sys\nprint('out')\nsys.exit(1)\n",
    "exit-2-message": "import sys\nsys.exit('regression.py: error: bad input')\n",
    "exit-2": "import sys\nsys.stderr.write('one line\\n')\nsys.exit(2)\n",
    "stderr-exit-0": "import sys\nprint('fine')\nsys.stderr.write('but this\\n')\n",
    "warning": "import warnings\nwarnings.warn('deprecated', DeprecationWarning)\n",
    "warning-in-sdk-module": ("import warnings, httpx\n"
                              "warnings.warn_explicit('w', UserWarning, httpx.__file__, 1)\n"),
    "resource-warning-at-exit": ("import gc\ndef leak():\n    open(__file__)\n"
                                 "leak()\ngc.collect()\nprint('after')\n"),
    "unflushed-output": "import sys\nsys.stdout.write('no newline')\n",
    "keyboard-interrupt": "raise KeyboardInterrupt\n",
    "os-exit": "import os, sys\nprint('lost in the buffer')\nos._exit(3)\n",
    "atexit-raises": ("import atexit\ndef bye():\n    raise OSError('at exit')\n"
                      "atexit.register(bye)\n"),
}


def cold(script, cwd, env, flags=FLAGS):
    """`python FLAGS SCRIPT` started from nothing, as testkit.run_cli starts one."""
    done = subprocess.run([sys.executable, *flags, str(script)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def forked(script, cwd, env, flags=FLAGS):
    """The same run forked from the zygote."""
    done = fakes.run_script([], cwd, env, script=str(script), flags=flags)
    return done.returncode, done.stdout, done.stderr


def same(result):
    """A result with its object addresses blanked (two cold runs differ in them too)."""
    code, out, err = result
    return code, out, re.sub(r"0x[0-9a-f]+", "0x?", err)


def probe(folder, name, body):
    path = folder / f"{name}.py"
    path.write_text(body, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_a_forked_run_ends_exactly_as_a_cold_one(tmp_path, name):
    """Exit code, stdout and stderr (tracebacks, warnings, "Exception ignored") are identical."""
    script = probe(tmp_path, name, ENDINGS[name])
    expected = cold(script, tmp_path, cli_env())
    assert same(forked(script, tmp_path, cli_env())) == same(expected)
    table = fakes.cli_table([([], tmp_path)], cli_env(), script=str(script), flags=FLAGS)
    assert same(table[0]) == same(expected)  # a table's run too


STATE = """
import json, os, sys, time, warnings
seen = {"leak": getattr(json, "LEAK", None), "env": os.environ.get("LEAKED"), "cwd": os.getcwd(),
        "umask": oct(os.umask(0o022)), "tz": time.tzname, "path": sys.path[0],
        "filters": len(warnings.filters), "modules": "xml.dom.minidom" in sys.modules,
        "argv": sys.argv, "orig_argv": sys.orig_argv,
        "main": sorted(name for name in dir(sys.modules["__main__"]) if not name.startswith("__"))}
print(json.dumps(seen, sort_keys=True))
import xml.dom.minidom
json.LEAK = os.environ["LEAKED"] = "yes"
os.chdir("/")
os.umask(0)
warnings.simplefilter("ignore")
sys.path.insert(0, "/nowhere")
LEFT_IN_MAIN = 1
"""


def test_no_state_of_one_forked_run_reaches_the_next(tmp_path):
    """A module attribute, an env var, cwd, umask, sys.path, a warning filter, an import or a
    global that a run leaves behind is gone in the next run: each starts as a cold run does."""
    script = probe(tmp_path, "state", STATE)
    expected = cold(script, tmp_path, cli_env())
    runs = [forked(script, tmp_path, cli_env()) for _ in range(3)]
    assert runs == [expected] * 3, (runs, expected)


def test_the_run_has_the_callers_umask_and_tz_as_a_child_would(tmp_path):
    """The umask in force at the call (not when the zygote started) and the env's TZ."""
    script = probe(tmp_path, "state", STATE)
    env = cli_env(TZ="EST5EDT")
    old = os.umask(0o027)
    try:
        expected = cold(script, tmp_path, env)
        got = forked(script, tmp_path, env)
    finally:
        os.umask(old)
    assert '"umask": "0o27"' in expected[1] and '"EST"' in expected[1]
    assert got == expected


def test_start_up_variables_start_their_own_zygote(tmp_path):
    """PYTHONWARNINGS (and every variable Python reads only as it starts) holds in a forked run
    as in a cold one: a warning it makes an error fails the run, unflagged."""
    script = probe(tmp_path, "warning", "import warnings\nwarnings.warn('w', UserWarning)\n")
    env = cli_env(PYTHONWARNINGS="error::UserWarning")
    expected = cold(script, tmp_path, env, flags=())
    assert expected[0] == 1 and expected[2].rstrip().endswith("UserWarning: w")
    assert forked(script, tmp_path, env, flags=()) == expected
    assert forked(script, tmp_path, cli_env(), flags=()) == cold(script, tmp_path, cli_env(), ())


def test_a_zygote_whose_start_writes_to_stderr_is_an_error(tmp_path):
    """What the zygote's own imports print (a warning a cold run would show) is never hidden."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import sys\nsys.stderr.write('a start-up warning\\n')\n", encoding="utf-8")
    script = probe(tmp_path, "quiet", "print('hi')\n")
    env = cli_env(PYTHONPATH=str(tmp_path / "site"))
    assert cold(script, tmp_path, env)[2] == "a start-up warning\n"
    with pytest.raises(RuntimeError, match="a start-up warning"):
        forked(script, tmp_path, env)


GUARDRAILS = os.path.join(os.path.dirname(os.path.abspath(fakes.__file__)), "suites",
                          "support-guardrails.json")
# (script, argv) in order, in one folder: a failing run, the refused overwrite of its record, a
# dry run, two kinds of bad input, and a record compared with itself (refused)
REAL_RUNS = [
    ("regression.py", ["--provider", "echo", "--suite", GUARDRAILS, "--out", "r.json"]),
    ("regression.py", ["--provider", "echo", "--suite", GUARDRAILS, "--out", "r.json"]),
    ("regression.py", ["--provider", "echo", "--dry-run"]),
    ("regression.py", ["--provider", "nope"]),
    ("regression.py", ["--provider", "echo", "--suite", "missing.json"]),
    ("compare_runs.py", ["r.json", "r.json"]),
]


def test_the_real_cli_forked_ends_as_it_does_cold(tmp_path):
    """regression.py and compare_runs.py through the zygote: the same exit codes (1, 2, 0),
    stdout and stderr as cold starts, in the same folder state (durations aside)."""
    root = os.path.dirname(os.path.abspath(fakes.__file__))

    def runs(start):
        folder = tmp_path / start.__name__
        folder.mkdir()
        results = []
        for script, argv in REAL_RUNS:
            code, out, err = start(os.path.join(root, script), argv, folder)
            results.append((code, *(re.sub(r"\d+\.\d+s", "?s", text).replace(str(folder), "F")
                                    for text in (out, err))))
        return results

    def forked_run(script, argv, folder):
        done = fakes.run_script(argv, folder, cli_env(), script=script, flags=FLAGS)
        return done.returncode, done.stdout, done.stderr

    expected = runs(cold_argv)
    assert [code for code, _, _ in expected] == [1, 2, 0, 2, 2, 2]
    assert all(out + err for code, out, err in expected if code == 2)  # each refusal says why
    assert runs(forked_run) == expected


def cold_argv(script, argv, folder):
    """`python -W error SCRIPT ARGV` started from nothing in `folder`."""
    done = subprocess.run([sys.executable, *FLAGS, script, *argv], cwd=folder, env=cli_env(),
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr
