"""Throughput benchmark (SPEC C1): wall time of concurrent runs against n*L/C, and harness overhead.

Runs `python regression.py --models m1 ... mK --repeats R --concurrency C --out TMP`
against a loopback fakes.FakeServer that answers every built-in case correctly after
sleeping L seconds (fakes.advisor(delay=L)). rows = requests = 4 cases x K x R.

Workloads (each run --reps times, interleaved, medians reported):
    64@c8     64 requests, L = 0.2 s, C = 8 (K=16, R=1)    floor n*L/C = 1.6 s
    100@c1   100 requests, L = 0.2 s, C = 1 (K=25, R=1)    floor 20 s   (skipped by --quick)
    100@c8   100 requests, L = 0.2 s, C = 8 (K=25, R=1)    floor 2.5 s
    overhead 1,000 requests, L = 0,  C = 8 (K=25, R=10)   per-row harness time, goal < 3 ms
    ovh@c1   1,000 requests, L = 0,  C = 1                 reference only: the same rows one
                                                           at a time (skipped by --quick)
The 100-request shapes are the ones to set beside other eval tools on the same workload.

Start-up. The goal is "wall time within 15 % of n*L/C, plus start-up", so start-up is
measured in the same run and subtracted: it is the median wall time (spawn to reap) of a
4-row zero-latency run (`--models m1 --repeats 1 --concurrency 1`), one such probe run
right before every workload run. That run pays everything a real run pays once: the
interpreter, the SDK import and client construction, the record's creation and fsyncs,
the final summary and exit. `regression.py --dry-run` is timed too, for reference only:
it imports no SDK and creates no record, so subtracting it would charge the SDK import
(most of a real run's start-up) to throughput. The probe also includes four zero-latency
rows (a few ms), so it slightly overstates start-up, by well under 1 % of any floor here.
When the probes spread widely (machine load changing during the run), the subtraction
gets noisy; the two figures below that need no subtraction then tell more.

Figures per workload with latency:
  - goal figure: (median wall - median start-up) / (n*L/C); goal <= 1.15 (SPEC C1);
  - busy: first request arrival (server clock) to the last row line on the console,
    against n*L/C -- start-up is left out of the same run, nothing is subtracted;
  - span: first to last request arrival (server clock) against (ceil(n/C) - 1) * L, the
    arrival span of a perfect C-wide pipeline (its last batch still needs L after it
    arrives); start-up and the tail are not in it;
  - refill: the mean of arrival[i] - arrival[i-C] - L, how long a slot freed by an
    answer waits for its next request (checkpoint, console line, thread start, request
    set-up): the per-request cost that stretches the span.
Figures at latency 0, per row:
  - (median wall - median start-up) / rows in ms, goal under 3 ms; the steady state
    (arrival span / (rows - 1)); both also as a multiple of the disk floor: the mean
    of 1,000 checkpoint-like writes (pwrite of a row plus the summary tail, ftruncate,
    fsync) in the records' folder, measured next to each run -- a mean over as many
    writes as the run makes, because fsync has a long tail (journal commits: the median
    is a fraction of the mean) and per-row figures are means too;
  - the runner's own checkpoint time ("+N s save" on its row lines, mean), its CPU per
    row (os.wait4 user + sys, less the start-up probe's), spawn to first request, the
    tail (last row line to exit: final summary, reordering rewrite, exit), and the fake
    server's CPU: time.process_time() of this process, whose threads are the server,
    per request and as a share of wall time (one core = 100 %).

Children run after one untimed warm-up, with PYTHONDONTWRITEBYTECODE unset, and talk
only to 127.0.0.1; every run has a watchdog, so the benchmark stops by itself.

Usage (from the repository root):
    .venv/bin/python bench/throughput.py [--quick] [--reps 3]

Takes about 2 minutes by default (the 100@c1 case is 3 x 20 s); --quick runs each other
workload once and skips 100@c1 and ovh@c1 (about 15 s).

Exit status: 0 whenever figures were produced (PASS/FAIL is a report, not a gate);
3 when a run could not be measured (runner failed, a row was not PASS, wrong request
count, timeout); 2 for usage errors.
"""

