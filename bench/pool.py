"""Worker-pool benchmark (issue 10 item 6): concurrency is never slower than sequential, and
what a live run costs beyond the SDK import.

1. Concurrency at latency 0. 1,000 requests (`--models m1..m25 --repeats 10`) against a
   loopback fakes.FakeServer that answers every built-in case correctly at once, with
   `--concurrency 8` and with `--concurrency 1`, interleaved, --reps times each (through
   throughput.run_once). Medians of:
     wall    spawn to reap;
     busy    the first request's arrival at the server to the last row line (start-up and
             exit left out);
     cpu     the runner's own CPU time (user + system, os.wait4): what the harness costs.
   The goal is c8 / c1 <= 1.00 on wall and on busy: at latency 0 there is nothing to wait
   for, so concurrency cannot win much, but it must not cost.

2. Fixed cost of a live run. Round-robin, --runs times each after one untimed warm-up:
     floor        python -c pass
     import       python -c "import perplexity"   (the SDK alone)
     plain        a plain sequential runner on the same SDK: import it, build a client with
                  max_retries=0, send the 4 built-in requests, write the 4 answers to a file
     live run     regression.py --models m1 --out NEW   (4 requests at latency 0 through the
                  real SDK, SDK import included: record, fsyncs, summary, exit)
   Medians of wall and CPU; ratios to `import`, and the run's cost beyond the import and
   beyond the plain runner in ms. Children run with PYTHONDONTWRITEBYTECODE unset (bytecode
   cache used, as on a user's second run) and talk to 127.0.0.1 only.

On a shared machine the wall figures move with the load; the ratios, taken between runs that
are interleaved, and the CPU figures move much less. Prints PASS/FAIL against the goals and
exits 0 whenever it produced figures, 3 when a measurement failed.

Usage (from the repository root):
    .venv/bin/python bench/pool.py [--reps 3] [--runs 9] [--quick]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]  # the project's modules, then the siblings beside this script

import common  # noqa: E402
import fakes  # noqa: E402
import throughput  # noqa: E402  (run_once, Workload, MeasureError)

CHILD_TIMEOUT = 120.0

# A plain sequential runner on the same SDK: what any script that uses it pays at least.
PLAIN = """\
import json, sys
import perplexity
import regression
suite = regression.builtin_suite()
client = perplexity.Perplexity(max_retries=0, timeout=180)
answers = [client.responses.create(**regression.PerplexityProvider().body("m1", suite, case)).model_dump(mode="json")
           for case in suite["cases"]]
with open(sys.argv[1], "x") as handle:
    json.dump(answers, handle)
