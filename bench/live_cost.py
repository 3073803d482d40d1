"""Live fixed-cost benchmark: what a short live run costs against the tutorial's plain runner.

Each command sends the same 4 requests at latency 0 through the real `perplexity` SDK (SDK
import included) to one loopback fakes.FakeServer, which answers the Agent API route
(/v1/responses, where `regression.py` sends) and the chat route as the SDK calls it
(/chat/completions, where the tutorial runner sends):
    floor      python -c pass                                  (reference)
    tutorial   python bench/tutorial_runner.py --out NEW       (the yardstick)
    cached     python -m regression --models m1 --out NEW      (as the installed command runs)
    script     python regression.py --models m1 --out NEW      (compiled on every start)

Round-robin, --runs times each (default 5) after one untimed warm-up, children with
PYTHONDONTWRITEBYTECODE unset so the bytecode cache is used. Each run is timed spawn to
reap under GNU /usr/bin/time, which gives its peak RSS and CPU. Medians of wall time, CPU
and peak RSS, and their ratios to the tutorial runner's in the same run. Goals: the cached
form within 1.05x of the tutorial runner, the script form within 1.2x (its extra is
compiling the file), on wall time and on peak RSS. On a FAIL (or with --profile) it prints
what the extra is: the modules the cached run imports beyond the tutorial runner's
(`-X importtime`) and the runner's own functions that cost most (cProfile).

Usage (from the repository root):
    .venv/bin/python bench/live_cost.py [--runs 5] [--profile]

Exit status: 0 whenever figures were produced (PASS/FAIL lines are a report, not a gate);
3 when a command could not be measured (it failed or timed out); 2 for usage errors.
"""

import argparse
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]  # the project's modules, then common.py beside this script

import common  # noqa: E402
import fakes  # noqa: E402

TIME_BIN = "/usr/bin/time"
CHILD_TIMEOUT = 120.0
GOALS = {"cached": 1.05, "script": 1.2}  # x the tutorial runner, on wall time and peak RSS
ANSWER = "429 503 412 unknown: the status code, then wait_then_retry"  # every tutorial case passes


class MeasureError(Exception):
    """A command could not be measured (failed, timed out): the harness reports and stops."""


def reply(request):
    """The Agent API for regression.py, the chat route for the tutorial runner."""
    if request.path.split("?")[0].endswith("/chat/completions"):
        return fakes.chat(lambda body: fakes.chat_response(ANSWER, model="sonar"))(request)
    return fakes.advisor()(request)


def build_commands(python, new_out):
    """[(key, label, argv builder)]: the floor, the yardstick, then the two forms of the runner."""
    script = os.path.join(ROOT, "regression.py")
    return [
        ("floor", "python -c pass", lambda: [python, "-c", "pass"]),
        ("tutorial", "tutorial runner (4 requests)",
         lambda: [python, os.path.join(BENCH, "tutorial_runner.py"), "--out", new_out()]),
        ("cached", "python -m regression --models m1",
         lambda: [python, "-m", "regression", "--models", "m1", "--out", new_out()]),
        ("script", "python regression.py --models m1",
         lambda: [python, script, "--models", "m1", "--out", new_out()]),
    ]


def run_once(argv, env, cwd):
    """{wall, cpu, peak} of one run under GNU time; MeasureError unless it exits 0."""
    with tempfile.NamedTemporaryFile("r") as out, tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        try:
            proc = subprocess.run([TIME_BIN, "-f", "%M %U %S", "-o", out.name, *argv], env=env,
                                  cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=errors, timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise MeasureError(f"{' '.join(argv[:4])}: timed out after {CHILD_TIMEOUT:.0f} s") \
                from None
        wall = time.perf_counter() - started
        fields = (out.read().strip().splitlines() or [""])[-1].split()
        if proc.returncode != 0 or len(fields) != 3:
            errors.seek(0)
            raise MeasureError(f"{' '.join(argv[:4])}: exit status {proc.returncode}: "
                               f"{errors.read().decode('utf-8', 'replace').strip()[-300:]}")
    return {"wall": wall, "cpu": float(fields[1]) + float(fields[2]), "peak": int(fields[0]) / 1024}


def measure(runs, folder, env):
    """{key: [run figures, ...]} of every command, round-robin after one warm-up each."""
    counter = iter(range(10 ** 9))
    commands = build_commands(sys.executable,
                              lambda: os.path.join(folder, f"out-{next(counter)}.json"))
    for _, _, build in commands:  # warm-up: bytecode cache, page cache
        run_once(build(), env, folder)
    figures = {key: [] for key, _, _ in commands}
    for _ in range(runs):
        for key, _, build in commands:
            figures[key].append(run_once(build(), env, folder))
    return commands, figures


def medians(figures):
    """{key: {wall, cpu, peak}} medians of each command's runs."""
    return {key: {name: statistics.median(run[name] for run in runs)
                  for name in ("wall", "cpu", "peak")}
            for key, runs in figures.items()}


def verdict(ok):
    return "PASS" if ok else "FAIL"


def report(commands, figures, runs):
    """The table and the goal lines; True when every goal holds."""
    med = medians(figures)
    yardstick = med["tutorial"]
    print(f"live fixed cost, 4 requests at latency 0 through the SDK: medians of {runs} run(s) "
          "each "
          f"(round-robin, after a warm-up), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'command':36} {'wall s':>7} {'CPU s':>7} {'peak MB':>8} {'wall x tut':>10} "
          f"{'CPU x tut':>9} "
          f"{'peak x tut':>10}")
    for key, label, _ in commands:
        m = med[key]
        print(f"  {label:34} {m['wall']:7.3f} {m['cpu']:7.3f} {m['peak']:8.1f} "
              f"{m['wall'] / yardstick['wall']:10.2f} {m['cpu'] / yardstick['cpu']:9.2f} "
              f"{m['peak'] / yardstick['peak']:10.2f}")
    held = True
    for key, goal in GOALS.items():
        wall, peak = med[key]["wall"] / yardstick["wall"], med[key]["peak"] / yardstick["peak"]
        label = next(label for k, label, _ in commands if k == key)
        print(f"goal: {label} within {goal}x of the tutorial runner: wall {verdict(wall <= goal)} "
              f"({wall:.3f}x, {1000 * (med[key]['wall'] - yardstick['wall']):+.0f} ms), peak "
              f"{verdict(peak <= goal)} ({peak:.3f}x, "
              f"{med[key]['peak'] - yardstick['peak']:+.1f} MB)")
        held = held and wall <= goal and peak <= goal
    return held


# ====================================================================== what the extra is

def import_times(argv, env, cwd):
    """{module: self microseconds} of one run under `-X importtime`."""
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE,
                          timeout=CHILD_TIMEOUT)
    found = {}
    for line in proc.stderr.decode("utf-8", "replace").splitlines():
        match = re.match(r"import time:\s*(\d+)\s*\|\s*\d+\s*\|\s*([\w.]+)\s*$", line)
        if match:
            found[match.group(2).strip()] = int(match.group(1))
    return found


