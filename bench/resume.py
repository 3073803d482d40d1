"""Resume benchmark (SPEC B4, C2): kill -9 at row k of n, resume, count what is sent again.

A correctness benchmark: its floor is an exact count. Each trial:
  1. runs `python regression.py --models m1 ... mK --repeats R --out FILE` (n = 4 x K x R
     rows) against a loopback fakes.FakeServer answering every built-in case correctly
     after L seconds, reads its console until k row lines were printed, waits a random
     fraction of L (--no-jitter: not at all), and SIGKILLs it;
  2. counts the requests the server saw once it has been quiet for 0.2 s (so a request
     of the killed process already on the wire is counted before the resume starts),
     and reads FILE with regression.load_record to get the recovered rows r. Every
     printed row must be recovered (r >= k; r may exceed k by rows finished but not yet
     read off the console);
  3. runs `python regression.py --resume FILE` (plus `--concurrency C` when C > 1: the
     concurrency is not in the record's config, so a bare --resume runs one at a time)
     against the same server (one record, one endpoint), and checks:
       - the server saw exactly n - r further requests (the floor), and they were the
         missing rows: the same (model, case) pairs, as many times each;
       - exit status 0, summary complete, exit_code 0, the record not "recovered";
       - the final rows are in plan order (regression.plan_rows) and equal those of an
         uninterrupted run modulo timings (`seconds`).
Printed per trial: k, r, requests before the kill, further requests, expected n - r,
PASS/FAIL, and -- indicative only -- the resume's wall time as a ratio to an
uninterrupted run of the remaining rows, estimated from one uninterrupted n-row
reference run in the same benchmark (its wall time less r times its per-row time).

Trials: the first three kill at 10 %, 50 % and 90 % of n; further trials at random k
(--seed). The kill lands after the k-th line, at a random point in the life of the next
row (its request, grading or checkpoint), not at a uniformly random instant of the run.

Children run after one untimed warm-up, with PYTHONDONTWRITEBYTECODE unset, and talk
only to 127.0.0.1; every run has a watchdog, so the benchmark stops by itself.

Usage (from the repository root):
    .venv/bin/python bench/resume.py [--trials 3] [--models 10] [--repeats 2]
        [--latency 0.02] [--concurrency 1] [--seed N] [--no-jitter]
The default takes about 15 s.

Exit status: 0 whenever the trials ran (PASS/FAIL is a report, not a gate); 3 when a
trial could not be set up or measured (the reference or the killed run failed on its
own, a run timed out); 2 for usage errors.
"""

import argparse
import collections
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]  # the project's modules, then common.py beside this script

import common  # noqa: E402  (needs BENCH on sys.path)
import fakes  # noqa: E402  (needs ROOT on sys.path)
import regression  # noqa: E402

CASE_IDS = [case["id"] for case in regression.CASES]
CASE_OF_QUESTION = {question: case["id"] for question, case in fakes.CASES_BY_QUESTION.items()}
FIXED_FRACTIONS = (0.1, 0.5, 0.9)
TIMING_FIELDS = ("seconds",)  # what may differ between a resumed and an uninterrupted run
QUIET_SECONDS = 0.2  # the server counts as settled after this long without a new request


class MeasureError(Exception):
    """A trial could not be set up or measured: the harness reports it and stops."""


class Runner(common.Child):
    """One regression.py process whose row lines are read as they come; always reaped.

    kill() SIGKILLs it; timed_out tells whether its watchdog did.
    """

    def __init__(self, argv, url, folder, timeout, models):
        self.models, self.lines, self.stamps = set(models), [], []
        self.errors = tempfile.TemporaryFile()
        self.started = time.perf_counter()
        super().__init__(argv, common.child_env(url), folder, timeout, self.errors)

    def read_rows(self, until=None):
        """Read row lines until `until` of them were seen (None: to the end of output)."""
        for line in self.proc.stdout:
            row = common.row_line(line, self.models, CASE_IDS)
            if row is not None:
                self.lines.append(row[0])
                self.stamps.append(time.perf_counter())
                if until is not None and len(self.lines) >= until:
                    return True
        return False

    def finish(self):
        """Drain the output, reap the process; (exit status, wall seconds, stderr tail)."""
        try:
            self.read_rows()
            self.proc.wait()
        finally:
            self.close()
        wall = time.perf_counter() - self.started
        self.errors.seek(0)
        stderr = self.errors.read().decode("utf-8", "replace").strip()
        self.errors.close()
        return self.proc.returncode, wall, stderr[-300:]


