"""Played-tools benchmark (issue 15): harness time per request of a 3-round case against a 1-round case.

Runs `python regression.py --suite TMP --provider openai --base-url FAKE --models m1..mK
--repeats 10 --out TMP` against a loopback fakes.FakeServer serving scripted refund agents
at latency 0 (fakes.scripted_chat), so what is measured is the harness, not a model:

    3-round   every row: lookup_order, refund_order, then the final answer (fakes.refund_correct);
              K=10 models x 10 repeats = 100 rows = 300 requests
    1-round   the same played case, answered at once (fakes.refund_claims);
              K=30 models x 10 repeats = 300 rows = 300 requests
    plain     the same case without tool_results (one request, no loop): the harness as it was;
              K=30 x 10 = 300 rows = 300 requests (reference)

Figure per workload: the steady-state harness time per request, i.e. the first to the
last request arrival on the server's clock divided by (requests - 1). Start-up and the
final summary are outside that span, and the fake answers at once, so the figure is what
the harness spends per request: building the conversation, the HTTP round trip on
loopback, parsing, scripting the results, grading and the checkpoint (one per row).
Each workload runs --reps times (default 3), interleaved; medians are reported.

Goal: 3-round per request <= 1-round per request (ratio printed; a 3-round row pays one
checkpoint for three requests, so the ratio should sit well under 1).

Usage (from the repository root):
    .venv/bin/python bench/rounds.py [--reps 3]

Exit status: 0 whenever figures were produced (PASS/FAIL is a report, not a gate);
3 when a run could not be measured (runner failed, wrong request count, timeout).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]

import common  # noqa: E402
import fakes  # noqa: E402

REPEATS = 10
EXAMPLE = os.path.join(ROOT, "suites", "agent-trajectories.json")


class MeasureError(Exception):
    """A run could not be measured."""


def suite_file(folder, played):
    """The example's shipped-order case alone, played or as one plain request."""
    with open(EXAMPLE, encoding="utf-8") as handle:
        data = json.load(handle)
    case = dict(data["cases"][0])
    if not played:
        data.pop("max_rounds")
        for key in ("tool_results", "tool_args", "claims", "contains", "behaviors"):
            case.pop(key, None)
    data["cases"] = [case]
    path = os.path.join(folder, f"suite-{'played' if played else 'plain'}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    return path


WORKLOADS = {  # name: (policy, models, played, requests per row)
    "3-round": (fakes.refund_correct, 10, True, 3),
    "1-round": (fakes.refund_claims, 30, True, 1),
    "plain": (fakes.refund_claims, 30, False, 1),
}


def run_once(name, folder, timeout):
    policy, count, played, per_row = WORKLOADS[name]
    models = [f"m{n}" for n in range(1, count + 1)]
    expected = count * REPEATS * per_row
    out = os.path.join(folder, f"record-{name}-{os.getpid()}-{len(os.listdir(folder))}.json")
    with fakes.FakeServer(fakes.scripted_chat({model: policy for model in models})) as server:
        argv = [sys.executable, os.path.join(ROOT, "regression.py"), "--suite", suite_file(folder, played),
                "--provider", "openai", "--base-url", server.url + "/v1", "--models", *models,
                "--repeats", str(REPEATS), "--out", out]
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=common.child_env(), cwd=folder, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise MeasureError(f"{name}: no exit within {timeout:g} s") from None
        arrivals, requests = sorted(server.arrivals), server.count
    os.unlink(out)
    if proc.returncode not in (0, 1) or requests != expected:
        raise MeasureError(f"{name}: exit {proc.returncode}, {requests} requests (expected {expected}): "
                           f"{proc.stderr.decode('utf-8', 'replace')[-300:]}")
    return (arrivals[-1] - arrivals[0]) / (requests - 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description="harness time per request: 3-round vs 1-round played cases")
    parser.add_argument("--reps", type=common.positive_int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    figures = {name: [] for name in WORKLOADS}
    with tempfile.TemporaryDirectory(prefix="bench-rounds-") as folder:
        try:
            for name in WORKLOADS:  # one untimed warm-up (bytecode cache, page cache)
                run_once(name, folder, args.timeout)
                break
            for _ in range(args.reps):
                for name in WORKLOADS:
                    figures[name].append(run_once(name, folder, args.timeout))
        except MeasureError as exc:
            print(f"could not measure: {exc}", file=sys.stderr)
            return 3
    medians = {name: statistics.median(values) for name, values in figures.items()}
    for name, (_, count, _, per_row) in WORKLOADS.items():
        print(f"{name:<8} {count * REPEATS:>4} rows x {per_row} request(s): "
              f"{medians[name] * 1000:.2f} ms per request (median of {args.reps}; "
              f"runs: {', '.join(f'{value * 1000:.2f}' for value in figures[name])})")
    ratio = medians["3-round"] / medians["1-round"]
    print(f"ratio 3-round / 1-round per request: {ratio:.2f} (goal <= 1.00) -> {'PASS' if ratio <= 1.0 else 'FAIL'}")
    print(f"ratio 1-round played / plain one request: {medians['1-round'] / medians['plain']:.2f} (reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
