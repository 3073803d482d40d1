"""Checkpoint benchmark (SPEC C1): per-row harness time must not grow with the run's size.

Runs `python regression.py --models m1 ... mK --repeats R --out TMP` against a loopback
fakes.FakeServer (latency 0, ~30 KB Agent API responses) at a small and a large size and
compares the per-row time. rows = 4 cases x K models x R repeats.

Per-row time is read from the runner's console: every row prints one line as it
finishes, so (time of the last row line - time of the first) / (rows - 1) is the
harness's per-row cost with start-up, the first request and the final summary left out.
Each size is run --reps times, interleaved small/large, and the median is reported.

Floors and diagnostics, all measured in the same run:
  - the ratio large/small is the figure the goal is about (it is its own floor);
  - the disk floor: one 30 KB pwrite + fsync on the same file system, per-row time
    is also shown as a multiple of it;
  - the split of each row between its `seconds` field (request + grading) and the rest
    (checkpoint, summary, console line);
  - the fake server's share: CPU time of this process (the server's threads) per row;
  - growth inside the large run: mean gap of its last tenth of rows over its first tenth.

Goals: the issue asks for 2,000 rows within 1.2x of 200 rows (default sizes); SPEC C1
asks for 4,000 within 1.2x of 400 (--spec). --quick runs 40 vs 400 rows once.

Usage (from the repository root):
    .venv/bin/python bench/checkpoint.py [--quick | --spec] [--reps 3] [--body-kb 30]

Exit status: 0 whenever figures were produced (PASS/FAIL is a report, not a gate);
3 when a run could not be measured (runner failed, a row was not PASS, timeout); 2 usage.
"""

import argparse
import json
import os
import re
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

GOAL_RATIO = 1.2
TIME_BIN = "/usr/bin/time"  # GNU time: the runner's own peak RSS (os.wait4 would include ours)
CASE_IDS = [case["id"] for case in fakes.regression.CASES]
SECONDS_FIELD = re.compile(r"(?<![\w.])(\d+\.\d+)s\b")  # the row's `seconds`: first "N.NNNs"
SAVE_FIELD = re.compile(r"\(\+(\d+\.\d+)s save\)")  # the checkpoint time, when the line shows it (A8)


class MeasureError(Exception):
    """A run could not be measured: the harness reports it and stops."""


# ====================================================================== set-up

def padding_for(body_bytes):
    """The snippet padding that makes every built-in case's response about body_bytes long."""
    base = max(len(json.dumps(fakes.advisor_answer(case))) for case in fakes.regression.CASES)
    padding = max(0, body_bytes - base)
    sizes = [len(json.dumps(fakes.advisor_answer(case, padding=padding))) for case in fakes.regression.CASES]
    return padding, sizes


# ====================================================================== one run

class Size:
    def __init__(self, name, models, repeats):
        self.name, self.models, self.repeats = name, models, repeats
        self.rows = len(CASE_IDS) * models * repeats

    def __str__(self):
        return f"{self.rows} rows (K={self.models} models x R={self.repeats} repeats x {len(CASE_IDS)} cases)"