import argparse
import json
import math
import os
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

import common  # noqa: E402  (needs BENCH on sys.path)
import fakes  # noqa: E402  (needs ROOT on sys.path)

GOAL_RATIO = 1.15  # SPEC C1: within 15 % of n*L/C (plus start-up)
GOAL_MS_PER_ROW = 3.0  # harness overhead at latency 0
ROW_BYTES = 1000  # one built-in row at latency 0 is about 1 KB in the record
DISK_BLOCK = 3500  # one row plus the summary tail (~2.5 KB at 25 models) the runner rewrites with it
CASE_IDS = [case["id"] for case in fakes.regression.CASES]
SAVE_FIELD = re.compile(r"\(\+(\d+\.\d+)s save\)")  # the runner's own checkpoint time (A8)


class MeasureError(Exception):
    """A run could not be measured: the harness reports it and stops."""


class Workload:
    def __init__(self, name, models, repeats, concurrency, latency, goal=True):
        self.name, self.models, self.repeats = name, models, repeats
        self.concurrency, self.latency, self.goal = concurrency, latency, goal
        self.rows = len(CASE_IDS) * models * repeats

    @property
    def floor(self):
        """n*L/C: the wall time of a perfect C-wide pipeline, start-up left out."""
        return self.rows * self.latency / self.concurrency

    @property
    def span_floor(self):
        """First to last request arrival in a perfect pipeline: (ceil(n/C) - 1) * L."""
        return (math.ceil(self.rows / self.concurrency) - 1) * self.latency

    def __str__(self):
        return (f"{self.rows} rows (K={self.models} models x R={self.repeats} repeats x {len(CASE_IDS)} cases), "
                f"latency {self.latency:g} s, --concurrency {self.concurrency}")


STARTUP = Workload("start-up", 1, 1, 1, 0.0)


# ====================================================================== one run

def run_once(workload, folder, timeout):
    """One runner process against a fresh fake server; wall time and server-side figures."""
    models = [f"m{n}" for n in range(1, workload.models + 1)]
    out = os.path.join(folder, f"record-{time.monotonic_ns()}.json")
    argv = [sys.executable, os.path.join(ROOT, "regression.py"), "--models", *models,
            "--repeats", str(workload.repeats), "--concurrency", str(workload.concurrency), "--out", out]
    model_set, case_set = set(models), set(CASE_IDS)
    lines, saves, failed, last_line_wall = [], [], [], None
    with fakes.FakeServer(fakes.advisor(delay=workload.latency)) as server, \
            tempfile.TemporaryFile() as errors:
        cpu_start = time.process_time()
        spawned_wall = time.time()
        started = time.perf_counter()
        with common.Child(argv, common.child_env(server.url), folder, timeout, errors) as child:
            proc, timed_out = child.proc, child.timed_out
            for line in proc.stdout:  # one line per finished row, flushed as it happens
                now = time.perf_counter()
                last_line_wall = time.time()
                row = common.row_line(line, model_set, case_set)
                if row is None:
                    continue  # the summary JSON, or anything else that is not a row line
                text, words = row
                lines.append(now)
                match = SAVE_FIELD.search(text)
                saves.append(float(match.group(1)) if match else None)
                if "PASS" not in words:
                    failed.append(text)
            _, status, usage = os.wait4(proc.pid, 0)  # the runner's own CPU time comes with it
            wall = time.perf_counter() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = time.process_time() - cpu_start
        errors.seek(0)
        stderr = errors.read().decode("utf-8", "replace").strip()
        requests, arrivals = server.count, list(server.arrivals)
    try:
        os.unlink(out)
    except OSError:
        pass
    if timed_out.is_set():
        raise MeasureError(f"{workload}: no exit within {timeout:g} s ({len(lines)} row lines seen)")
    if proc.returncode != 0 or failed or len(lines) != workload.rows or requests != workload.rows:
        detail = failed[0] if failed else stderr[-300:]
        raise MeasureError(f"{workload}: exit status {proc.returncode}, {len(lines)} row lines "
                           f"({len(failed)} not PASS), {requests} requests (expected {workload.rows}): {detail}")
    known_saves = [value for value in saves if value is not None]
    return {
        "wall": wall,
        "span": arrivals[-1] - arrivals[0],
        "busy": last_line_wall - arrivals[0],  # first request arrival to the last row line
        "refill": refill_delay(sorted(arrivals), workload.concurrency, workload.latency),
        "to_first": arrivals[0] - spawned_wall,  # spawn to the first request (server clock)
        "tail": started + wall - lines[-1],  # last row line to exit: summary, reorder, exit
        "save": sum(known_saves) / len(known_saves) if len(known_saves) == len(saves) else None,
        "server_cpu": cpu,
        "runner_cpu": usage.ru_utime + usage.ru_stime,
    }