def profile_extra(commands, env, folder):
    """Print the imports the cached run adds to the tutorial's, and the runner's costliest calls."""
    builds = {key: build for key, _, build in commands}
    ours, theirs = (import_times(builds[key](), env, folder) for key in ("cached", "tutorial"))
    extra = sorted(((us, name) for name, us in ours.items() if name not in theirs), reverse=True)
    print(f"what the extra is: the cached run imports {len(extra)} module(s) the tutorial runner "
          f"does not, {sum(us for us, _ in extra) / 1000:.1f} ms of import time (self), the "
          "largest:")
    for us, name in extra[:8]:
        print(f"  {us / 1000:7.1f} ms  {name}")
    sdk, both = (run_once([sys.executable, "-c", code], env, folder)["peak"]
                 for code in ("import perplexity", "import perplexity, regression"))
    print(f"  the runner's module adds {both - sdk:.1f} MB of peak to the SDK's ({sdk:.1f} MB): "
          "its own code objects and tables, loaded once")
    fsync_ms = 1000 * common.disk_floor(folder, 4096, 20, statistics.median)
    print(f"  each fsync'd write of the record (at its creation, per row, at the summary) costs "
          f"{fsync_ms:.1f} ms here (median of 20 in the same folder); the tutorial runner "
          "fsyncs none")
    argv = builds["cached"]()
    stats_path = os.path.join(folder, "profile.stats")
    subprocess.run([argv[0], "-m", "cProfile", "-o", stats_path, *argv[1:]], env=env, cwd=folder,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=CHILD_TIMEOUT)
    own = {}  # the largest cumulative time of each of the runner's functions, by name
    for (path, _, name), values in pstats.Stats(stats_path).stats.items():
        if os.path.basename(path) == "regression.py":
            own[name] = max(own.get(name, 0.0), values[3])
    phases = {"whole run (regression.py as __main__)": own.get("<module>", 0.0),
              "SDK import and client (make_provider)": own.get("make_provider", 0.0),
              "the 4 rows: requests, grading, record (run_rows)": own.get("run_rows", 0.0)}
    phases["the rest: module body, options, summary, exit"] = (
        phases["whole run (regression.py as __main__)"] - sum(list(phases.values())[1:]))
    print("  where the cached run's time goes (cProfile, one run, inflated by the profiler):")
    for label, seconds in phases.items():
        print(f"  {1000 * seconds:8.1f} ms  {label}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=common.positive_int, default=5,
                        help="runs per command (default 5)")
    parser.add_argument("--profile", action="store_true", help="say what the extra is even on PASS")
    args = parser.parse_args(argv)
    if not os.access(TIME_BIN, os.X_OK):
        print(f"live_cost benchmark: needs GNU time at {TIME_BIN}", file=sys.stderr)
        return 3
    folder = tempfile.mkdtemp(prefix="bench-live-cost-")
    try:
        with fakes.FakeServer(reply) as server:
            env = common.child_env(server.url)
            env["PYTHONPATH"] = ROOT  # `python -m regression` from a scratch folder
            commands, figures = measure(args.runs, folder, env)
            held = report(commands, figures, args.runs)
            if args.profile or not held:
                profile_extra(commands, env, folder)
    except (MeasureError, OSError, subprocess.SubprocessError) as exc:
        print(f"live_cost benchmark: cannot measure: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("live_cost benchmark: interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
