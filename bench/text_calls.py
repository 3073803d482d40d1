"""Calls written as text: reading a long hostile answer stays linear.

Times regression.text_tool_calls on answers of 1 MB and 2 MB built to make each reader work
hardest (unclosed call objects, Python dicts, a tool's name before a brace or a paren over and
over, unclosed <parameter> tags, commas before a last brace), against a floor measured in the
same run: text_form() of the same answer, the one pass every check pays. Each figure is the
median of --runs runs, the caches cleared before each.

Goal: linear: for every answer, 2 MB takes at most 2.6x the time of 1 MB (the ratio printed),
and 1 MB reads within one second.

Usage (from the repository root):
    .venv/bin/python bench/text_calls.py [--runs 5]

Exit status: 0 whenever figures were produced (PASS/FAIL is a report, not a gate); 3 when a
reading found a call in an answer that holds none (the measurement would be of another path).
"""

import argparse
import os
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(BENCH), BENCH]

import common  # noqa: E402
import regression  # noqa: E402

TOOLS = {"lookup_order": {"order_id"}, "cancel_order": {"order_id"}, "ping": None}
UNITS = {  # a unit repeated to the size: each defeats one reader's early exit
    "unclosed objects": '{"name": ',
    "python dicts": "{'name': '",
    "escaped quotes": "'\\",
    "name before a brace": "cancel_order {",
    "name before a key": 'cancel_order {"order_id": ',
    "name before a paren": 'cancel_order("',
    "parameter tags": 'cancel_order <parameter name="a">',
    "function tags": "<function=other><parameter=a>",
    "no-parameter tool": "ping {",
    "commas, then a brace": ", ",
}
TAILS = {"commas, then a brace": "cancel_order {"}  # what makes the whole answer read loosely
GOAL_RATIO, GOAL_SECONDS = 2.6, 1.0


def answer(kind, size):
    unit = UNITS[kind]
    return unit * (size // len(unit)) + TAILS.get(kind, "")


def median_seconds(function, text, runs):
    """The median wall time of function(text) over `runs` runs, every cache cleared first."""
    times = []
    for _ in range(runs):
        for cached in (regression.text_form, regression._loose_text, regression.name_keys):
            cached.cache_clear()
        start = time.perf_counter()
        found = function(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times), found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=common.positive_int, default=5)
    parser.add_argument("--size", type=common.positive_int, default=1_000_000,
                        help="the smaller answer's characters (the larger is twice it)")
    args = parser.parse_args(argv)
    failed = False
    print(f"{'answer':22} {'1x s':>7} {'2x s':>7} {'2x/1x':>6} {'floor s':>8} {'1x/floor':>9}")
    for kind in UNITS:
        small, large = answer(kind, args.size), answer(kind, 2 * args.size)
        read = lambda text: regression.text_tool_calls(text, TOOLS)  # noqa: E731
        (one, found), (two, _) = median_seconds(read, small, args.runs), \
            median_seconds(read, large, args.runs)
        floor, _ = median_seconds(regression.text_form, small, args.runs)
        if found:
            print(f"{kind}: a call was found in an answer that holds none: {found[:1]}")
            return 3
        ok = two <= GOAL_RATIO * one and one <= GOAL_SECONDS
        failed |= not ok
        print(f"{kind:22} {one:7.3f} {two:7.3f} {two / one:6.2f} {floor:8.4f} "
              f"{one / floor:9.1f}  {'PASS' if ok else 'FAIL'}")
    print(f"goal: 2x/1x <= {GOAL_RATIO} and 1x <= {GOAL_SECONDS} s: "
          + ("FAIL" if failed else "PASS"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