def refill_delay(arrivals, concurrency, latency):
    """Mean seconds a freed slot stays empty: arrival i against arrival i-C plus L.

    In a perfect C-wide pipeline request i starts the moment request i-C is answered,
    so arrivals[i] - arrivals[i - C] - L is the time the harness took to hand the slot
    on (checkpoint, console line, thread start, request set-up). None at latency 0.
    """
    if latency == 0 or len(arrivals) <= concurrency:
        return None
    gaps = [arrivals[i] - arrivals[i - concurrency] - latency for i in range(concurrency, len(arrivals))]
    return sum(gaps) / len(gaps)


def time_dry_run(folder, timeout):
    """Wall seconds of `regression.py --dry-run` (reference only: no SDK import, no record)."""
    env = common.child_env(common.CLOSED_URL)  # discard port: nothing is sent anyway
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "regression.py"), "--dry-run"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=env, cwd=folder, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"regression.py --dry-run: no exit within {timeout:g} s") from None
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise MeasureError(f"regression.py --dry-run: exit status {proc.returncode}: "
                           f"{proc.stderr.decode('utf-8', 'replace').strip()[-300:]}")
    return elapsed


# ====================================================================== report

def transport_overhead(latency, count=9):
    """Median seconds a plain stdlib HTTP round trip to the same fake server takes beyond its latency.

    On a shared VM, waking a thread and a process after a long idle wait costs time that grows
    with the wait (seen here: 0.3 ms at L=0, 10 ms at L=0.2 s). No harness can beat it, so it
    is shown beside the n*L/C goal as the floor this machine actually offers."""
    import http.client
    question = fakes.regression.CASES[0]["question"]
    body = json.dumps({"input": question})
    extra = []
    with fakes.FakeServer(fakes.advisor(delay=latency)) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            for _ in range(count):
                started = time.perf_counter()
                connection.request("POST", "/v1/responses", body, {"Content-Type": "application/json"})
                connection.getresponse().read()
                extra.append(time.perf_counter() - started - latency)
        finally:
            connection.close()
    return statistics.median(extra)


def verdict(ok):
    return "PASS" if ok else "FAIL"


def median_of(results, key):
    values = [result[key] for result in results if result[key] is not None]
    return statistics.median(values) if values else None


def ms(value, digits=2):
    return "-" if value is None else f"{value * 1000:.{digits}f}"