def run_once(size, padding, folder, timeout):
    """One runner process against a fresh fake server; per-row figures from its console."""
    models = [f"m{n}" for n in range(1, size.models + 1)]
    out = os.path.join(folder, f"record-{size.name}-{time.monotonic_ns()}.json")
    argv = [sys.executable, os.path.join(ROOT, "regression.py"), "--models", *models,
            "--repeats", str(size.repeats), "--out", out]
    model_set, case_set = set(models), set(CASE_IDS)
    stamps, seconds, saves, cpu, failed = [], [], [], [], []
    rss_file = out + ".rss"
    if os.access(TIME_BIN, os.X_OK):
        argv = [TIME_BIN, "-f", "%M", "-o", rss_file, *argv]
    with fakes.FakeServer(fakes.advisor(padding=padding)) as server, tempfile.TemporaryFile() as errors:
        # A session of its own (common.Child), so a timeout kills the runner even under GNU time.
        with common.Child(argv, common.child_env(server.url), folder, timeout, errors) as child:
            proc, timed_out = child.proc, child.timed_out
            for line in proc.stdout:  # one line per finished row, flushed as it happens
                now, now_cpu = time.perf_counter(), time.process_time()
                row = common.row_line(line, model_set, case_set)
                if row is None:
                    continue  # the summary JSON, or anything else that is not a row line
                text, words = row
                stamps.append(now)
                cpu.append(now_cpu)
                match = SECONDS_FIELD.search(text)
                seconds.append(float(match.group(1)) if match else None)
                match = SAVE_FIELD.search(text)
                saves.append(float(match.group(1)) if match else None)
                if "PASS" not in words:
                    failed.append(text)
            proc.wait()
        errors.seek(0)
        stderr = errors.read().decode("utf-8", "replace").strip()
        requests = server.count
    broken = timed_out.is_set() or proc.returncode != 0 or failed or len(stamps) != size.rows
    cause = first_error(out) if broken else None
    peak_mb = read_peak_mb(rss_file)
    for path in (out, rss_file):
        try:
            os.unlink(path)  # records are rows x 30 KB: do not let them pile up
        except OSError:
            pass
    if timed_out.is_set():
        raise MeasureError(f"{size}: no exit within {timeout:g} s ({len(stamps)} row lines seen)")
    if proc.returncode != 0 or failed or len(stamps) != size.rows:
        detail = (failed[0] + (f" ({cause})" if cause else "")) if failed else stderr[-300:]
        raise MeasureError(f"{size}: exit status {proc.returncode}, {len(stamps)} row lines "
                           f"({len(failed)} not PASS), {requests} requests: {detail}")
    return dict(analyse(stamps, seconds, saves, cpu), peak_mb=peak_mb)


def read_peak_mb(path):
    """The runner's peak RSS in MB from GNU time's output file, or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().strip().splitlines()
    except OSError:
        return None
    return int(lines[-1]) / 1024 if lines and lines[-1].isdigit() else None


def first_error(path):
    """The first recorded error message of a broken run's record, for the report."""
    try:
        with open(path, encoding="utf-8") as handle:
            rows = json.load(handle).get("runs") or []
    except (OSError, ValueError, AttributeError):
        return None
    for row in rows:
        if isinstance(row, dict) and (row.get("error") or row.get("reasons")):
            return f"{row.get('error')}: {row.get('error_message') or row.get('reasons')}"
    return None


