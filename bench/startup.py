"""Start-up benchmark (SPEC C1): wall time and peak RSS of short commands vs `python -c pass`.

Measures, in one run and the same way for each command:
    floor                           python -c pass
    import regression               python -c "import regression"
    compare_runs --demo             python compare_runs.py --demo NEW_TMP_DIR
    regression.py --dry-run         the script form: compiled on every start
    python -m regression --dry-run  the cached forms: load the bytecode cache
    agent-regression --dry-run      (the installed console script beside --python)
    tutorial runner --dry-run       bench/tutorial_runner.py: the plain SDK script a team
                                    writes from the Perplexity tutorial, up to its first request

For each command: the median wall time of --runs runs (spawn to reap, interleaved
round-robin with the floor so machine noise hits every command alike), the ratio of
that median to the floor's, the peak RSS (GNU /usr/bin/time %M, which measures each
child alone), and whether the `perplexity` SDK was imported (one run under
`-X importtime`). Goals: the cached forms (and the import and the demo) under 0.15 s
and 25 MB peak with the SDK not imported; the script form no slower and no larger than
the tutorial runner measured in the same run (a ratio of at most 1.00).

Why /usr/bin/time and not os.wait4: Python spawns children with vfork + exec, and
Linux folds the spawning process's peak RSS into the child's ru_maxrss at exec, so
wait4's figure is max(this process, child). It is used only as a fallback and then
labelled an upper bound.

Children run with PYTHONDONTWRITEBYTECODE unset and after one untimed warm-up run, so
they load cached bytecode as a user's second run would. They get no API key and a base
URL pointing at a closed loopback port, so nothing can leave the machine.

Usage (from the repository root):
    .venv/bin/python bench/startup.py [--runs 15] [--rss-runs 3] [--no-dry-run]

Exit status: 0 whenever figures were produced (PASS/FAIL lines are a report, not a
gate); 3 when a command could not be measured (it failed or timed out); 2 for usage errors.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]  # the project's modules, then common.py beside this script

import common  # noqa: E402  (needs BENCH on sys.path)

GOAL_SECONDS = 0.15  # SPEC C1
GOAL_MB = 25.0  # SPEC C1
HEAVY_MODULES = ("perplexity", "httpx", "pydantic", "anyio")  # the SDK and its dependencies
TIME_BIN = "/usr/bin/time"
CHILD_TIMEOUT = 60.0  # seconds; one start-up never legitimately takes this long


class MeasureError(Exception):
    """A command could not be measured (failed, timed out): the harness reports and stops."""


# ====================================================================== commands
# Each command: (label, argv builder, accepted exit statuses). The builder takes a
# fresh scratch path so commands that need a new directory (the demo) get one per run.

TUTORIAL = "tutorial runner --dry-run"
SCRIPT = "regression.py --dry-run"
CACHED = ("python -m regression --dry-run", "agent-regression --dry-run")


def console_script(python):
    """The installed `agent-regression` command beside `python` (a venv's bin/), or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(python)), "agent-regression")
    return path if os.access(path, os.X_OK) else None


def build_commands(python, include_dry_run):
    """[(label, argv builder, accepted exit statuses, extra environment)], the floor first."""
    commands = [
        ("floor: python -c pass", lambda scratch: [python, "-c", "pass"], {0}, {}),
        ('python -c "import regression"',
         lambda scratch: [python, "-c", "import regression"], {0}, {}),
        # The demo exits 1 by design (its 'after' run has a NEW_FAILURE); 2 means it broke.
        ("compare_runs.py --demo NEW_DIR",
         lambda scratch: [python, os.path.join(ROOT, "compare_runs.py"), "--demo", scratch],
         {0, 1}, {}),
    ]
    if not include_dry_run:
        return commands
    script = console_script(python)
    if script is None:
        raise MeasureError(f"no agent-regression beside {python}: install the project into that "
                           "environment (pip install -e .), or pass --no-dry-run")
    # The script form compiles the whole file on every start; the module form and the
    # console script (which imports `regression`) load cached bytecode.
    commands += [
        (SCRIPT, lambda scratch: [python, os.path.join(ROOT, "regression.py"), "--dry-run"],
         {0}, {}),
        (CACHED[0], lambda scratch: [python, "-m", "regression", "--dry-run"], {0}, {}),
        (CACHED[1], lambda scratch: [script, "--dry-run"], {0}, {}),
        # The yardstick of the script form: it builds its client before it sends, so it gets
        # a key (the base URL stays the closed discard port: nothing is sent).
        (TUTORIAL, lambda scratch: [python, os.path.join(BENCH, "tutorial_runner.py"), "--dry-run"],
         {0}, {"PERPLEXITY_API_KEY": common.TEST_KEY}),
    ]
    return commands


# ====================================================================== measuring

class Scratch:
    """Hands out new, not-yet-existing paths under one temporary folder."""

    def __init__(self, base):
        self.base, self.n = base, 0

    def new(self):
        self.n += 1
        return os.path.join(self.base, f"run-{self.n}")


def run_timed(argv, env, accepted):
    """Wall seconds (spawn to reap) and the wait4 ru_maxrss in MB of one run."""
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=errors, env=env, cwd=ROOT)
        watchdog = threading.Timer(CHILD_TIMEOUT, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        stderr = errors.read().decode("utf-8", "replace")
    if proc.returncode not in accepted:
        raise MeasureError(f"{' '.join(argv)}: exit status {proc.returncode}: {stderr.strip()[-300:]}")
    return elapsed, usage.ru_maxrss / 1024


def gnu_time_works():
    """Whether GNU time (with -f and -o) is there to measure a child's peak RSS alone."""
    if not os.access(TIME_BIN, os.X_OK):
        return False
    with tempfile.NamedTemporaryFile("r") as out:
        try:
            subprocess.run([TIME_BIN, "-f", "%M", "-o", out.name, "true"], check=True, timeout=10,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return False
        lines = out.read().strip().splitlines()
    return bool(lines) and lines[-1].isdigit()


def peak_mb_gnu_time(argv, env, accepted):
    """Peak RSS in MB of one run, measured by GNU time around the child alone."""
    with tempfile.NamedTemporaryFile("r") as out:
        proc = subprocess.run([TIME_BIN, "-f", "%M", "-o", out.name, *argv], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                              timeout=CHILD_TIMEOUT)
        lines = out.read().strip().splitlines()
    if proc.returncode not in accepted or not lines or not lines[-1].isdigit():
        raise MeasureError(f"{' '.join(argv)} under {TIME_BIN}: exit status {proc.returncode}, "
                           f"output {lines!r}")
    return int(lines[-1]) / 1024


def imported_modules(argv, env, accepted):
    """Top-level module names a run imported, from `-X importtime` on stderr."""
    with open(argv[0], "rb") as handle:  # a console script: run its file under its shebang's python
        head = handle.readline()
    if head.startswith(b"#!"):
        argv = [head[2:].decode().strip(), *argv]
    traced = [argv[0], "-X", "importtime", *argv[1:]]
    proc = subprocess.run(traced, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=env, cwd=ROOT, timeout=CHILD_TIMEOUT)
    if proc.returncode not in accepted:
        raise MeasureError(f"{' '.join(traced)}: exit status {proc.returncode}")
    names = set()
    for line in proc.stderr.decode("utf-8", "replace").splitlines():
        match = re.match(r"import time:\s*\d+\s*\|\s*\d+\s*\|\s*([\w.]+)\s*$", line)
        if match:
            names.add(match.group(1).split(".")[0])
    return names


# ====================================================================== report

def verdict(ok):
    return "PASS" if ok else "FAIL"


def measure(args):
    base_env = common.child_env()  # bytecode cache on, no key, no route off the machine
    commands = build_commands(args.python, not args.no_dry_run)
    envs = {label: {**base_env, **extra} for label, _, _, extra in commands}
    base = tempfile.mkdtemp(prefix="bench-startup-")
    scratch = Scratch(base)
    try:
        for label, build, accepted, _ in commands:  # warm the bytecode cache: one untimed run each
            run_timed(build(scratch.new()), envs[label], accepted)
        times = {label: [] for label, _, _, _ in commands}
        wait4_mb = {label: [] for label, _, _, _ in commands}
        for _ in range(args.runs):  # round-robin, so drift in machine load hits all alike
            for label, build, accepted, _ in commands:
                elapsed, mb = run_timed(build(scratch.new()), envs[label], accepted)
                times[label].append(elapsed)
                wait4_mb[label].append(mb)
        use_gnu_time = gnu_time_works()
        peaks = {}
        for label, build, accepted, _ in commands:
            if use_gnu_time:
                peaks[label] = [peak_mb_gnu_time(build(scratch.new()), envs[label], accepted)
                                for _ in range(args.rss_runs)]
            else:
                peaks[label] = wait4_mb[label]
        modules = {label: imported_modules(build(scratch.new()), envs[label], accepted)
                   for label, build, accepted, _ in commands}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return commands, times, peaks, modules, use_gnu_time


def report_table(commands, times, peaks, modules, floor):
    """One line per command: median and min wall time, x floor, peak RSS, heavy imports."""
    print(f"{'command':34} {'median s':>9} {'min s':>7} {'x floor':>8} {'peak MB':>8}  "
          "SDK imported")
    for label, _, _, _ in commands:
        median = statistics.median(times[label])
        heavy = sorted(name for name in HEAVY_MODULES if name in modules[label])
        print(f"{label:34} {median:9.4f} {min(times[label]):7.4f} {median / floor:8.2f} "
              f"{statistics.median(peaks[label]):8.1f}  "
              f"{'yes: ' + ', '.join(heavy) if heavy else 'no'}"
              f"  ({len(modules[label])} top-level modules)")


def report_goals(commands, times, peaks, modules, floor):
    """PASS/FAIL per goal: absolute for the cached forms, the tutorial runner for the script."""
    medians = {label: statistics.median(times[label]) for label, _, _, _ in commands}
    peak = {label: statistics.median(peaks[label]) for label, _, _, _ in commands}
    print(f"absolute goals: under {GOAL_SECONDS} s, under {GOAL_MB:.0f} MB peak, SDK not imported; "
          f"x floor = against `python -c pass` ({floor:.4f} s) in this run")
    for label in [label for label, _, _, _ in commands[1:] if label not in (SCRIPT, TUTORIAL)]:
        print(f"  {label:34} time {verdict(medians[label] < GOAL_SECONDS)} "
              f"({medians[label]:.3f} s, "
              f"{medians[label] / floor:.2f}x floor)  peak {verdict(peak[label] < GOAL_MB)} "
              f"({peak[label]:.1f} MB, {peak[label] / peak[commands[0][0]]:.2f}x floor)"
              f"  no-SDK {verdict('perplexity' not in modules[label])}")
    if SCRIPT not in medians:
        print("  (the dry runs were not measured: --no-dry-run)")
        return
    time_ratio, peak_ratio = medians[SCRIPT] / medians[TUTORIAL], peak[SCRIPT] / peak[TUTORIAL]
    print(f"script form: held to the tutorial runner's start-up in this run "
          f"({medians[TUTORIAL]:.3f} s, {peak[TUTORIAL]:.1f} MB; ratio at most 1.00)")
    print(f"  {SCRIPT:34} time {verdict(time_ratio <= 1.0)} ({medians[SCRIPT]:.3f} s, "
          f"{time_ratio:.2f}x tutorial)  peak {verdict(peak_ratio <= 1.0)} ({peak[SCRIPT]:.1f} MB, "
          f"{peak_ratio:.2f}x tutorial)  no-SDK {verdict('perplexity' not in modules[SCRIPT])}")


def report(args, commands, times, peaks, modules, use_gnu_time):
    import resource
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    method = (f"GNU time %M, median of {args.rss_runs}" if use_gnu_time else
              f"os.wait4 ru_maxrss: an UPPER BOUND, includes this process's own peak ({own_mb:.1f} MB)")
    print(f"start-up benchmark: {args.runs} timed runs per command (round-robin, after one warm-up), "
          f"python {sys.version.split()[0]} at {args.python}")
    print(f"time = median wall seconds, spawn to reap; peak = {method}")
    floor = statistics.median(times[commands[0][0]])
    print()
    report_table(commands, times, peaks, modules, floor)
    print()
    report_goals(commands, times, peaks, modules, floor)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=common.positive_int, default=15, help="timed runs per command (default 15)")
    parser.add_argument("--rss-runs", type=common.positive_int, default=3,
                        help="extra runs per command under GNU time for peak RSS (default 3)")
    parser.add_argument("--python", default=sys.executable, help="interpreter to start (default: this one)")
    parser.add_argument("--no-dry-run", action="store_true",
                        help="leave out `regression.py --dry-run`")
    args = parser.parse_args(argv)
    try:
        results = measure(args)
    except (MeasureError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"startup benchmark: cannot measure: {exc}", file=sys.stderr)
        return 3
    report(args, *results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