def report(workloads, results, startups, dry_runs, disks, reps, quick, elapsed, transport):
    startup = median_of(startups, "wall")
    walls = [probe["wall"] for probe in startups]
    print()
    print(f"start-up (median of {len(startups)} probe runs, 4 rows at latency 0, spawn to reap): "
          f"{startup:.3f} s  (min {min(walls):.3f}, max {max(walls):.3f})")
    print(f"  reference: regression.py --dry-run, median of {len(dry_runs)}: {statistics.median(dry_runs):.3f} s "
          f"(no SDK import, no record: not subtracted)")
    if max(walls) > 1.5 * min(walls):
        print(f"  NOTE: the start-up probes spread {max(walls) / min(walls):.1f}x (machine load changed during "
              f"the run); the subtracted figures are noisy, busy and span need no subtraction")
    print()
    print(f"medians of {reps} run(s); ratio = (wall - start-up) / floor, floor = n*L/C")
    print(f"{'workload':9} {'rows':>5} {'C':>2} {'L s':>4} {'floor s':>8} {'wall s':>7} {'-start s':>8} "
          f"{'x floor':>7} {'busy s':>7} {'x floor':>7} {'span s':>7} {'span floor':>10} {'x':>5} {'refill ms':>9}")
    for workload in workloads:
        if workload.latency == 0:
            continue
        values = results[workload.name]
        wall = median_of(values, "wall")
        span = median_of(values, "span")
        busy = median_of(values, "busy")
        print(f"{workload.name:9} {workload.rows:5} {workload.concurrency:2} {workload.latency:4g} "
              f"{workload.floor:8.2f} {wall:7.3f} {wall - startup:8.3f} {(wall - startup) / workload.floor:7.3f} "
              f"{busy:7.3f} {busy / workload.floor:7.3f} "
              f"{span:7.3f} {workload.span_floor:10.2f} {span / workload.span_floor:5.3f} "
              f"{ms(median_of(values, 'refill'), 1):>9}")
    print("  busy = first request arrival (server clock) to the last row line, in the same run: no subtraction;")
    print("  span = first to last request arrival on the server's clock (start-up and tail left out);")
    print("  span floor = (ceil(n/C) - 1) * L, the arrival span of a perfect C-wide pipeline;")
    print("  refill = mean of arrival[i] - arrival[i-C] - L: how long a freed slot waits for its next request")

    overheads = [w for w in workloads if w.latency == 0]
    if overheads:
        disk = statistics.median(disks)
        print()
        print(f"harness overhead at latency 0 (medians of {reps} run(s)), ms per row:")
        print(f"{'workload':9} {'rows':>5} {'C':>2} {'wall s':>7} {'per-row':>8} {'x disk':>7} {'steady':>7} "
              f"{'save':>6} {'runner':>7} {'server':>7} {'server%':>7} {'to 1st':>7} {'tail':>6}")
        for workload in overheads:
            values = results[workload.name]
            wall = median_of(values, "wall")
            per_row = (wall - startup) / workload.rows
            steady = median_of(values, "span") / (workload.rows - 1)
            runner_cpu = (median_of(values, "runner_cpu") - median_of(startups, "runner_cpu")) / workload.rows
            cpu = median_of(values, "server_cpu")
            print(f"{workload.name:9} {workload.rows:5} {workload.concurrency:2} {wall:7.3f} {ms(per_row, 3):>8} "
                  f"{per_row / disk:7.1f} {ms(steady, 3):>7} {ms(median_of(values, 'save'), 3):>6} "
                  f"{ms(runner_cpu, 3):>7} {ms(cpu / workload.rows, 3):>7} {100 * cpu / wall:6.0f}% "
                  f"{ms(median_of(values, 'to_first'), 0):>7} {ms(median_of(values, 'tail'), 0):>6}")
        print("  per-row = (wall - start-up) / rows; steady = first-to-last arrival / (rows - 1);")
        print(f"  x disk = per-row / disk floor: one {DISK_BLOCK}-byte pwrite + ftruncate + fsync in the records'")
        print(f"  folder (the runner's checkpoint pattern), mean of 1,000, median of {len(disks)} such sets next to")
        print(f"  the runs: {ms(disk, 3)} ms; save = mean of the runner's own '+N s save' (printed to 1 ms);")
        print("  runner = its user + sys CPU per row (wait4, start-up probe's CPU subtracted); server = fake")
        print("  server CPU per request (this process's threads), server% = of one core over the wall;")
        print("  to 1st = spawn to first request arrival, tail = last row line to exit (summary, reorder, exit), ms")

    print()
    print(f"goals (start-up {startup:.3f} s and all floors measured/derived in this run):")
    for workload in workloads:
        if workload.latency == 0:
            continue
        ratio = (median_of(results[workload.name], "wall") - startup) / workload.floor
        print(f"  {workload.name:9} throughput: (wall - start-up) within {GOAL_RATIO}x of n*L/C = "
              f"{workload.floor:g} s: {ratio:.3f}x {verdict(ratio <= GOAL_RATIO)}")
    for workload in workloads:
        if workload.latency == 0:
            continue
        floor = workload.rows / workload.concurrency * (workload.latency + transport)
        ratio = (median_of(results[workload.name], "wall") - startup) / floor
        print(f"  {workload.name:9} diagnostic: against n*(L+t)/C = {floor:.3f} s, with t = {ms(transport)} ms the "
              f"stdlib round-trip cost beyond L measured now: {ratio:.3f}x")
    for workload in overheads:
        if not workload.goal:
            continue
        per_row = (median_of(results[workload.name], "wall") - startup) / workload.rows
        print(f"  {workload.name:9} harness overhead under {GOAL_MS_PER_ROW:g} ms per row at latency 0, "
              f"--concurrency {workload.concurrency}: {ms(per_row, 3)} ms {verdict(per_row * 1000 < GOAL_MS_PER_ROW)}")
    if quick:
        print("  (--quick: 100@c1 (floor 20 s) and the ovh@c1 reference not measured)")
    print(f"(benchmark wall time {elapsed:.1f} s)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=common.positive_int, help="runs of each workload (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="sanity run: one repetition, and the 20 s 100@c1 workload is skipped")
    args = parser.parse_args(argv)
    reps = args.reps if args.reps is not None else 1 if args.quick else 3
    workloads = [Workload("64@c8", 16, 1, 8, 0.2)]
    if not args.quick:
        workloads.append(Workload("100@c1", 25, 1, 1, 0.2))
    workloads += [Workload("100@c8", 25, 1, 8, 0.2), Workload("overhead", 25, 10, 8, 0.0)]
    if not args.quick:  # reference for the overhead figure: the same rows one at a time
        workloads.append(Workload("ovh@c1", 25, 10, 1, 0.0, goal=False))

    folder = tempfile.mkdtemp(prefix="bench-throughput-")
    results = {workload.name: [] for workload in workloads}
    startups, dry_runs, disks = [], [], []
    started = time.perf_counter()
    try:
        print(f"throughput benchmark: {reps} repetition(s) per workload, interleaved, each after a start-up "
              f"probe; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        for workload in workloads:
            print(f"  {workload.name:9} {workload}; floor n*L/C = {workload.floor:g} s")
        run_once(STARTUP, folder, 60)  # untimed warm-up: bytecode cache, page cache, SDK files
        time_dry_run(folder, 60)
        for rep in range(1, reps + 1):
            dry_runs.append(time_dry_run(folder, 60))
            for workload in workloads:
                startups.append(run_once(STARTUP, folder, 60))
                if workload.latency == 0:  # the disk floor next to the run it is set against
                    # like the runner's append: pwrite a row plus the summary tail at the end,
                    # truncate, fsync; the end advances by a row (the tail is rewritten)
                    disks.append(common.disk_floor(folder, DISK_BLOCK, count=1000, statistic=statistics.mean,
                                                   step=ROW_BYTES, truncate=True))
                timeout = 60 + 5 * workload.floor + 0.05 * workload.rows
                result = run_once(workload, folder, timeout)
                results[workload.name].append(result)
                print(f"  rep {rep} {workload.name:9} wall {result['wall']:.3f} s, arrival span "
                      f"{result['span']:.3f} s, start-up probe {startups[-1]['wall']:.3f} s", flush=True)
    except MeasureError as exc:
        print(f"throughput benchmark: cannot measure: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("throughput benchmark: interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    latencies = sorted({workload.latency for workload in workloads if workload.latency})
    transport = statistics.median([transport_overhead(latency) for latency in latencies]) if latencies else 0.0
    report(workloads, results, startups, dry_runs, disks, reps, args.quick, time.perf_counter() - started,
           transport)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