def analyse(stamps, seconds, saves, cpu):
    rows = len(stamps)
    window = stamps[-1] - stamps[0]
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    tenth = max(1, len(gaps) // 10)
    in_row = [value for value in seconds[1:] if value is not None]
    saved = [value for value in saves[1:] if value is not None]
    return {
        "per_row": window / (rows - 1),
        "median_gap": statistics.median(gaps),
        "growth": (sum(gaps[-tenth:]) / tenth) / (sum(gaps[:tenth]) / tenth) if sum(gaps[:tenth]) else float("nan"),
        # rows 2..N: the same rows the window covers (the first row's line opens the window)
        "in_row": sum(in_row) / len(in_row) if len(in_row) == rows - 1 else None,
        "save": sum(saved) / len(saved) if len(saved) == rows - 1 else None,
        "server_cpu": (cpu[-1] - cpu[0]) / (rows - 1),
    }


# ====================================================================== report

def ms(value):
    return "-" if value is None else f"{value * 1000:.3f}"


def goal_label(small, large):
    if (small.rows, large.rows) == (200, 2000):
        return "issue: 2,000 rows within 1.2x of 200 rows"
    if (small.rows, large.rows) == (400, 4000):
        return "SPEC C1: 4,000 rows within 1.2x of 400 rows"
    return (f"{large.rows} rows within 1.2x of {small.rows} (the goals are stated for 200/2,000 "
            f"and 400/4,000 rows; this is a sanity run)")


def summarise(results):
    def median_of(key):
        values = [result[key] for result in results if result[key] is not None]
        return statistics.median(values) if values else None
    return {key: median_of(key) for key in results[0]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="sanity run: 40 vs 400 rows, one repetition")
    sizes.add_argument("--spec", action="store_true", help="SPEC C1 sizes: 400 vs 4,000 rows (K=10 vs K=100)")
    parser.add_argument("--reps", type=int, help="repetitions of each size (default 3; 1 with --quick)")
    parser.add_argument("--repeats", type=int, default=10, help="R, --repeats of the runner (1-10, default 10)")
    parser.add_argument("--body-kb", type=float, default=30.0, help="response body size in KB (default 30)")
    parser.add_argument("--timeout", type=float, help="seconds before one run is killed (default 30 + 50 ms/row)")
    args = parser.parse_args(argv)
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats must be between 1 and 10")
    reps = args.reps if args.reps is not None else 1 if args.quick else 3
    if reps < 1:
        parser.error("--reps must be at least 1")
    if args.quick:
        small_k, large_k = 1, 10
    elif args.spec:
        small_k, large_k = 10, 100
    else:
        small_k, large_k = 5, 50
    small, large = Size("small", small_k, args.repeats), Size("large", large_k, args.repeats)
    if small.rows < 2:
        parser.error("the small size needs at least 2 rows")
    padding, body_sizes = padding_for(int(args.body_kb * 1000))

    folder = tempfile.mkdtemp(prefix="bench-checkpoint-")
    results = {"small": [], "large": []}
    started = time.perf_counter()
    try:
        floor = common.disk_floor(folder, max(body_sizes), count=50, statistic=statistics.median)
        print(f"checkpoint benchmark: latency 0, response bodies {min(body_sizes)}-{max(body_sizes)} bytes "
              f"(padding {padding}), {reps} repetition(s) per size, python {sys.version.split()[0]}")
        print(f"  small: {small}\n  large: {large}")
        print(f"disk floor (one {max(body_sizes)}-byte pwrite + fsync in {folder}, median of 50): "
              f"{ms(floor)} ms")
        for rep in range(1, reps + 1):
            for size in (small, large):  # interleaved, so load drift hits both sizes
                timeout = args.timeout or 30 + 0.05 * size.rows
                result = run_once(size, padding, folder, timeout)
                results[size.name].append(result)
                print(f"  rep {rep} {size.name:5} {size.rows:5} rows: {ms(result['per_row'])} ms/row "
                      f"(median gap {ms(result['median_gap'])} ms, last/first tenth {result['growth']:.2f})",
                      flush=True)
    except MeasureError as exc:
        print(f"checkpoint benchmark: cannot measure: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("checkpoint benchmark: interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    medians = {name: summarise(values) for name, values in results.items()}
    print()
    print(f"medians of {reps} run(s), per row in ms:")
    print(f"{'size':6} {'rows':>5} {'per-row':>8} {'x disk':>7} {'in-row':>8} {'save':>7} {'outside':>8} "
          f"{'server':>8} {'server%':>7} {'growth':>6} {'peak MB':>8}")
    for size in (small, large):
        m = medians[size.name]
        outside = m["per_row"] - m["in_row"] if m["in_row"] is not None else None
        print(f"{size.name:6} {size.rows:5} {ms(m['per_row']):>8} {m['per_row'] / floor:7.1f} "
              f"{ms(m['in_row']):>8} {ms(m['save']):>7} {ms(outside):>8} {ms(m['server_cpu']):>8} "
              f"{100 * m['server_cpu'] / m['per_row']:6.0f}% {m['growth']:6.2f} "
              f"{'-' if m['peak_mb'] is None else format(m['peak_mb'], '.1f'):>8}")
    print("  per-row = (last row line - first row line) / (rows - 1); x disk = per-row / disk floor;")
    print("  in-row = mean of the rows' `seconds` (request + grading); save = mean of the runner's own")
    print("  '(+N s save)' checkpoint time, if its lines show it -- both printed to 1 ms, so only indicative")
    print("  at this scale; outside = per-row - in-row (checkpoint, summary, console, everything else);")
    print("  server = CPU time of the fake server's process per row;")
    print("  growth = mean gap of the last tenth of rows / the first tenth (1.0 = flat within a run);")
    print("  peak MB = the runner's peak RSS (GNU time), a sign of state kept per row")
    ratio = medians["large"]["per_row"] / medians["small"]["per_row"]
    print()
    print(f"ratio large/small per-row: {ratio:.3f}  goal <= {GOAL_RATIO} ({goal_label(small, large)}): "
          f"{'PASS' if ratio <= GOAL_RATIO else 'FAIL'}")
    print(f"(benchmark wall time {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