def fake_server(reply):
    """A fakes.FakeServer that keeps quiet about connections reset by the killed runner.

    socketserver prints a traceback for every handler exception; SIGKILL leaves the
    runner's idle keep-alive connections to be reset under the server's feet, which is
    expected here and not worth a traceback on the console.
    """
    server = fakes.FakeServer(reply)
    default = server._server.handle_error

    def handle_error(request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            default(request, client_address)

    server._server.handle_error = handle_error
    return server


def settled_count(server, limit=3.0):
    """The server's request count once it has been quiet for QUIET_SECONDS (at most `limit` s)."""
    deadline = time.monotonic() + limit
    count = server.count
    while time.monotonic() < deadline:
        time.sleep(QUIET_SECONDS)
        if server.count == count:
            break
        count = server.count
    return server.count


def run_argv(models, repeats, concurrency, out):
    return [sys.executable, os.path.join(ROOT, "regression.py"), "--models", *models,
            "--repeats", str(repeats), "--concurrency", str(concurrency), "--out", out]


def comparable(rows):
    return [{key: value for key, value in row.items() if key not in TIMING_FIELDS} for row in rows]


def reference_run(args, models, folder):
    """One uninterrupted n-row run: its rows, wall time and per-row time (line to line)."""
    out = os.path.join(folder, "reference.json")
    n = len(CASE_IDS) * len(models) * args.repeats
    with fake_server(fakes.advisor(delay=args.latency)) as server:
        runner = Runner(run_argv(models, args.repeats, args.concurrency, out), server.url, folder,
                        args.timeout, models)
        status, wall, stderr = runner.finish()
        count = server.count
    if runner.timed_out.is_set():
        raise MeasureError(f"uninterrupted run: no exit within {args.timeout:g} s")
    if status != 0 or len(runner.lines) != n or count != n:
        raise MeasureError(f"uninterrupted run: exit status {status}, {len(runner.lines)} row lines, "
                           f"{count} requests (expected {n}): {stderr}")
    record = regression.load_record(out)
    per_row = (runner.stamps[-1] - runner.stamps[0]) / (n - 1)
    return record["runs"], wall, per_row


def trial(args, models, plan, k, delay, folder, number, reference):
    out = os.path.join(folder, f"trial-{number}.json")
    with fake_server(fakes.advisor(delay=args.latency)) as server:  # one endpoint for both runs
        return kill_and_resume(args, models, plan, k, delay, folder, number, reference, server, out)


def kill_and_resume(args, models, plan, k, delay, folder, number, reference, server, out):
    n, problems = len(plan), []
    # 1-2: run, kill after k row lines (+ delay), count, recover.
    runner = Runner(run_argv(models, args.repeats, args.concurrency, out), server.url, folder,
                    args.timeout, models)
    reached = runner.read_rows(until=k)
    if reached:
        if delay:
            time.sleep(delay)
        runner.kill()
    status, _, stderr = runner.finish()
    before = settled_count(server)
    if runner.timed_out.is_set():
        raise MeasureError(f"trial {number}: the run to kill did not reach {k} rows within {args.timeout:g} s")
    if not reached:
        raise MeasureError(f"trial {number}: the run ended on its own (exit status {status}) after "
                           f"{len(runner.lines)} of {n} rows, before the kill at row {k}: {stderr}")
    printed = len(runner.lines)
    try:
        recovered = regression.load_record(out)
    except regression.RecordError as exc:
        return {"k": k, "r": None, "before": before, "further": None, "expected": None, "ratio": None,
                "printed": printed, "delay": delay, "problems": [f"record not recoverable: {exc}"]}
    rows = recovered.get("runs") or []
    r = len(rows)
    keys = [regression.row_key(row) for row in rows]
    if len(set(keys)) != r or not set(keys) <= set(plan):
        problems.append(f"recovered rows are not distinct rows of the plan: {keys}")
    if r < printed:
        problems.append(f"only {r} rows recovered, {printed} were printed before the kill")
    if before < r:
        problems.append(f"{r} rows recovered but the server saw only {before} requests")
    missing = collections.Counter((model, case_id) for model, case_id, _ in plan) - \
        collections.Counter((model, case_id) for model, case_id, _ in keys)

    # 3: resume against the same server, once it has gone quiet.
    argv = [sys.executable, os.path.join(ROOT, "regression.py"), "--resume", out]
    if args.concurrency > 1:  # not part of the record's config (A8), so it is not resumed with it
        argv += ["--concurrency", str(args.concurrency)]
    runner = Runner(argv, server.url, folder, args.timeout, models)
    status, wall, stderr = runner.finish()
    further = settled_count(server) - before
    bodies = [request.json or {} for request in server.requests[before:]]
    sent = collections.Counter((body.get("model"), CASE_OF_QUESTION.get(body.get("input"))) for body in bodies)
    if runner.timed_out.is_set():
        raise MeasureError(f"trial {number}: the resume did not exit within {args.timeout:g} s")
    expected = n - r
    if further != expected:
        problems.append(f"the resume sent {further} requests, expected n - r = {expected}")
    elif sent != missing:
        problems.append(f"the resume's requests were not the missing rows: sent {dict(sent - missing)} "
                        f"too many, {dict(missing - sent)} too few")
    if status != 0:
        problems.append(f"the resume exited {status}: {stderr}")
    if len(runner.lines) != expected:
        problems.append(f"the resume printed {len(runner.lines)} row lines, expected {expected}")
    try:
        final = regression.load_record(out)
    except regression.RecordError as exc:
        problems.append(f"final record unreadable: {exc}")
    else:
        summary = final.get("summary") or {}
        if final.get("recovered"):
            problems.append("the final record needed recovery (torn)")
        if summary.get("complete") is not True or summary.get("exit_code") != 0:
            problems.append(f"final summary: complete {summary.get('complete')}, exit_code {summary.get('exit_code')}")
        final_keys = [regression.row_key(row) for row in final.get("runs") or []]
        if final_keys != plan:
            first = next((i for i, (got, want) in enumerate(zip(final_keys, plan)) if got != want),
                         min(len(final_keys), n))
            problems.append(f"final rows not in plan order ({len(final_keys)} rows; first difference at {first})")
        elif comparable(final["runs"]) != comparable(reference[0]):
            which = next(i for i, (a, b) in enumerate(zip(comparable(final["runs"]), comparable(reference[0])))
                         if a != b)
            problems.append(f"final row {which} {final_keys[which]} differs from the uninterrupted run's "
                            f"beyond {', '.join(TIMING_FIELDS)}")
    _, ref_wall, ref_per_row = reference
    estimate = ref_wall - r * ref_per_row  # an uninterrupted run of the n - r remaining rows
    return {"k": k, "r": r, "before": before, "further": further, "expected": expected, "printed": printed,
            "delay": delay, "wall": wall, "ratio": wall / estimate if estimate > 0 else None,
            "problems": problems}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=common.positive_int, default=3,
                        help="kills (default 3: at 10%%, 50%%, 90%% of n; more trials at random k)")
    parser.add_argument("--models", type=common.positive_int, default=10, help="K models m1..mK (default 10)")
    parser.add_argument("--repeats", type=int, default=2, help="R, --repeats of the runner (1-10, default 2)")
    parser.add_argument("--latency", type=float, default=0.02, help="fake latency L in seconds (default 0.02)")
    parser.add_argument("--concurrency", type=int, default=1, help="--concurrency of the runner (1-64, default 1)")
    parser.add_argument("--seed", type=int, help="seed for random k and kill delays (default: random, printed)")
    parser.add_argument("--no-jitter", action="store_true", help="kill right after the k-th line, no random delay")
    parser.add_argument("--timeout", type=float, help="seconds before one run is killed (default 60 + 5 x n x L)")
    args = parser.parse_args(argv)
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats must be between 1 and 10")
    if not 1 <= args.concurrency <= 64:
        parser.error("--concurrency must be between 1 and 64")
    if not 0 <= args.latency <= 5:
        parser.error("--latency must be between 0 and 5 seconds")
    models = [f"m{i}" for i in range(1, args.models + 1)]
    plan = regression.plan_rows(models, CASE_IDS, args.repeats)
    n = len(plan)
    if n < 2:
        parser.error("need at least 2 rows to kill in between")
    args.timeout = args.timeout or 60 + 5 * n * args.latency
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10 ** 6)
    rng = random.Random(seed)
    kills = []
    for number in range(args.trials):
        if number < len(FIXED_FRACTIONS):
            k, how = max(1, min(n - 1, round(FIXED_FRACTIONS[number] * n))), f"{FIXED_FRACTIONS[number]:.0%}"
        else:
            k, how = rng.randint(1, n - 1), "random"
        kills.append((k, how, 0.0 if args.no_jitter else rng.uniform(0, 1.5 * args.latency)))

    folder = tempfile.mkdtemp(prefix="bench-resume-")
    results = []
    started = time.perf_counter()
    try:
        print(f"resume benchmark: n = {n} rows ({args.models} models x {args.repeats} repeats x {len(CASE_IDS)} "
              f"cases), latency {args.latency:g} s, --concurrency {args.concurrency}, {args.trials} trial(s), "
              f"seed {seed}{', no jitter' if args.no_jitter else ''}; python {sys.version.split()[0]}")
        warm = os.path.join(folder, "warm-up.json")
        with fake_server(fakes.advisor()) as server:  # untimed warm-up: bytecode, page cache, SDK
            status, _, stderr = Runner(run_argv(["m1"], 1, 1, warm), server.url, folder, args.timeout,
                                       ["m1"]).finish()
        if status != 0:
            raise MeasureError(f"warm-up run: exit status {status}: {stderr}")
        reference = reference_run(args, models, folder)
        print(f"uninterrupted reference run: {reference[1]:.3f} s wall, {reference[2] * 1000:.2f} ms per row "
              f"(line to line); resume ratio = resume wall / (that wall - r x per-row)")
        print()
        print(f"{'trial':>5} {'at':>6} {'k':>4} {'delay ms':>8} {'r':>4} {'before':>6} {'lost':>4} "
              f"{'further':>7} {'expected':>8} {'resume s':>8} {'ratio':>6}  verdict")
        for number, (k, how, delay) in enumerate(kills, 1):
            result = trial(args, models, plan, k, delay, folder, number, reference)
            results.append(result)
            lost = result["before"] - result["r"] if result["r"] is not None else None
            print(f"{number:5} {how:>6} {k:4} {delay * 1000:8.1f} {dash(result['r']):>4} {result['before']:6} "
                  f"{dash(lost):>4} {dash(result['further']):>7} {dash(result['expected']):>8} "
                  f"{dash(result.get('wall'), '.3f'):>8} {dash(result['ratio'], '.2f'):>6}  "
                  f"{'FAIL' if result['problems'] else 'PASS'}", flush=True)
            for problem in result["problems"]:
                print(f"        {problem}")
    except MeasureError as exc:
        print(f"resume benchmark: cannot measure: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("resume benchmark: interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print("  k = row lines read before the kill; r = rows recovered by regression.load_record (>= k);")
    print("  before = requests the server saw up to the kill; lost = before - r, requests in flight at")
    print("  the kill (paid for, not recorded: sent again, at most --concurrency); further = requests")
    print("  the resume sent; expected = n - r, the floor, which must be met exactly;")
    print("  ratio = resume wall / estimated uninterrupted run of the remaining rows (indicative only)")
    failed = sum(1 for result in results if result["problems"])
    ratios = [result["ratio"] for result in results if result["ratio"] is not None]
    print()
    print(f"goal: every resume sends exactly n - r requests (the missing rows), exits 0 with a complete "
          f"record in plan order equal to an uninterrupted run modulo timings: "
          f"{len(results) - failed}/{len(results)} trials {'PASS' if not failed else 'FAIL'}")
    if ratios:
        print(f"resume wall / uninterrupted remaining rows: median {statistics.median(ratios):.2f} "
              f"(indicative: start-up dominates short remainders)")
    print(f"(benchmark wall time {time.perf_counter() - started:.1f} s)")
    return 0


def dash(value, spec="d"):
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    raise SystemExit(main())