"""


def run_child(argv, env, cwd):
    """(wall seconds, CPU seconds) of one child, spawn to reap; MeasureError unless it exits 0."""
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                env=env, cwd=cwd)
        watchdog = threading.Timer(CHILD_TIMEOUT, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        wall = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            errors.seek(0)
            raise throughput.MeasureError(f"{' '.join(argv[:4])}...: exit status {code}: "
                                          f"{errors.read().decode('utf-8', 'replace').strip()[-300:]}")
    return wall, usage.ru_utime + usage.ru_stime


def fixed_cost(folder, runs):
    """{label: [(wall, cpu), ...]} for the floor, the SDK import, the plain runner and a live run."""
    counter = iter(range(10 ** 9))

    def new_out():
        return os.path.join(folder, f"fixed-{next(counter)}.json")

    python, script = sys.executable, os.path.join(ROOT, "regression.py")
    commands = [
        ("floor: python -c pass", lambda: [python, "-c", "pass"]),
        ('import: python -c "import perplexity"', lambda: [python, "-c", "import perplexity"]),
        ("plain: SDK + 4 requests + file", lambda: [python, "-c", PLAIN, new_out()]),
        ("live run: regression.py --models m1", lambda: [python, script, "--models", "m1", "--out", new_out()]),
    ]
    times = {label: [] for label, _ in commands}
    with fakes.FakeServer(fakes.advisor()) as server:
        env = common.child_env(server.url)
        env["PYTHONPATH"] = ROOT  # the plain runner borrows the request shape from regression.py
        for _, build in commands:  # warm-up: bytecode cache, page cache
            run_child(build(), env, folder)
        for _ in range(runs):
            for label, build in commands:
                times[label].append(run_child(build(), env, folder))
    return times


def concurrency_runs(folder, reps):
    """{concurrency: [run_once result, ...]} for 1,000 rows at latency 0, C = 8 and C = 1, interleaved."""
    workloads = {8: throughput.Workload("c8", 25, 10, 8, 0.0), 1: throughput.Workload("c1", 25, 10, 1, 0.0)}
    results = {concurrency: [] for concurrency in workloads}
    throughput.run_once(throughput.STARTUP, folder, CHILD_TIMEOUT)  # warm-up
    for rep in range(1, reps + 1):
        order = (8, 1) if rep % 2 else (1, 8)  # alternate which goes first
        for concurrency in order:
            result = throughput.run_once(workloads[concurrency], folder, CHILD_TIMEOUT)
            results[concurrency].append(result)
            print(f"  rep {rep} --concurrency {concurrency}: wall {result['wall']:.3f} s, busy {result['busy']:.3f} s, "
                  f"runner CPU {result['runner_cpu']:.3f} s", flush=True)
    return results


def verdict(ok):
    return "PASS" if ok else "FAIL"


def median(values):
    return statistics.median(values)


def report_concurrency(results, reps):
    print()
    print(f"1,000 requests at latency 0, medians of {reps} run(s) each (interleaved):")
    print(f"{'':18} {'wall s':>8} {'busy s':>8} {'CPU s':>8} {'ms/row':>7}")
    figures = {}
    for concurrency in (1, 8):
        values = results[concurrency]
        wall, busy = median([v["wall"] for v in values]), median([v["busy"] for v in values])
        cpu = median([v["runner_cpu"] for v in values])
        figures[concurrency] = (wall, busy, cpu)
        rows = throughput.Workload("", 25, 10, concurrency, 0.0).rows
        print(f"  --concurrency {concurrency:<3} {wall:8.3f} {busy:8.3f} {cpu:8.3f} {1000 * busy / rows:7.3f}")
    (wall1, busy1, cpu1), (wall8, busy8, cpu8) = figures[1], figures[8]
    print(f"  c8 / c1: wall {wall8 / wall1:.3f}, busy {busy8 / busy1:.3f}, runner CPU {cpu8 / cpu1:.3f}")
    print(f"  goal: concurrency never slower than sequential (c8 / c1 <= 1.00): "
          f"wall {verdict(wall8 <= wall1)}, busy {verdict(busy8 <= busy1)}")


def report_fixed(times, runs):
    print()
    print(f"fixed cost of a live run, medians of {runs} run(s) each (round-robin, after a warm-up):")
    print(f"{'command':42} {'wall s':>8} {'x import':>8} {'CPU s':>7} {'x import':>8}")
    labels = list(times)
    medians = {label: (median([w for w, _ in times[label]]), median([c for _, c in times[label]]))
               for label in labels}
    import_wall, import_cpu = medians[labels[1]]
    for label in labels:
        wall, cpu = medians[label]
        print(f"  {label:40} {wall:8.3f} {wall / import_wall:8.2f} {cpu:7.3f} {cpu / import_cpu:8.2f}")
    plain_wall, plain_cpu = medians[labels[2]]
    live_wall, live_cpu = medians[labels[3]]
    print(f"  the live run beyond the SDK import: {1000 * (live_wall - import_wall):.0f} ms wall, "
          f"{1000 * (live_cpu - import_cpu):.0f} ms CPU; beyond the plain runner: "
          f"{1000 * (live_wall - plain_wall):.0f} ms wall, {1000 * (live_cpu - plain_cpu):.0f} ms CPU "
          f"(the record's fsyncs, summary and checks are the harness's part)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=common.positive_int, help="runs of each 1,000-row workload (default 3)")
    parser.add_argument("--runs", type=common.positive_int, help="runs of each fixed-cost command (default 9)")
    parser.add_argument("--quick", action="store_true", help="one 1,000-row run each, 3 fixed-cost runs")
    args = parser.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    runs = args.runs or (3 if args.quick else 9)
    folder = tempfile.mkdtemp(prefix="bench-pool-")
    started = time.perf_counter()
    print(f"pool benchmark: python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    try:
        times = fixed_cost(folder, runs)
        results = concurrency_runs(folder, reps)
    except throughput.MeasureError as exc:
        print(f"pool benchmark: cannot measure: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("pool benchmark: interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report_fixed(times, runs)
    report_concurrency(results, reps)
    print(f"(benchmark wall time {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
