"""Start-up benchmark (SPEC C1): wall time and peak RSS of short commands vs `python -c pass`.

Measures, in one run and the same way for each command:
    floor                  python -c pass
    import regression      python -c "import regression"
    compare_runs --demo    python compare_runs.py --demo NEW_TMP_DIR
    --dry-run              python regression.py --dry-run

For each command: the median wall time of --runs runs (spawn to reap, interleaved
round-robin with the floor so machine noise hits every command alike), the ratio of
that median to the floor's, the peak RSS (GNU /usr/bin/time %M, which measures each
child alone), and whether the `perplexity` SDK was imported (one run under
`-X importtime`). Goals from SPEC C1: under 0.15 s and 25 MB peak, SDK not imported.

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

def build_commands(python, include_dry_run):
    commands = [
        ("floor: python -c pass", lambda scratch: [python, "-c", "pass"], {0}),
        ('python -c "import regression"', lambda scratch: [python, "-c", "import regression"], {0}),
        # The demo exits 1 by design (its 'after' run has a NEW_FAILURE); 2 means it broke.
        ("compare_runs.py --demo NEW_DIR",
         lambda scratch: [python, os.path.join(ROOT, "compare_runs.py"), "--demo", scratch], {0, 1}),
    ]
    # `regression.py --dry-run` (SPEC C1): validates the built-in suite, prints the plan,
    # needs no key and sends nothing.
    if include_dry_run:
        commands.append(("regression.py --dry-run",
                         lambda scratch: [python, os.path.join(ROOT, "regression.py"), "--dry-run"], {0}))
        # The same run from cached bytecode (the installed agent-regression command does this):
        # a script is compiled on every start, an imported module is not, and compiling the
        # 6,300-line runner is most of the difference.
        commands.append(("python -m regression --dry-run",
                         lambda scratch: [python, "-m", "regression", "--dry-run"], {0}))
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
    env = common.child_env()  # bytecode cache on, no key, no route off the machine
    commands = build_commands(args.python, not args.no_dry_run)
    base = tempfile.mkdtemp(prefix="bench-startup-")
    scratch = Scratch(base)
    try:
        for _, build, accepted in commands:  # warm the bytecode cache: one untimed run each
            run_timed(build(scratch.new()), env, accepted)
        times = {label: [] for label, _, _ in commands}
        wait4_mb = {label: [] for label, _, _ in commands}
        for _ in range(args.runs):  # round-robin, so drift in machine load hits all alike
            for label, build, accepted in commands:
                elapsed, mb = run_timed(build(scratch.new()), env, accepted)
                times[label].append(elapsed)
                wait4_mb[label].append(mb)
        use_gnu_time = gnu_time_works()
        peaks = {}
        for label, build, accepted in commands:
            if use_gnu_time:
                peaks[label] = [peak_mb_gnu_time(build(scratch.new()), env, accepted)
                                for _ in range(args.rss_runs)]
            else:
                peaks[label] = wait4_mb[label]
        modules = {label: imported_modules(build(scratch.new()), env, accepted)
                   for label, build, accepted in commands}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return commands, times, peaks, modules, use_gnu_time


def report(args, commands, times, peaks, modules, use_gnu_time):
    import resource
    own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    method = (f"GNU time %M, median of {args.rss_runs}" if use_gnu_time else
              f"os.wait4 ru_maxrss: an UPPER BOUND, includes this process's own peak ({own_mb:.1f} MB)")
    print(f"start-up benchmark: {args.runs} timed runs per command (round-robin, after one warm-up), "
          f"python {sys.version.split()[0]} at {args.python}")
    print(f"time = median wall seconds, spawn to reap; peak = {method}")
    floor_label = commands[0][0]
    floor = statistics.median(times[floor_label])
    print()
    print(f"{'command':34} {'median s':>9} {'min s':>7} {'x floor':>8} {'peak MB':>8}  SDK imported")
    for label, _, _ in commands:
        median = statistics.median(times[label])
        heavy = sorted(name for name in HEAVY_MODULES if name in modules[label])
        print(f"{label:34} {median:9.4f} {min(times[label]):7.4f} {median / floor:8.2f} "
              f"{statistics.median(peaks[label]):8.1f}  {'yes: ' + ', '.join(heavy) if heavy else 'no'}"
              f"  ({len(modules[label])} top-level modules)")
    print()
    print(f"goals (SPEC C1): under {GOAL_SECONDS} s, under {GOAL_MB:.0f} MB peak, SDK not imported; "
          f"time ratios are against the floor ({floor:.4f} s) measured in this run")
    for label, _, _ in commands[1:]:
        median = statistics.median(times[label])
        peak = statistics.median(peaks[label])
        sdk = "perplexity" in modules[label]
        print(f"  {label:34} time {verdict(median < GOAL_SECONDS)} ({median:.3f} s, {median / floor:.2f}x floor)"
              f"  peak {verdict(peak < GOAL_MB)} ({peak:.1f} MB)"
              f"  no-SDK {verdict(not sdk)}")
    if args.no_dry_run:
        print("  (regression.py --dry-run not measured: --no-dry-run)")


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
