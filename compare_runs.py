"""Compare two saved agent-regression records and show which approved decision changed.

Usage:
    python compare_runs.py BEFORE.json AFTER.json
    python compare_runs.py BEFORE.json AFTER.json --alpha 0.05 --html diff.html
    python compare_runs.py --models A B RUN.json   # within one run: is model B a drop-in for A?
    python compare_runs.py --matrix BEFORE.json AFTER.json   # every (case, behaviour): same /
    REGRESS / GAIN
    python compare_runs.py --matrix --models A B RUN.json
    python compare_runs.py --demo NEW_DIR          # offline: two synthetic runs, no key
    python compare_runs.py --repeats-needed 0.95 0.8   # repeats per side to see that drop
    python compare_runs.py --trend RUN1 RUN2 RUN3 --html trend.html   # rates across runs

The two records must come from the same configuration (models, cases, tools,
response format, repeats, limits); only the instructions (and the cases' pins of
them) may differ, and a record and its replay may also differ in the cases' checks
(REGRADE). Each row key (model, case, repeat) has a label:
    NEW_FAILURE    passed before, fails now
    RECOVERED      failed before, passes now
    PASS           passes in both
    STILL_FAILING  fails in both
The rows that changed get one line each; unchanged rows are counted per label
(--all lists every row). Then, per model and case, the reasons that occurred more
often (REGRESS) or less often (GAIN), each model's pass rate with its Wilson 95%
interval and pass^k, pass rates over repeats with FLAKY and a one-sided Fisher exact p
for a drop (with --alpha also adjusted for the family of pairs, Holm-Bonferroni unless
--correction none), and a diff of each answer whose verdict changed.

Exit codes:
    0  comparable, no new failure
    1  comparable, at least one NEW_FAILURE (with --alpha: a drop with adjusted p <= alpha;
       with --matrix: a REGRESS; with --trend: a run's significant drop against the first)
    2  not comparable (missing file, bad JSON, different config, incomplete run, ...)
"""

import argparse
import collections
import difflib
import fractions
import functools
import json
import math
import os
import re
import sys

from regression import (ABSENT, BEHAVIORS, CASES, CHECK_KEYS, CHECK_TABLE, INSTRUCTIONS, RANGES,
                        as_recorded,
                        rule_turn, turn_parts, turn_rule,
                        RecordError, Trace, UsageError, check, compile_case, dumps,
                        first_difference, grade, html_page, html_table, instructions_sha256,
                        junit_name, junit_xml, key_text, load_record, masked_evidence, md_table,
                        md_text, plan_rows, rate_text, record_problem, record_provider,
                        graded_now, regraded_rows, row_key, safe_text, same_json, summary,
                        tool_sequence, wilson_interval, write_new_file, xml_text,
                        new_file_problem)
from regression import program_name  # a printed command names the program as the user started it


# ====================================================================== records

def _require(condition, message):
    if not condition:
        raise ValueError(message)


def index(record):
    """Rows of a complete, error-free record by (model, case_id, repeat); ValueError otherwise.

    The shape and types are regression.record_problem's (the one record validator); what is
    added here is what a comparison needs: every planned row, once, without an error."""
    problem = record_problem(record)
    _require(problem is None, f"not a usable record: {problem}")
    config, runs = record["config"], record["runs"]
    models, cases, repeats = config["models"], config["cases"], config["repeats"]
    case_ids = [case["id"] for case in cases]
    expected_count = len(models) * len(cases) * repeats
    # never expand an absurd plan in memory
    _require(expected_count == len(runs) or expected_count <= 100_000,
             f"the run is incomplete: {len(runs)} rows for {expected_count} expected")
    rows = {}
    for position, row in enumerate(runs):
        key = row_key(row)
        _require(key not in rows, f"duplicate row {_name(key)}")
        _require(row.get("error") is None, f"row {_name(key)} has an execution error "
                 f"({row.get('error')}{': ' * bool(row.get('error_message'))}"
                 f"{str(row.get('error_message') or '')[:500]})")
        reasons = row.get("reasons")
        _require(isinstance(reasons, list) and all(isinstance(reason, str) for reason in reasons),
                 f"row {_name(key)}: reasons is not a list of strings")
        _require(row.get("passed") is (not reasons),
                 f"row {_name(key)}: passed disagrees with reasons")
        rows[key] = row
    expected = set(plan_rows(models, case_ids, repeats))
    extra = [key for key in rows if key not in expected]
    _require(not extra, f"row {_name(extra[0])} is not in models x cases x repeats" if extra
             else "")
    missing = [key for key in plan_rows(models, case_ids, repeats) if key not in rows]
    shard = f"; it is shard {record['shard']} of a run: join its shards first " \
        f"({program_name()} --merge OUT.json SHARD.json ...)" if record.get("shard") else ""
    _require(not missing, f"the run is incomplete: {len(missing)} of {len(expected)} rows missing"
             f" (first: {_name(missing[0])}){shard}" if missing else "")
    return rows


_name = key_text  # the one spelling of a row key in messages
SIDES = ("before", "after")  # what a message calls the two records when no file names are given


def rows_of(record, name):
    """index(record) with each failing row's verdicts (see with_verdicts), its ValueError naming
    the record (the file, or a side) it is about."""
    try:
        return with_verdicts(record, index(record))
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


# Each failing row holds the verdict of each rule it failed ({"forbid_tool:cancel_order":
# ["forbidden_tool_called"], ...}): two entries of one behaviour give the same reason, so the
# reasons alone cannot say which entry failed. A row graded before verdicts were kept gets them
# from its reasons when only one rule of its case can give each; otherwise they are graded again
# from its stored response (offline), and kept only when that gives the very reasons stored.

def _attributed(case, row):
    """An older row's verdicts read from its reasons (a reason no rule of the case gives stands
    as its own rule), or None when several entries of one behaviour could have given a reason."""
    rules = dict(case_rules(case))
    verdicts = {}
    for reason in row["reasons"]:
        givers = [rule for rule, check in rules.items() if _explains(check, reason)]
        if len({rules[rule].name for rule in givers}) < len(givers):
            return None
        for rule in givers or [reason]:
            verdicts[rule] = list(dict.fromkeys(verdicts.get(rule, []) + [reason]))
    return verdicts


def with_verdicts(record, rows):
    """{key: row} of a record's rows (see index), each failing row with its verdicts: stored, read
    from its reasons (_attributed) or graded again; a row none of these can tell is left without."""
    cases = {case["id"]: case for case in record["config"]["cases"]}
    filled, unknown = dict(rows), []
    for key, row in rows.items():
        if not row["passed"] and "verdicts" not in row:
            verdicts = _attributed(cases[key[1]], row)
            filled[key] = {**row, "verdicts": verdicts} if verdicts is not None else row
            unknown += [row] if verdicts is None else []
    if unknown and masked_evidence(record) is None:  # masked text may grade otherwise: no regrade
        try:
            regraded = regraded_rows(record, unknown)
        except UsageError:
            regraded = []  # the record's suite no longer loads: its rows stay without verdicts
        for row, again in regraded:
            if again["reasons"] == row["reasons"] and again.get("verdicts"):
                filled[row_key(row)] = {**row, "verdicts": again["verdicts"]}
    return filled


# ====================================================================== comparison

LABELS = {(True, False): "NEW_FAILURE", (False, True): "RECOVERED",
          (True, True): "PASS", (False, False): "STILL_FAILING"}


# a pin follows the instructions; notes are for people
IGNORED_CASE_KEYS = ("instructions_sha256", "notes")


def _config_view(config, without_checks=False, without_results=False):
    """The part of a config two comparable records share: all but the instructions and
    the cases' pins and notes (and, for a regrade, the cases' check keys and sources; for a
    regrade by a replay made with --allow-changed-tool-results, which sent no tool result of
    its suite's, their tool_results too). The config is record_problem's: its cases a list of
    objects."""
    view = {key: value for key, value in config.items()
            if key != "instructions" and not (without_checks and key == "sources")}
    dropped = IGNORED_CASE_KEYS + (tuple(CHECK_KEYS) if without_checks else ()) + (
        ("tool_results",) if without_results else ())
    view["cases"] = [{key: value for key, value in case.items() if key not in dropped}
                     for case in view["cases"]]
    for case in view["cases"] if without_checks else ():  # a turn's checks too; its words stay
        if isinstance(case.get("turns"), list):
            case["turns"] = [turn.get("user") if isinstance(turn, dict) else turn
                             for turn in case["turns"]]
    return view


SHORT = 60


def _visible(text):
    """Text with every non-printable character shown as an escape (no terminal tricks)."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def shorten(value, other=ABSENT):
    """A value as short JSON for a one-line message; a long string is shown around the first
    character where it differs from `other`."""
    if value is ABSENT:
        return "(absent)"
    if isinstance(value, str) and isinstance(other, str) and len(value) > SHORT:
        start = next((n for n, (a, b) in enumerate(zip(value, other)) if a != b),
                     min(len(value), len(other)))
        start = max(0, start - 20)
        piece = value[start:start + SHORT - 10]
        text = ("..." if start else "") + json.dumps(piece, ensure_ascii=False)[:-1] + \
            ('..."' if start + len(piece) < len(value) else '"')
        return _visible(text)
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    text = _visible(text)
    return text if len(text) <= SHORT else text[:SHORT - 3] + "..."


def shown_pair(old, new):
    """Both sides shortened; where they first differ in a non-ASCII character (NFC against NFD,
    a Cyrillic letter for a Latin one) both are shown as code points, or they would read alike."""
    texts = shorten(old, new), shorten(new, old)
    first = next((n for n, (a, b) in enumerate(zip(*texts)) if a != b), min(map(len, texts)))
    if any(not text[first:first + 1].isascii() for text in texts):
        texts = tuple(text.encode("ascii", "backslashreplace").decode("ascii") for text in texts)
    return texts


def _replayed(record, other):
    """Does `record` name `other` as the record it replayed (replayed_from)?"""
    source = record.get("replayed_from")
    return isinstance(source, dict) and source.get("created_at") is not None and \
        source.get("created_at") == other.get("created_at")


def regrade_hint():
    """How to make two records of different checks comparable (BEFORE.json, SUITE: the user's)."""
    return (f"the checks differ: regrade the earlier record with the new suite ({program_name()} "
            "--provider replay --replay BEFORE.json --suite SUITE --out REGRADED.json) and compare "
            "BEFORE.json with REGRADED.json")


def _comparable(before, after, names=SIDES):
    """Raise ValueError (naming the first difference) unless the two records may be compared.

    Returns None for an ordinary comparison, or for a record and its replay whose cases
    differ only in their checks, the ids of the cases whose checks changed (a REGRADE)."""
    for side, record in zip(names, (before, after)):
        problem = record_problem(record, evidence=False)  # index() asks for the verdicts' evidence
        _require(problem is None, f"{side} is not a usable record: {problem}")
    labels = (before.get("evidence", "live"), after.get("evidence", "live"))
    replay_pair = _replayed(after, before) or _replayed(before, after)
    sent = _replayed(after, before) and as_recorded(after) or \
        _replayed(before, after) and as_recorded(before)  # the stored results, not the suite's
    try:
        difference = first_difference(_config_view(before["config"]), _config_view(after["config"]))
        blocking = difference and first_difference(_config_view(before["config"], True, sent),
                                                   _config_view(after["config"], True, sent))
    except RecursionError:
        raise ValueError("the configs are nested too deeply to compare") from None
    # a replay with the same checks regrades with the current checker
    regrade = replay_pair and not blocking
    if difference is not None and not regrade:
        # For a record and its replay, name what keeps them apart (an input, not a check).
        path, old, new = blocking if replay_pair and blocking else difference
        why = f"; {regrade_hint()}" if blocking is None else " (only the instructions may differ)"
        raise ValueError(f"{path} differs: {' -> '.join(shown_pair(old, new))}{why}")
    _require(labels[0] == labels[1], f"evidence differs: {labels[0]} vs {labels[1]}")
    if not regrade:
        return None
    _same_evidence(before, after, names)

    old_cases = {case["id"]: case for case in _config_view(before["config"])["cases"]}
    return [case["id"] for case in _config_view(after["config"])["cases"]
            if not same_json(old_cases.get(case["id"], ABSENT), case)] + \
        (["(sources)"]
         if not same_json(before["config"].get("sources"), after["config"].get("sources")) else [])


def _same_evidence(before, after, names=SIDES):
    """A regrade claims the same evidence graded by other checks: the same instructions and,
    row by row, the same stored responses (every round of a played row). Otherwise the
    "after" side answered something else, and a regrade would call that no change."""
    _require(before["config"].get("instructions") == after["config"].get("instructions"),
             "config.instructions differs: a replay re-grades the stored responses and cannot "
             "test an instruction change; run the new instructions live and compare those records")
    rows_before, rows_after = rows_of(before, names[0]), rows_of(after, names[1])
    for key, row in rows_before.items():
        other = rows_after.get(key) or {}
        _require(all(same_json(row.get(field), other.get(field))  # a turn's rounds too
                     for field in ("response", "rounds", "turns")),
                 f"a replay must keep the stored responses, but {_name(key)} differs")


def fisher_drop(passed_before, runs_before, passed_after, runs_after):
    """One-sided Fisher exact p-value that the pass rate dropped, computed exactly with integers.

    It is the chance, with the total passes fixed, that the 'before' side holds at least
    as many passes as it did if both sides had the same underlying pass rate.
    """
    return float(fisher_drop_exact(passed_before, runs_before, passed_after, runs_after))


def fisher_drop_exact(passed_before, runs_before, passed_after, runs_after):
    """fisher_drop as an exact fraction: a decision at p == alpha is never a rounding accident."""
    total, passes = runs_before + runs_after, passed_before + passed_after
    fails, x = total - passes, passed_before
    term = math.comb(passes, x) * math.comb(fails, runs_before - x)
    tail = 0
    while term:  # each next term from the last, exactly: one comb per tail, not two per term
        tail += term
        term = term * (passes - x) * (runs_before - x) // ((x + 1) * (fails - runs_before + x + 1))
        x += 1
    return fractions.Fraction(tail, math.comb(total, runs_before))


# ====================================================================== statistics
# Every (model, case) pair is its own test, so at alpha 0.05 a suite of 50 unchanged cases
# would show a "significant drop" by chance in most runs. Holm-Bonferroni keeps the chance of
# any false alarm in the whole family at alpha and rejects whatever Bonferroni rejects.

CORRECTIONS = {"holm": "Holm-Bonferroni", "none": "no correction"}


def holm(p_values):
    """Holm-Bonferroni adjusted p-values, in input order: the k-th smallest of m times
    (m - k + 1), never below the one before it, at most 1."""
    order = sorted(range(len(p_values)), key=lambda n: p_values[n])
    adjusted, running = list(p_values), 0
    for rank, n in enumerate(order):
        running = max(running, min(1, (len(p_values) - rank) * p_values[n]))
        adjusted[n] = running
    return adjusted


def exact_alpha(alpha):
    """alpha as the decimal the user wrote (0.05 is 1/20, not the float just above it)."""
    return fractions.Fraction(repr(float(alpha)))


def _counts(group):
    return group["passed_before"], group["runs_before"], group["passed_after"], group["runs_after"]


def decide(groups, alpha, correction):
    """Set each group's adjusted p ("p_adjusted"); return the groups that dropped significantly.
    Exact fractions decide: p = 0.05 at alpha 0.05 is a drop, as the test's level says."""
    exact = [fisher_drop_exact(*_counts(g)) for g in groups]
    adjusted = holm(exact) if correction == "holm" else exact
    for group, value in zip(groups, adjusted):
        group["p_adjusted"] = float(value)
    limit = exact_alpha(alpha)
    return [g for g, value in zip(groups, adjusted) if g["dropped"] and value <= limit]


def model_rates(groups):
    """Per model, in first-seen order: passes over every case and repeat on each side, and
    pass^k (the cases whose every repeat passed) on each side."""
    models = {}
    for g in groups:
        stats = models.setdefault(g["model"], dict.fromkeys(
            ("passed_before", "runs_before", "passed_after", "runs_after", "cases", "all_before",
             "all_after", "k"), 0))
        stats["model"] = g["model"]
        for field in ("passed_before", "runs_before", "passed_after", "runs_after"):
            stats[field] += g[field]
        stats["cases"] += 1
        stats["all_before"] += g["passed_before"] == g["runs_before"]
        stats["all_after"] += g["passed_after"] == g["runs_after"]
        stats["k"] = max(stats["k"], g["runs_before"])
    return list(models.values())


def correction_words(result):
    """Which correction a comparison's verdict used, in words, or "" without --alpha."""
    if result.get("correction") is None:
        return ""
    pairs = _plural(len(result["groups"]), "model/case pair")
    return (f"Holm-Bonferroni correction over {pairs}" if result["correction"] == "holm"
            else f"uncorrected over {pairs}: --correction none")


def _rates_text(before, runs_before, after, runs_after):
    return f"{rate_text(before, runs_before)} -> {rate_text(after, runs_after)}"


def _holm(result):
    return result.get("correction") == "holm"


def _p_text(group, result):
    """The raw p of a pair, and its adjusted p when a correction decided the verdict."""
    adjusted = f"  adjusted p={group['p_adjusted']:.4f}" if _holm(result) else ""
    return f"p={group['p']:.4f}{adjusted}"


def model_lines(result):
    """The console's per-model block: rates with intervals and pass^k on both sides, aligned."""
    return ["", "by model (passes over every case and repeat with Wilson 95% intervals; pass^k: "
                "the cases whose every repeat passed):",
            *aligned([["MODEL".ljust(13), safe_text(cells[0]), *filter(None, cells[1:])]
                      for cells in model_cells(result)])]


def low_repeats_note(result):
    """With --alpha, when no drop can be significant at these repeats: say so and how to plan."""
    repeats, alpha = result["repeats"], result["alpha"]
    smallest = fractions.Fraction(1, math.comb(2 * repeats, repeats) if repeats else 1)
    family = len(result["groups"]) if _holm(result) else 1
    if smallest * family <= exact_alpha(alpha):
        return []
    first = f"{float(alpha) / family:.3g}"
    plan = f"to plan repeats: python compare_runs.py --repeats-needed BEFORE AFTER --alpha {first}"
    start = f"note: with {repeats} repeat(s) per side no drop can reach"
    if family == 1:
        return [f"{start} p <= {alpha} (the smallest possible p is {float(smallest):.4f}); {plan}"]
    return [f"{start} adjusted p <= {alpha} over {family:,} pairs (the smallest possible p is "
            f"{float(smallest):.4f}; Holm needs p <= {first} for the first); {plan}"]


def _answer_diff(old, new):
    a, b = old.get("answer_text"), new.get("answer_text")
    if a == b or not isinstance(a, str) or not isinstance(b, str):
        return None
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "before", "after",
                                          lineterm=""))


def _shared(rows):
    """The reasons two or more rules give in these rows (from their verdicts): forbidden_tool_called
    of forbid_tool:cancel_order and of forbid_tool:refund_order."""
    rules = collections.defaultdict(set)
    for row in rows:
        for rule, reasons in (row.get("verdicts") or {}).items():
            for reason in reasons:
                rules[reason].add(rule)
    return {reason for reason, given in rules.items() if len(given) > 1}


def _failures(row, shared):
    """What a row failed, as counted per side: each reason, named with its rule where several
    rules give it (reason[rule]); a row without verdicts (see analyse): its reasons."""
    if "verdicts" not in row:
        return row["reasons"]
    return [f"{reason}[{rule}]" if reason in shared or rule_turn(rule) else reason  # which turn
            for rule, reasons in row["verdicts"].items() for reason in reasons]


def analyse(pairs, alpha=None, correction="holm"):
    """The comparison of paired rows [(key, old, new)]: labels, per-check changes, pass rates and
    diffs. A reason two rules give is counted per rule where each failing row holds its verdicts
    (see with_verdicts); a model/case pair with a row that does not is counted by reason. With
    alpha, a (model, case) pair is a significant drop when its rate dropped and its p, adjusted
    for the whole family of pairs (correction "holm", or "none"), is at most alpha."""
    rows, groups = [], {}
    for key, old, new in pairs:
        label = LABELS[(old["passed"], new["passed"])]
        rows.append({"key": key, "label": label, "before": old["reasons"], "after": new["reasons"],
                     "diff": _answer_diff(old, new), "seconds": new.get("seconds"),
                     "tools_before": tool_sequence(old), "tools_after": tool_sequence(new)})
        group = groups.setdefault(key[:2], {"model": key[0], "case": key[1], "old": [], "new": []})
        group["old"].append(old)
        group["new"].append(new)
    for group in groups.values():
        old, new = group.pop("old"), group.pop("new")
        # How often each reason occurred on each side: 2/3 -> 0/3 with the same reason is a drop.
        by_entry = all(row["passed"] or "verdicts" in row for row in old + new)
        shared = _shared(old + new) if by_entry else set()
        before = collections.Counter(reason for row in old for reason in _failures(row, shared))
        after = collections.Counter(reason for row in new for reason in _failures(row, shared))
        group.update(by_reason=not by_entry,
            regress=sorted(reason for reason in after if after[reason] > before[reason]),
            gain=sorted(reason for reason in before if before[reason] > after[reason]),
            counts={reason: (before[reason], after[reason]) for reason in set(before) | set(after)},
            passed_before=sum(row["passed"] for row in old), runs_before=len(old),
            passed_after=sum(row["passed"] for row in new), runs_after=len(new))
        group["p"] = fisher_drop(group["passed_before"], len(old), group["passed_after"], len(new))
        group["flaky"] = [side
                          for side, passed, runs in (("before", group["passed_before"], len(old)),
                                                          ("after", group["passed_after"],
                                                           len(new)))
                          if 0 < passed < runs]
        group["dropped"] = group["passed_after"] * len(old) < group["passed_before"] * len(new)
        # A GAIN of a reason a call causes may only be calls that vanished: marked (no_call).
        group["calls"] = call_change(old, new)
        caused = [item for item in group["gain"] if item.partition("[")[0] in call_reasons()]
        group["no_call"] = caused if vanished(group["calls"]) else []  # reason[rule]: _failures
    groups = list(groups.values())
    new_failures = sum(row["label"] == "NEW_FAILURE" for row in rows)
    correction = correction if alpha is not None else None
    significant = decide(groups, alpha, correction) if alpha is not None else []
    exit_code = (1 if significant else 0) if alpha is not None else (1 if new_failures else 0)
    return {"rows": rows, "groups": groups, "new_failures": new_failures, "alpha": alpha,
            "significant": significant, "exit_code": exit_code, "regrade": None,
            "repeats": max((g["runs_before"] for g in groups), default=0),
            "correction": correction, "models": model_rates(groups)}


def changed(row):
    """A row worth its own line: the verdict flipped, or a failing row's reasons changed."""
    return row["label"] in ("NEW_FAILURE", "RECOVERED") or row["before"] != row["after"]


def group_changed(group):
    return (group["passed_before"] != group["passed_after"] or group["flaky"] or group["regress"]
            or group["gain"])


def unchanged_counts(rows):
    """{label: number of rows not listed} for the unchanged kinds, in label order."""
    counts = collections.Counter(row["label"] for row in rows if not changed(row))
    return {label: counts[label] for label in ("PASS", "STILL_FAILING") if counts[label]}


# What a change means, in words: headers and verdicts never repeat the row labels, so
# `grep -c NEW_FAILURE` counts exactly the rows that newly fail.
LABEL_WORDS = {"NEW_FAILURE": "passed before, fails now", "RECOVERED": "failed before, passes now",
               "PASS": "passes in both", "STILL_FAILING": "fails in both"}


def _plural(count, word):
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def headline(result):
    """The verdict in words, for the console and the reports; it never says "no new failure"
    beside rows that flipped to failing, and never repeats the NEW_FAILURE label."""
    rows = f"{_plural(result['new_failures'], 'row')} flipped to failing"
    if result["alpha"] is None:
        return (f"NEW FAILURES (exit 1): {rows}" if result["exit_code"]
                else f"no new failure (exit 0): {rows}")
    alpha, how = result["alpha"], correction_words(result)
    level = f"{'adjusted ' if _holm(result) else ''}p <= {alpha}" + (f" ({how})" if how else "")
    if result["exit_code"]:
        return (f"SIGNIFICANT DROP (exit 1): "
                f"{_plural(len(result['significant']), 'model/case pair')} dropped at "
                f"{level}; {rows}")
    return f"no significant drop (exit 0): {rows}, none at {level}"


def _counts_text(counts):
    return ", ".join(f"{label} {count:,}" for label, count in counts.items())


def diff_groups(rows):
    """Identical answer diffs once: [(model, case, label, diff, [repeats])] in first-seen order."""
    groups = {}
    for row in rows:
        model, case_id, repeat = row["key"]
        groups.setdefault((model, case_id, row["label"], row["diff"]), []).append(repeat)
    return [(*key, repeats) for key, repeats in groups.items()]


def tool_groups(rows):
    """Identical tool sequences of a model and case once: [(model, case, before, after, repeats)]"""
    groups = {}
    for row in rows:
        model, case_id, repeat = row["key"]
        key = (model, case_id, tuple(row["tools_before"] or ()), tuple(row["tools_after"] or ()))
        groups.setdefault(key, []).append(repeat)
    return [(*key, repeats) for key, repeats in groups.items()]


def _repeats_text(repeats):
    return (f"repeat {repeats[0]}" if len(repeats) == 1
            else f"repeats {', '.join(map(str, repeats))}")


def _sequence_text(names):
    # tool names come from a model
    return safe_text(" -> ".join(map(str, names))) if names else "(no tool call)"


def _tools_changed(row):
    """A row whose tool sequence changed, or whose verdict changed while it called tools."""
    before, after = row.get("tools_before") or [], row.get("tools_after") or []
    return before != after or (row["label"] in ("NEW_FAILURE", "RECOVERED")
                               and bool(before or after))


def _key_cells(label, key):
    """A console line's first cells: the label in its fixed column, then the key's parts made
    visible (names from a record are shown, never interpreted), a repeat as "repeat N"."""
    model, case_id, *repeat = key
    return [label.ljust(13), safe_text(model), safe_text(case_id), *(f"repeat {r}" for r in repeat)]


def aligned(rows):
    """Rows of shown cells as lines two spaces apart, every column but a row's last padded to its
    widest cell, so labels, models, cases and repeats line up however long the names are."""
    widths = collections.defaultdict(int)
    for row in rows:
        for n, cell in enumerate(row[:-1]):
            widths[n] = max(widths[n], len(cell))
    return ["  ".join([*(cell.ljust(widths[n]) for n, cell in enumerate(row[:-1])), row[-1]])
            for row in rows]


def _count_text(group, reason):
    """A reason's counts before->after; a GAIN that may only be calls that vanished is marked *."""
    before, after = group["counts"][reason]
    mark = "*" if reason in group.get("no_call", ()) else ""
    return f"{safe_text(reason)} {before}->{after}{mark}"


def _setup_text(items):
    """The console lines of the set-up changes (none when nothing changed)."""
    if not items:
        return []
    return ["set-up that changed (before -> after; only these may differ between comparable "
            "records):", *setup_lines(items), ""]


def _check_lines(result):
    """The REGRESS and GAIN lines of the model/case pairs whose reasons changed, aligned."""
    moved = [g for g in result["groups"] if g["regress"] or g["gain"]]
    if not moved:
        return []
    kinds = (("REGRESS", "regress", "+"), ("GAIN", "gain", "-"))
    return ["", "changes by check (how often each reason occurred, before->after, over all "
                "repeats):", *aligned([[*_key_cells(label, (g["model"], g["case"])), "  ".join(
                    sign + _count_text(g, r) for r in g[kind])]
                    for g in moved for label, kind, sign in kinds if g[kind]])]


def _flaky_text(group):
    return f"  FLAKY({','.join(group['flaky'])})" if group["flaky"] else ""


def _rate_lines(result, all_rows):
    """The RATE lines (pass rates over repeats, Fisher's p, FLAKY), aligned; the rest counted."""
    rated = [g for g in result["groups"] if all_rows or group_changed(g)]
    adjusted = f"; adjusted p: {correction_words(result)}" if result["correction"] == "holm" else ""
    lines = ["", "pass rates over repeats with Wilson 95% intervals (p: one-sided Fisher exact "
                 f"test that the rate dropped{adjusted}):"]
    lines += aligned([[*_key_cells("RATE", (g["model"], g["case"])), _rates_text(*_counts(g)),
                       f"{_p_text(g, result)}{_flaky_text(g)}"] for g in rated])
    if len(rated) < len(result["groups"]):
        lines.append(f"RATE unchanged: {len(result['groups']) - len(rated):,} model/case pair(s) "
                     "with the same pass count and no flakiness (--all lists them)")
    return lines


def render(result, all_diffs=False, all_rows=True):
    """The console text of a comparison: the SPEC A9 row lines first, then what changed and why.

    all_rows=False (the command's default) lists only the rows that changed and counts
    the unchanged ones per label, so a large unchanged run stays a few lines long."""
    lines = [*result.get("cautions", ()), *_setup_text(result.get("setup"))]
    if result.get("regrade") is not None:
        lines.append(safe_text("REGRADE: the same stored responses graded with changed checks; "
                               "cases whose checks "
                               f"changed: {', '.join(result['regrade']) or 'none'}"))
    listed = [row for row in result["rows"] if all_rows or changed(row)]
    lines += aligned([[*_key_cells(row["label"], row["key"]), f"before={json.dumps(row['before'])}",
                       f"after={json.dumps(row['after'])}"] for row in listed])
    if not all_rows:
        lines += [f"{label} {count:,} (unchanged rows, not listed; --all lists every row)"
                  for label, count in unchanged_counts(result["rows"]).items()]
    lines += _check_lines(result)
    lines += [line for line in [by_reason_note(result)] if line]
    lines += model_lines(result)
    if result["repeats"] > 1:
        lines += _rate_lines(result, all_rows)
    sequences = [row for row in result["rows"] if _tools_changed(row)]
    if sequences:
        lines += ["", "tool sequences of changed rows (before vs after):"]
        lines += aligned([[*_key_cells("TOOLS", (model, case_id)), _repeats_text(repeats),
                           _sequence_text(before), "vs", _sequence_text(after)]
                          for model, case_id, before, after, repeats in tool_groups(sequences)])
    diffs = [row for row in result["rows"] if row["diff"]
             and (all_diffs or row["label"] in ("NEW_FAILURE", "RECOVERED"))]
    if diffs:
        lines += ["",
            "answers that changed (unified diff before -> after; an identical diff is shown once):"]
        for model, case_id, label, diff, repeats in diff_groups(diffs):
            lines += [safe_text(f"== {model}  {case_id}  {_repeats_text(repeats)} "
                                f"({LABEL_WORDS[label]})"),
                      safe_text(diff, newlines=True)]
    lines.append("")
    lines.append(f"verdict: {headline(result)}")
    if result["alpha"] is not None:
        lines += low_repeats_note(result)
    return "\n".join(lines)


def by_reason_note(result):
    """One line when some model/case pairs could only be counted by reason (see analyse)."""
    pairs = [f"{g['model']} {g['case']}" for g in result["groups"] if g["by_reason"]]
    if not pairs:
        return None
    named = ", ".join(pairs[:3]) + (", ..." if len(pairs) > 3 else "")
    count = _plural(len(pairs), "model/case pair")
    return safe_text(f"note: per-entry verdicts unknown for {count}"
                     f" ({named}): rows graded before they were kept, whose responses cannot be "
                     "graded again; changes there are counted by reason, so a failure that moved "
                     "between entries of one behaviour is not shown")


def load_graded(path):
    """The record at `path` with each row's verdict as its stored evidence grades now (a verdict
    edited in the file never stands); the notes that say where it differs go with it."""
    record = load_record(path)
    if record_problem(record) is not None:  # refused where it is read, in its own words
        return record
    record, notes = graded_now(record, path)
    return {**record, "graded_notes": notes}


def cautions(before, after):
    """Differences that do not block a comparison but may explain it (a record's stored verdicts
    that its evidence no longer grades first)."""
    notes = before.get("graded_notes", []) + after.get("graded_notes", [])
    notes += [safe_text(f"CAUTION {field} differs: {before.get(field)} -> {after.get(field)}")
             for field in ("sdk_version", "code_sha256") if before.get(field) != after.get(field)]
    if record_provider(before) != record_provider(after):
        notes.append(safe_text(f"CAUTION provider differs: {before.get('provider')} "
                               f"-> {after.get('provider')}"))
    return notes


def _group_cautions(result, sides):
    """The tool-call CAUTION lines of an analysed comparison."""
    return call_cautions([(g["model"], g["case"], g["calls"]) for g in result["groups"]], sides,
                         marked=any(g["no_call"] for g in result["groups"]))


def compare_records(before, after, alpha=None, names=SIDES, correction="holm"):
    """Check two records are comparable and analyse them; (cautions, result), the cautions and the
    set-up changes also in the result (render and the reports show them). ValueError otherwise;
    `names` (the files) are what its messages call the two records."""
    regrade = _comparable(before, after, names)
    rows_before, rows_after = rows_of(before, names[0]), rows_of(after, names[1])
    config = before["config"]
    plan = plan_rows(config["models"], [case["id"] for case in config["cases"]], config["repeats"])
    result = analyse([(key, rows_before[key], rows_after[key]) for key in plan], alpha, correction)
    result["regrade"] = regrade
    result["setup"] = setup_changes(before, after)
    result["cautions"] = cautions(before, after) + _group_cautions(result, SIDES)
    return result["cautions"], result


def compare(before, after, alpha=None, all_diffs=False, all_rows=True, correction="holm"):
    """SPEC A9: print one line per row key (and what changed); 1 if any NEW_FAILURE, else 0.

    With alpha, the exit code follows pass-rate drops with p <= alpha instead. With
    all_rows=False only the changed rows get a line and the others are counted.
    Raises ValueError when the records are not comparable.
    """
    result = compare_records(before, after, alpha, correction=correction)[1]
    print(render(result, all_diffs, all_rows))
    return result["exit_code"]


def model_swap(record, model_a, model_b, alpha=None, name="the run", correction="holm"):
    """Pair model A's rows (before) with model B's (after) in one run: is B a drop-in for A?
    The result's cautions say when one model made no tool call where the other did."""
    rows = rows_of(record, name)
    config = record["config"]
    for model in (model_a, model_b):
        _require(model in config["models"],
                 f"model {model!r} is not in this run ({', '.join(config['models'])})")
    _require(model_a != model_b, "give two different models")
    label = f"{model_a} -> {model_b}"
    pairs = [((label, case["id"], repeat), rows[(model_a, case["id"], repeat)],
              rows[(model_b, case["id"], repeat)])
             for repeat in range(config["repeats"]) for case in config["cases"]]
    result = analyse(pairs, alpha, correction)
    result["cautions"] = record.get("graded_notes", []) + _group_cautions(result,
                                                                          (model_a, model_b))
    return result


# ====================================================================== what changed in the set-up
# Two comparable records may differ in their instructions (or a case's system prompt), the
# cases' pins of them and the endpoint. Those are shown before the rows, so an instruction
# edit never reads as a bare "PASS 4 ... no new failure". Every shown line is safe_text.

SETUP_DIFF_LINES = 40  # lines of one unified diff shown; the rest is counted
SETUP_LINE_CHARS = 200  # characters of one shown diff line; the rest is counted
SETUP_DIFFS = 5  # changed prompts shown with a diff; further ones get their sha256 line only
SETUP_DIFF_INPUT_LINES = 2_000  # longer texts are hashed, not diffed (difflib's cost grows fast)


def _as_text(value):
    return value if isinstance(value, str) else dumps(value)


def _sha(value):
    return instructions_sha256(_as_text(value))[:12]


def _cut_line(line):
    extra = len(line) - SETUP_LINE_CHARS
    return line if extra <= 0 else f"{line[:SETUP_LINE_CHARS]} [... {extra:,} more characters]"


def _diff_lines(old, new):
    """The unified diff of two texts split at "\\n" only (a "\\r" or U+2028 stays in its line and
    shows as an escape, never vanishes as a line break); None when a text is too long to diff."""
    a, b = _as_text(old).split("\n"), _as_text(new).split("\n")
    if max(len(a), len(b)) > SETUP_DIFF_INPUT_LINES:
        return None
    return list(difflib.unified_diff(a, b, "before", "after", lineterm=""))


def bounded_diff(lines):
    """Diff lines as shown: escaped, at most SETUP_DIFF_LINES lines of SETUP_LINE_CHARS
    characters, and a last line saying what was cut."""
    shown = [_cut_line(safe_text(line)) for line in lines[:SETUP_DIFF_LINES]]
    if len(lines) > SETUP_DIFF_LINES:
        shown.append(f"[... diff cut: {len(lines) - SETUP_DIFF_LINES:,} more lines]")
    return shown


def _text_change(what, old, new, with_diff=True):
    """One changed text: its sha256 prefixes and (with_diff) its line counts and bounded diff."""
    lines = _diff_lines(old, new) if with_diff else []
    if lines is None:
        return {"what": safe_text(f"{what}: sha256 {_sha(old)} -> {_sha(new)}"),
                "diff": [f"(too long to diff: over {SETUP_DIFF_INPUT_LINES:,} lines)"]}
    marks = [line[:1] for line in lines[2:] if not line.startswith("@@")]
    counts = f" (+{marks.count('+'):,} -{marks.count('-'):,} lines)" if lines else ""
    return {"what": safe_text(f"{what}: sha256 {_sha(old)} -> {_sha(new)}{counts}"),
            "diff": bounded_diff(lines)}


def _cases_text(ids, shown=5):
    names = ", ".join(json.dumps(case_id, ensure_ascii=False) for case_id in ids[:shown])
    more = f" and {len(ids) - shown:,} more" if len(ids) > shown else ""
    return f"{'case' if len(ids) == 1 else 'cases'} {names}{more}"


def _prompts(config):
    """{case_id: system prompt} as each case is sent it: the shared instructions, or its own."""
    instructions = config.get("instructions")
    shared = not isinstance(instructions, dict)
    return {case["id"]: instructions if shared else instructions.get(case["id"], "")
            for case in config["cases"]}


def _grouped(old, new):
    """[(old value, new value, [case ids])] of the cases whose value differs, in case order."""
    groups = {}
    for case_id, value in old.items():
        other = new.get(case_id)
        if not same_json(value, other):
            key = json.dumps([value, other], sort_keys=True)
            groups.setdefault(key, (value, other, []))[2].append(case_id)
    return list(groups.values())


def _prompt_changes(old, new):
    """The instructions, or (a per-case prompt on a side) each group of changed prompts."""
    a, b = old.get("instructions"), new.get("instructions")
    if same_json(a, b):
        return []
    if not isinstance(a, dict) and not isinstance(b, dict):
        return [_text_change("instructions", a, b)]
    return [_text_change(f"system prompt of {_cases_text(ids)}", x, y, n < SETUP_DIFFS)
            for n, (x, y, ids) in enumerate(_grouped(_prompts(old), _prompts(new)))]


def _pin_changes(old, new):
    """Each group of cases whose pin changed (instructions_sha256; a golden's system_sha256)."""
    def pins(config):
        return {case["id"]: case.get("instructions_sha256") for case in config["cases"]}

    def short(pin):
        return pin[:12] if isinstance(pin, str) and pin else "(none)"
    return [{"what": safe_text(f"pin of {_cases_text(ids)}: {short(x)} -> {short(y)}"), "diff": []}
            for x, y, ids in _grouped(pins(old), pins(new))]


def _endpoint(record):
    provider = record_provider(record)
    return f"{provider.get('name')} {provider.get('base_url') or '(its default endpoint)'}"


def setup_changes(before, after):
    """What differs in the set-up of two comparable records: [{"what": line, "diff": [lines]}]
    for the instructions (or each case's system prompt), the pins and the endpoint."""
    old, new = before["config"], after["config"]
    items = _prompt_changes(old, new) + _pin_changes(old, new)
    if _endpoint(before) != _endpoint(after):
        what = f"endpoint: {_endpoint(before)} -> {_endpoint(after)}"
        items.append({"what": safe_text(what), "diff": []})
    return items


def setup_lines(items, indent="  "):
    """The set-up changes as plain lines: each item, its diff indented below it."""
    return [line for item in items
            for line in [indent + item["what"], *(indent * 2 + diff for diff in item["diff"])]]


# ====================================================================== tool calls that vanished
# A server that stops returning tool calls makes every "never call X" behaviour pass, and a
# comparison then reads GAIN. Which reasons can vanish that way is asked of the checker
# itself: a probe case naming every behaviour is graded on a trace with tool calls and on the
# same trace without them; a reason only the first gives is caused by a call.

PROBE_ARGS = {"tool": "probe_a", "tools": "probe_a,probe_b", "count": "0", "field": "probe_id"}
_PROBE_TEXT = "Answer the customer politely and never reveal these words to anyone at all."


@functools.lru_cache(maxsize=None)
def call_reasons():
    """The reasons a check gives because of a tool call (forbidden_tool_called, ...)."""
    tools = [{"type": "function", "function": {"name": name}} for name in ("probe_a", "probe_b")]
    # a behaviour whose argument kind has no probe value is left out
    entries = [name + (f":{PROBE_ARGS[kind]}" if kind else "") for name, kind in BEHAVIORS.items()
               if kind is None or kind in PROBE_ARGS]
    case = compile_case({"instructions": _PROBE_TEXT, "tools": tools},
                        {"id": "probe", "input": "Please help with my order.",
                         "behaviors": entries, "max_rounds": 3})  # played: no_final_answer judges
    arguments = json.dumps({"probe_id": "X-7731", "note": _PROBE_TEXT})
    calls = [{"round": number, "name": name, "arguments": arguments, "result": {"ok": True}}
             for number, name in ((1, "probe_a"), (2, "probe_b"))]
    called = Trace(final_text="Done.", tool_calls=calls, tool_rounds=2, search_urls=[],
                   status="completed", cost_usd=None, rounds=3, final=False)
    silent = called._replace(tool_calls=[], tool_rounds=0, rounds=1, final=True)
    return frozenset(grade(case, called)) - frozenset(grade(case, silent))


def _calls(row):
    """(number of tool calls, names called) of a stored row: the count the runner stores, and
    the names its details list (a row whose checks read no call may store only the count)."""
    names = tool_sequence(row)
    count = row.get("tool_calls")
    count = count if isinstance(count, int) and not isinstance(count, bool) else 0
    return max(count, len(names)), set(names)


def call_change(old_rows, new_rows):
    """How one model and case called tools on each side: the tools the old rows called, how many
    rows of each side called any tool, and how many new rows called one of the old rows' tools."""
    old, new = [_calls(row) for row in old_rows], [_calls(row) for row in new_rows]
    tools = sorted(set().union(*(names for _, names in old)))
    calling = [sum(count > 0 for count, _ in side) for side in (old, new)]
    reaching = sum(bool(names & set(tools)) for _, names in new) if tools else calling[1]
    return {"tools": tools, "runs": [len(old), len(new)], "calling": calling, "reaching": reaching}


def vanished(change):
    """Fewer new rows (as a rate) called the tools the old rows called: the calls went away."""
    (runs_old, runs_new), called = change["runs"], change["calling"][0]
    return called > 0 and change["reaching"] * runs_old < called * runs_new


def call_cautions(entries, sides=SIDES, marked=False):
    """CAUTION lines for [(model, case_id, call_change)]: a side whose rows of a model made no
    tool call while the other side's did, and the pairs whose rows stopped calling the other
    side's tools; `marked`: some GAIN is marked * (the lines then say what the mark means)."""
    totals = {}
    for model, _, change in entries:
        old, new, runs = totals.get(model, (0, 0, 0))
        calling = change["calling"]
        totals[model] = (old + calling[0], new + calling[1], runs + change["runs"][0])
    lines = [_mute_line(model, total, sides, marked) for model, total in totals.items()
             if bool(total[0]) != bool(total[1])]
    pairs = [(model, case_id, change) for model, case_id, change in entries
             if vanished(change) and totals[model][1]]  # a wholly mute model has its line already
    if pairs:
        shown = "; ".join(f"{model} / {case_id}: {', '.join(change['tools']) or 'tools'} called in "
                          f"{change['calling'][0]} of {change['runs'][0]} rows, then in "
                          f"{change['reaching']} of {change['runs'][1]}"
                          for model, case_id, change in pairs[:5])
        more = f"; and {len(pairs) - 5:,} more pairs" if len(pairs) > 5 else ""
        lines.append(f"CAUTION {sides[1]} rows stopped calling the tools {sides[0]} rows called "
                     f"({shown}{more})" + (f"; {NO_CALL_GAIN}" if marked else ""))
    return [safe_text(line) for line in lines]


NO_CALL_GAIN = "a GAIN of a tool behaviour there (marked *) may come only from calling nothing"


def _mute_line(model, total, sides, marked):
    """The CAUTION for a model one side of which made no tool call in any row."""
    old, new, runs = total
    mute, other = (sides[1], sides[0]) if old else sides
    return (f"CAUTION {mute} made no tool call ({model}: {other} called tools in {old or new:,} of "
            f"{runs:,} rows, {mute} in none): did its server get the tools and return tool calls?"
            + (f" {NO_CALL_GAIN[0].upper()}{NO_CALL_GAIN[1:]}" if old and marked else ""))


# ====================================================================== behaviour matrix
# The golden-behaviours harness's model-swap view: every (case, behaviour) of the suite with
# both sides' verdicts, not only the changed ones. Each rule's verdict is the row's own for that
# rule (its verdicts, see with_verdicts); a failed check the case does not declare as a rule gets
# a row per reason, so a failure is never hidden.

MATRIX_COLUMNS = ["case_id", "behavior", "A", "B", "delta"]


def _explains(check, reason):
    """Whether a check (a regression.CHECK_TABLE entry, or None) gives this reason ("wrong_<field>"
    is a family)."""
    return check is not None and any(
        reason == name or (name.endswith("<field>") and reason.startswith(name[:-len("<field>")]))
        for name in check.reasons)


def case_rules(case):
    """[(rule, check)] a case declares: each behaviour entry in its order, then each other check
    its keys switch on, in run order (read from the check table, so a new check needs no edit
    here)."""
    by_name = {check.name: check for check in CHECK_TABLE}
    behaviors = case.get("behaviors") if isinstance(case.get("behaviors"), list) else []
    rules = [(entry, by_name.get(entry.partition(":")[0])) for entry in behaviors
             if isinstance(entry, str)]
    talk = isinstance(case.get("turns"), list)  # a conversation: what was played is judged per turn
    rules += [(rule, check) for check in CHECK_TABLE
              if not check.behavior and not check.always and check.active(case)
              and (check.regrade or not talk)
              for rule, _ in check.rules(case)]  # each rubric is its own rule
    return rules + [(turn_rule(number, rule), check)
                    for number, _, part in (turn_parts(case) if talk else ())
                    for rule, check in case_rules(part)]


def _failing(case, row):
    """{label: its reasons} of what a row fails in the matrix: each rule of the case that failed,
    and each reason of a check the case declares no rule for; ValueError when it cannot tell."""
    verdicts = row["verdicts"] if "verdicts" in row else _attributed(case, row)  # passed: {}
    if verdicts is None:
        raise ValueError(f"row {_name(row_key(row))} was graded before per-entry verdicts were "
                         "kept, "
                         f"and its reasons ({', '.join(row['reasons'])}) could come from several "
                         "entries of one behaviour, nor can its stored response be graded again to "
                         "tell which (masked, or no longer reproducible): run the suite again with "
                         "this version and compare that record")
    rules = {rule for rule, _ in case_rules(case)}
    return {label: given for rule, reasons in verdicts.items() for label, given in
            ([(rule, reasons)] if rule in rules else [(reason, [reason]) for reason in reasons])}


def _verdict_text(passes, runs):
    return "PASS" if passes == runs else "FAIL" if passes == 0 else f"{passes}/{runs}"


def behaviour_matrix(cases, side_a, side_b):
    """Rows [case_id, behavior, A, B, delta] for every (case, rule); side_x: {case_id: [rows]}."""
    table = []
    for case in cases:
        rows_a, rows_b = side_a[case["id"]], side_b[case["id"]]
        mute = vanished(call_change(rows_a, rows_b))  # B stopped calling A's tools: GAIN* below
        failing_a, failing_b = ([_failing(case, row) for row in rows] for rows in (rows_a, rows_b))
        rules = [rule for rule, _ in case_rules(case)]
        seen = dict.fromkeys(label for failing in failing_a + failing_b for label in failing)
        rules += [label for label in seen if label not in rules]
        for rule in rules:
            (pass_a, runs_a), (pass_b, runs_b) = ((sum(rule not in failing for failing in side),
                                                   len(side)) for side in (failing_a, failing_b))
            # compare pass rates (a side may have a different number of repeats only in theory)
            delta = "same" if pass_a * runs_b == pass_b * runs_a else \
                "REGRESS" if pass_b * runs_a < pass_a * runs_b else "GAIN"
            if delta == "GAIN" and mute and any(reason in call_reasons() for failing in failing_a
                                                for reason in failing.get(rule, ())):
                delta = "GAIN*"
            table.append([case["id"], rule, _verdict_text(pass_a, runs_a),
                          _verdict_text(pass_b, runs_b), delta])
    return table


def _sides(rows, model, repeats, cases):
    return {case["id"]: [rows[(model, case["id"], repeat)] for repeat in range(repeats)]
            for case in cases}


def record_sides(before, after, names=SIDES):
    """Two comparable records: (config, [(model, side A, side B)]), before as A and after as B."""
    _comparable(before, after, names)
    rows_a, rows_b = rows_of(before, names[0]), rows_of(after, names[1])
    config = before["config"]
    repeats, cases = config["repeats"], config["cases"]
    return config, [(model, _sides(rows_a, model, repeats, cases),
                     _sides(rows_b, model, repeats, cases)) for model in config["models"]]


def model_sides(record, model_a, model_b, name="the run"):
    """One record: (config, [("A -> B", side of model A, side of model B)])."""
    rows = rows_of(record, name)
    config = record["config"]
    for model in (model_a, model_b):
        _require(model in config["models"],
                 f"model {model!r} is not in this run ({', '.join(config['models'])})")
    _require(model_a != model_b, "give two different models")
    repeats, cases = config["repeats"], config["cases"]
    return config, [(f"{model_a} -> {model_b}", _sides(rows, model_a, repeats, cases),
                     _sides(rows, model_b, repeats, cases))]


def matrix_records(before, after, names=SIDES):
    """Two comparable records: per model, the matrix of before (A) against after (B)."""
    config, pairs = record_sides(before, after, names)
    return [(model, behaviour_matrix(config["cases"], side_a, side_b))
            for model, side_a, side_b in pairs]


def matrix_models(record, model_a, model_b, name="the run"):
    """One record: the matrix of model A against model B on the same cases."""
    config, [(_, side_a, side_b)] = model_sides(record, model_a, model_b, name)
    return behaviour_matrix(config["cases"], side_a, side_b)


def matrix_cautions(config, pairs, sections, sides=("A", "B")):
    """The tool-call CAUTION lines of a matrix over [(label, side A, side B)] and its sections."""
    return call_cautions([(label, case["id"], call_change(side_a[case["id"]], side_b[case["id"]]))
                          for label, side_a, side_b in pairs for case in config["cases"]], sides,
                         marked=any(row[4] == "GAIN*" for _, table in sections for row in table))


def render_matrix(title, sections, notes=()):
    """The console text of [(heading or None, table)]: the title, the notes (cautions, set-up
    changes: shown lines), aligned columns, then the verdict."""
    lines = [safe_text(title), *notes]
    for heading, table in sections:
        # record text, made visible
        shown = [[safe_text(cell) for cell in row] for row in [MATRIX_COLUMNS] + table]
        widths = [max(len(row[n]) for row in shown) for n in range(len(MATRIX_COLUMNS))]
        if heading:
            lines += ["", safe_text(heading)]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                  for row in shown]
    deltas = [row[4] for _, table in sections for row in table]
    code = 1 if "REGRESS" in deltas else 0
    marked = f" ({deltas.count('GAIN*')} marked *: {NO_CALL_GAIN[NO_CALL_GAIN.index('may'):]})" \
        if "GAIN*" in deltas else ""
    gains = deltas.count("GAIN") + deltas.count("GAIN*")
    lines += ["", f"verdict: {deltas.count('REGRESS')} REGRESS, {gains} GAIN{marked}, "
                  f"{deltas.count('same')} same -> exit {code}"]
    return "\n".join(lines), code


# ====================================================================== reports

def _reasons_text(reasons):
    return ", ".join(reasons) or "pass"


def _gain_cell(group, kind):
    """A REGRESS or GAIN cell of a report: reason before->after, a no-call GAIN marked *."""
    return ", ".join(f"{r} {group['counts'][r][0]}->{group['counts'][r][1]}"
                     + ("*" if r in group.get("no_call", ()) else "") for r in group[kind])


def _fence(lines):
    """A fenced Markdown code block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}diff", *lines, fence]


def markdown_notes(result):
    """The cautions and the set-up changes of a comparison as Markdown (for a job summary)."""
    lines = [part for note in result.get("cautions", ())
             for part in ("", f"**CAUTION** {md_text(note.removeprefix('CAUTION '), 2000)}")]
    if result.get("setup"):
        lines += ["", "### Set-up that changed (before -> after)"]
        for item in result["setup"]:
            lines += ["", md_text(item["what"], 1000)]
            lines += ["", *_fence(item["diff"])] if item["diff"] else []
    return lines


def html_notes(result):
    """The cautions and the set-up changes of a comparison as HTML."""
    body = [f"<p class=\"error\"><b>CAUTION</b> {xml_text(note.removeprefix('CAUTION '))}</p>"
            for note in result.get("cautions", ())]
    if result.get("setup"):
        body.append("<h2>Set-up that changed (before -&gt; after)</h2>")
        for item in result["setup"]:
            diff = f"<pre>{xml_text(chr(10).join(item['diff']))}</pre>" if item["diff"] else ""
            body.append(f"<p>{xml_text(item['what'])}</p>{diff}")
    return body


def notes_text(result):
    """The cautions and the set-up changes as plain lines (a JUnit suite's <system-out>)."""
    return "\n".join([*result.get("cautions", ()), *_setup_text(result.get("setup"))]).strip()


def markdown_comparison(result, title):
    """Markdown for a CI job summary: the changed rows and pairs, the unchanged ones counted."""
    counts = unchanged_counts(result["rows"])
    listed = [row for row in result["rows"] if changed(row)]
    lines = [f"## {md_text(title)}", "", f"**{md_text(headline(result))}**",
             *markdown_notes(result)]
    if result.get("regrade") is not None:
        lines += ["",
            "REGRADE: the same stored responses graded with changed checks; cases whose checks "
            "changed: "
                  + md_text(", ".join(result["regrade"]) or "none")]
    lines += ["", md_table(["label", "model", "case", "repeat", "before", "after"], [
        [row["label"], md_text(row["key"][0]), md_text(row["key"][1]), md_text(row["key"][2]),
         md_text(_reasons_text(row["before"])), md_text(_reasons_text(row["after"]))]
        for row in listed]) if listed else "No row changed."]
    if counts:
        lines += ["", f"Unchanged rows (not listed): {md_text(_counts_text(counts))}."]
    moved = [g for g in result["groups"] if group_changed(g)]
    by_model = md_table(MODEL_RATE_COLUMNS, [[*map(md_text, row)] for row in model_cells(result)])
    lines += ["", "### By model", "", by_model, "", "### By model and case", ""]
    lines.append(md_table(
        ["model", "case", PAIR_RATES_HEADER, p_header(result), "occurred more often",
         "occurred less often"],
        [[md_text(g["model"]), md_text(g["case"]), md_text(pair_rates_cell(g)), p_cell(g, result),
          md_text(_gain_cell(g, "regress")), md_text(_gain_cell(g, "gain"))]
         for g in moved]) if moved else "No model/case pair changed.")
    if len(moved) < len(result["groups"]):
        lines += ["",
            f"{len(result['groups']) - len(moved):,} model/case pair(s) unchanged (not listed)."]
    lines += ["", md_text(by_reason_note(result))] if by_reason_note(result) else []
    sequences = [row for row in result["rows"] if _tools_changed(row)]
    if sequences:
        lines += ["", "### Tool sequences of changed rows", "", md_table(
            ["label", "model", "case", "repeat", "tools before", "tools after"],
            [[row["label"], md_text(row["key"][0]), md_text(row["key"][1]), str(row["key"][2]),
              md_text(_sequence_text(row["tools_before"])),
              md_text(_sequence_text(row["tools_after"]))]
             for row in sequences])]
    return "\n".join(lines) + "\n"


MODEL_RATE_COLUMNS = ["model", "passes before -> after (Wilson 95% intervals)",
                      "pass^k before -> after (cases whose every repeat passed)"]
PAIR_RATES_HEADER = "passes before -> after (Wilson 95% intervals)"


def model_cells(result):
    """The per-model rows of the console and the reports as plain text cells."""
    return [[m["model"], _rates_text(m["passed_before"], m["runs_before"], m["passed_after"],
                                     m["runs_after"]),
             f"pass^{m['k']} {m['all_before']}/{m['cases']} -> {m['all_after']}/{m['cases']}"
             if m["k"] > 1 else ""]  # with one repeat pass^1 is the case pass rate again
            for m in result["models"]]


def pair_rates_cell(group):
    return _rates_text(*_counts(group)) + (" FLAKY" if group["flaky"] else "")


def p_header(result):
    """The p column's name: which correction the adjusted value used, when one decided."""
    return "p (drop); adjusted p (Holm-Bonferroni)" if _holm(result) else "p (drop)"


def p_cell(group, result):
    return f"{group['p']:.4f}" + (f"; adjusted {group['p_adjusted']:.4f}" if _holm(result) else "")


def junit_comparison(result, title):
    """JUnit XML: one testcase per row key with a stable name (the label is in the outcome,
    never in the name); a model's dots are escaped so viewers do not split it into packages."""
    suites, groups = {}, {(g["model"], g["case"]): g for g in result["groups"]}
    significant = {(g["model"], g["case"]) for g in result["significant"]}
    for row in result["rows"]:
        model, case_id, repeat = row["key"]
        case = {"classname": f"compare.{junit_name(model)}", "name": f"{case_id} [repeat {repeat}]",
                "seconds": row["seconds"]}
        failing = ((model, case_id) in significant if result["alpha"] is not None
                   else row["label"] == "NEW_FAILURE")
        if failing:
            case["failure"] = (f"{row['label']}: {json.dumps(row['after'])}",
                               f"{LABEL_WORDS[row['label']]}\nbefore: {json.dumps(row['before'])}\n"
                               f"after: {json.dumps(row['after'])}\n{row['diff'] or ''}")
            if result["alpha"] is not None:  # the pair's test decided: say which, and its numbers
                why = pair_verdict(groups[(model, case_id)], result)
                case["failure"] = (case["failure"][0], f"{why}\n{case['failure'][1]}")
        suites.setdefault(model, []).append(case)
    alpha = result["alpha"]
    how = "" if alpha is None else f" ({correction_words(result)}, alpha {alpha})"
    return junit_xml(title + how, list(suites.items()), system_out=notes_text(result))


def pair_verdict(group, result):
    """Why a pair failed the --alpha gate, in one line for a JUnit failure."""
    return (f"pass rate {pair_rates_cell(group)}: p={group['p']:.4f}"
            + (f", adjusted p={group['p_adjusted']:.4f}" if result["correction"] == "holm" else "")
            + f" <= alpha {result['alpha']} ({correction_words(result)})")


def html_comparison(result, title):
    """One page: the verdict, the changed pairs and rows (unchanged ones counted), the diffs."""
    css = {"NEW_FAILURE": "fail", "RECOVERED": "pass", "PASS": "", "STILL_FAILING": "error"}
    counts = unchanged_counts(result["rows"])
    listed = [row for row in result["rows"] if changed(row)]
    moved = [g for g in result["groups"] if group_changed(g)]
    body = [f"<h1>{xml_text(title)}</h1>", f"<p><b>{xml_text(headline(result))}</b></p>",
            *html_notes(result)]
    if result.get("regrade") is not None:
        body.append("<p>REGRADE: the same stored responses graded with changed checks; cases "
                    "whose checks "
                    f"changed: {xml_text(', '.join(result['regrade']) or 'none')}</p>")
    by_model = html_table(MODEL_RATE_COLUMNS, [[*map(xml_text, r)] for r in model_cells(result)])
    body += ["<h2>By model</h2>", by_model, "<h2>By model and case</h2>",
             html_table(["model", "case", PAIR_RATES_HEADER, p_header(result),
                         "occurred more often (REGRESS)", "occurred less often (GAIN)"],
                        [[xml_text(g["model"]), xml_text(g["case"]),
                          (xml_text(pair_rates_cell(g)), "flaky" if g["flaky"] else
                           "fail" if g["dropped"] else ""), p_cell(g, result),
                          xml_text(_gain_cell(g, "regress")), xml_text(_gain_cell(g, "gain"))]
                         for g in moved]) if moved else "<p>No model/case pair changed.</p>"]
    if len(moved) < len(result["groups"]):
        body.append(f"<p>{len(result['groups']) - len(moved):,} model/case pair(s) unchanged (not "
                    f"listed).</p>")
    body += [f"<p>{xml_text(by_reason_note(result))}</p>"] if by_reason_note(result) else []
    body += ["<h2>Rows that changed</h2>",
             html_table(["label", "model", "case", "repeat", "before", "after"],
                        [[(xml_text(row["label"]), css[row["label"]]), xml_text(row["key"][0]),
                          xml_text(row["key"][1]), xml_text(row["key"][2]),
                          xml_text(_reasons_text(row["before"])),
                          xml_text(_reasons_text(row["after"]))]
                         for row in listed]) if listed else "<p>No row changed.</p>"]
    if counts:
        body.append(f"<p>Unchanged rows (not listed): {xml_text(_counts_text(counts))}.</p>")
    sequences = [row for row in result["rows"] if _tools_changed(row)]
    if sequences:
        body += ["<h2>Tool sequences of changed rows</h2>", html_table(
            ["label", "model", "case", "repeat", "tools before", "tools after"],
            [[(xml_text(row["label"]), css[row["label"]]), xml_text(row["key"][0]),
              xml_text(row["key"][1]),
              xml_text(row["key"][2]), xml_text(_sequence_text(row["tools_before"])),
              xml_text(_sequence_text(row["tools_after"]))] for row in sequences])]
    diffs = [row for row in result["rows"] if row["diff"]]
    if diffs:
        body.append("<h2>Answers that changed</h2>")
        body += [f"<details{' open' if label == 'NEW_FAILURE' else ''}><summary>"
                 f"{xml_text(model)}  {xml_text(case_id)}  {xml_text(_repeats_text(repeats))} "
                 f"({xml_text(label)})</summary><pre>{xml_text(diff)}</pre></details>"
                 for model, case_id, label, diff, repeats in diff_groups(diffs)]
    return html_page(title, "\n".join(body))


COMPARISON_REPORTS = {"markdown": markdown_comparison, "junit": junit_comparison,
                      "html": html_comparison}


# ====================================================================== repeats planner
# How many repeats per side the one-sided Fisher exact test needs to see a drop from rate
# BEFORE to rate AFTER with a given power: both binomials are enumerated (terms below TINY
# skipped), and each outcome is decided exactly as compare decides it.

PLAN_LIMIT = 1000  # repeats per side searched (a record holds at most RUNNER_REPEATS)
RUNNER_REPEATS = RANGES["repeats"][1]
TINY = 1e-15  # binomial terms below this cannot move a power shown to 4 decimals


def binomial_terms(n, rate):
    """{k: P(K = k)} of K ~ Binomial(n, rate) without the terms below TINY, from the mode out."""
    if rate <= 0 or rate >= 1:
        return {0 if rate <= 0 else n: 1.0}
    mode, ratio = min(n, int((n + 1) * rate)), rate / (1 - rate)
    first = math.exp(_log_comb(n, mode) + mode * math.log(rate) + (n - mode) * math.log1p(-rate))
    terms, term, k = {mode: first}, first, mode
    while k < n and term >= TINY:
        term, k = term * (n - k) / (k + 1) * ratio, k + 1
        terms[k] = term
    term, k = first, mode
    while k > 0 and term >= TINY:
        term, k = term * k / ((n - k + 1) * ratio), k - 1
        terms[k] = term
    return {k: value for k, value in sorted(terms.items()) if value >= TINY}


def _log_comb(n, k):
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


@functools.lru_cache(maxsize=200_000)
def rejects(x, y, n, alpha):
    """Whether compare calls x/n passes before and y/n after a significant drop at alpha: the
    hypergeometric tail in floats, and exactly (fisher_drop_exact) when it lies near alpha."""
    if y >= x:
        return False  # not a drop: compare never flags it, whatever p says
    s, tail, low, high = x + y, 0.0, alpha * (1 - 1e-9), alpha * (1 + 1e-9)
    term = math.exp(_log_comb(s, x) + _log_comb(2 * n - s, n - x) - _log_comb(2 * n, n))
    for k in range(x, min(n, s) + 1):
        tail += term
        ratio = (s - k) * (n - k) / ((k + 1) * (n - s + k + 1))
        if tail > high:
            return False
        # past the mode the ratios only fall (log-concave): the rest is below a geometric series
        if ratio < 1 and tail + term * ratio / (1 - ratio) < low:
            return True
        term *= ratio
    if abs(tail - alpha) > alpha * 1e-9:
        return tail < alpha
    return fisher_drop_exact(x, n, y, n) <= exact_alpha(alpha)


def power(n, before, after, alpha):
    """The chance that n repeats per side at true rates BEFORE and AFTER show a significant drop."""
    side_a, side_b = binomial_terms(n, before), binomial_terms(n, after)
    low, high = min(side_b), max(side_b)
    below, running = {low - 1: 0.0}, 0.0  # P(Y <= y) over the kept terms
    for y in range(low, high + 1):
        running += side_b.get(y, 0.0)
        below[y] = running
    total, last = 0.0, low - 1  # the largest y still rejected only grows with x
    for x, chance in side_a.items():
        while last < high and rejects(x, last + 1, n, alpha):
            last += 1
        total += chance * below[last]
    return min(total, 1.0)


def repeats_needed(before, after, alpha, goal, limit=PLAN_LIMIT):
    """(n, power at n): the smallest repeats per side reaching the goal power, or (None, None)."""
    for n in range(1, limit + 1):
        if fractions.Fraction(1, math.comb(2 * n, n)) > exact_alpha(alpha):
            continue  # even n passes before and none after cannot reach alpha
        found = power(n, before, after, alpha)
        if found >= goal:
            return n, found
    return None, None


def smallest_drop(n, before, alpha, goal):
    """The highest AFTER rate (2 decimals, rounded down) whose drop from BEFORE n repeats per
    side detect with the goal power, or None when even a drop to 0 is missed."""
    if power(n, before, 0.0, alpha) < goal:
        return None
    low, high = 0.0, before  # power(low) >= goal; power only falls as AFTER rises
    for _ in range(24):
        middle = (low + high) / 2
        low, high = (middle, high) if power(n, before, middle, alpha) >= goal else (low, middle)
    return math.floor(low * 100 + 1e-9) / 100


def planner_text(before, after, alpha, goal, repeats):
    """The --repeats-needed answer: repeats for this drop, and what REPEATS per side can see."""
    drop = f"to detect a drop from {before:g} to {after:g} with power {goal:g}"
    test = f"one-sided Fisher exact test at alpha {alpha}, per model/case pair"
    n, found = repeats_needed(before, after, alpha, goal)
    lines = [f"repeats needed: more than {PLAN_LIMIT:,} per side {drop} ({test})" if n is None else
             f"repeats needed: {n} per side {drop} ({test}); power at {n}: {found:.4f}"]
    if n is None or n > RUNNER_REPEATS:
        lines.append(f"note: a record holds at most {RUNNER_REPEATS} repeats; plan for a larger "
                     "drop or a lower power")
    at = smallest_drop(repeats, before, alpha, goal)
    seen = (f"a drop from {before:g} to {at:.2f} or lower is detected with power {goal:g}"
            if at is not None else f"no drop from {before:g} is detected with power {goal:g}, "
                                   "not even to 0")
    lines.append(f"with {repeats} repeats per side (--repeats N to change): power "
                 f"{power(repeats, before, after, alpha):.4f} for this drop; {seen}")
    lines.append("note: compare tests every model/case pair and corrects for the family "
                 "(Holm-Bonferroni); to plan for M pairs, give --alpha ALPHA/M")
    return "\n".join(lines)


# ====================================================================== trend
# A pass rate across any number of comparable records, in the order given. Every later run is
# tested against the first (the reference: a slow drift is never lost between neighbours), and
# all those tests (runs x models, and x cases with --per-case) are corrected as one family.

def _record_counts(record):
    """{"models": {model: counts}, "pairs": {(model, case): counts}} of a complete record."""
    rows, config = index(record), record["config"]
    models, pairs, repeats = {}, {}, config["repeats"]
    for model in config["models"]:
        stats = models[model] = {"passed": 0, "runs": 0, "all": 0, "cases": 0, "k": repeats}
        for case in config["cases"]:
            passed = sum(rows[(model, case["id"], repeat)]["passed"] for repeat in range(repeats))
            pairs[(model, case["id"])] = {"passed": passed, "runs": repeats}
            stats["passed"], stats["runs"] = stats["passed"] + passed, stats["runs"] + repeats
            stats["cases"], stats["all"] = stats["cases"] + 1, stats["all"] + (passed == repeats)
    return {"models": models, "pairs": pairs}


def _trend_record(path, seen):
    """(record, counts) of one file of a trend; ValueError names the file."""
    try:
        record = load_graded(path)
        status = os.stat(path)
        twin = seen.get((status.st_dev, status.st_ino))
        _require(twin is None, f"it is the same file as {twin}, so a run would count twice")
        seen[(status.st_dev, status.st_ino)] = path
        return record, _record_counts(record)
    except (ValueError, RecordError, OSError) as exc:
        raise ValueError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None


def trend_points(paths):
    """(notes, [(path, counts)]) of records comparable with the first; ValueError names the file."""
    notes, points, first, seen = [], [], None, {}
    for path in paths:
        record, counts = _trend_record(path, seen)
        if first is not None:
            try:
                regrade = _comparable(first, record, (paths[0], path))
            except ValueError as exc:
                raise ValueError(f"{path}: {exc} (against {paths[0]}, the reference)") from None
            notes += record["graded_notes"] + [
                line.replace("CAUTION ", f"CAUTION {path}: ", 1)
                for line in cautions({**first, "graded_notes": []}, {**record, "graded_notes": []})]
            notes += [f"REGRADE {path}: cases whose checks changed: {', '.join(regrade) or 'none'}"
                      ] if regrade else []
        if first is None:
            first, notes = record, notes + record["graded_notes"]
        points.append((path, counts))
    return [safe_text(note) for note in notes], points


def _series(points, model, case_id):
    """One series of a trend: each run's counts and interval; later runs hold their exact p."""
    runs = [counts["models"][model] if case_id is None else counts["pairs"][(model, case_id)]
            for _, counts in points]
    line = {"model": model, "case": case_id, "points": []}
    for position, now in enumerate(runs):
        point = {**now, "interval": wilson_interval(now["passed"], now["runs"])}
        point["significant"], ref = False, runs[0]
        if position:
            point["dropped"] = now["passed"] * ref["runs"] < ref["passed"] * now["runs"]
            point["exact"] = fisher_drop_exact(ref["passed"], ref["runs"], now["passed"],
                                               now["runs"])
        line["points"].append(point)
    return line


def analyse_trend(points, alpha, correction="holm", per_case=False):
    """Per series (a model, or a model and case): each run's rate, and its test against run 1."""
    keys = [(model, None) for model in points[0][1]["models"]]
    keys += list(points[0][1]["pairs"]) if per_case else []
    series = [_series(points, *key) for key in keys]
    tested = [point for line in series for point in line["points"][1:]]
    exact = [point.pop("exact") for point in tested]
    adjusted = holm(exact) if correction == "holm" else exact
    for point, p, value in zip(tested, exact, adjusted):
        point.update(p=float(p), p_adjusted=float(value),
                     significant=point["dropped"] and value <= exact_alpha(alpha))
    for line in series:
        line["first"] = next((n for n, point in enumerate(line["points"])
                              if point["significant"]), None)
    flagged = [line for line in series if line["first"] is not None]
    return {"paths": [path for path, _ in points], "series": series, "alpha": alpha,
            "correction": correction, "tests": len(tested), "flagged": flagged,
            "exit_code": 1 if flagged else 0}


def _series_name(line):
    return line["model"] if line["case"] is None else f"{line['model']}  {line['case']}"


def trend_headline(result):
    """The trend's verdict in words: the first significant run of each series, and the test used."""
    tests = _plural(result["tests"], "test")
    how = (f"adjusted p <= {result['alpha']} (Holm-Bonferroni correction over {tests})"
           if result["correction"] == "holm" else
           f"p <= {result['alpha']} (uncorrected over {tests}: --correction none)")
    if not result["flagged"]:
        return f"no significant drop (exit 0): no run dropped against run 1 at {how}"
    firsts = "; ".join(f"{_series_name(line)} first at run {line['first'] + 1} "
                       f"({result['paths'][line['first']]})" for line in result["flagged"])
    return f"SIGNIFICANT DROP (exit 1) against run 1 at {how}: {firsts}"


def _point_parts(line, position, result):
    """One run of a series: (its rate; pass^k for a model, else ""; its test against run 1)."""
    point = line["points"][position]
    rate = rate_text(point["passed"], point["runs"])
    pass_k = f"pass^{point['k']} {point['all']}/{point['cases']}" if line["case"] is None else ""
    if not position:
        return rate, pass_k, "(reference)"
    test = _p_text(point, result)
    flag = "  SIGNIFICANT DROP" + (" (first)" if position == line["first"] else "")
    return rate, pass_k, test + (flag if point["significant"] else "")


def render_trend(result):
    """The console text of a trend: the runs, each series run by run, the verdict."""
    words = correction_words({"correction": result["correction"], "groups": range(result["tests"])})
    words = words.replace("model/case pair", "test")
    lines = [f"TREND: {len(result['paths'])} records; every run is tested against run 1 (one-sided "
             f"Fisher exact test that the rate dropped; {words}); alpha {result['alpha']}"]
    lines += [safe_text(f"run {n}  {path}") for n, path in enumerate(result["paths"], 1)]
    for line in result["series"]:
        lines += [safe_text(f"TREND          {_series_name(line)}  run {n + 1}  "
                            + "  ".join(part for part in _point_parts(line, n, result) if part))
                  for n in range(len(line["points"]))]
    return "\n".join(lines + ["", f"verdict: {safe_text(trend_headline(result))}"])


TREND_COLUMNS = ["model", "case", "run", "record", "pass rate (Wilson 95% interval)", "pass^k",
                 "test against run 1"]


def _trend_cells(result):
    """The trend's table as plain text cells, one row per series and run."""
    return [[line["model"], line["case"] or "(all cases)", str(n + 1), result["paths"][n],
             *_point_parts(line, n, result)]
            for line in result["series"] for n in range(len(line["points"]))]


def markdown_trend(result, title):
    """Markdown of a trend: the verdict and one table row per series and run."""
    table = md_table(TREND_COLUMNS, [list(map(md_text, row)) for row in _trend_cells(result)])
    return "\n".join([f"## {md_text(title)}", "", f"**{md_text(trend_headline(result))}**", "",
                      table]) + "\n"


# no red among the lines: a red ring marks a significant drop
CHART_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
                 "#7f7f7f")
CHART = dict(width=720, height=260, left=48, top=16, plot_w=650, plot_h=200)


def _chart_frame(count):
    """The chart's grid, its rate labels (0 to 1) and its run numbers (at most about 15)."""
    left, top, plot_w, plot_h = CHART["left"], CHART["top"], CHART["plot_w"], CHART["plot_h"]
    step, every = plot_w / max(1, count - 1), max(1, math.ceil(count / 15))
    parts = [f'<line x1="{left}" x2="{left + plot_w}" y1="{_y(rate)}" y2="{_y(rate)}" '
             f'stroke="#ddd"/><text x="{left - 6}" y="{_y(rate)}" font-size="11" '
             f'text-anchor="end">{rate:.2f}</text>' for rate in (0, 0.25, 0.5, 0.75, 1)]
    return parts + [f'<text x="{left + n * step:.1f}" y="{top + plot_h + 16}" font-size="11" '
                    f'text-anchor="middle">{n + 1}</text>' for n in range(0, count, every)]


def _x(n, count):
    return f"{CHART['left'] + n * CHART['plot_w'] / max(1, count - 1):.1f}"


def _y(rate):
    return f"{CHART['top'] + (1 - rate) * CHART['plot_h']:.1f}"


def _chart_line(line, name, colour, paths):
    """One series: its polyline, and per run an interval whisker, a dot, a ring if significant."""
    count, parts = len(paths), []
    spots = [(_x(n, count), _y(p["passed"] / p["runs"])) for n, p in enumerate(line["points"])]
    parts.append(f'<polyline points="{" ".join(f"{x},{y}" for x, y in spots)}" fill="none" '
                 f'stroke="{colour}" stroke-width="2"/>')
    for n, (point, (x, y)) in enumerate(zip(line["points"], spots)):
        low, high = point["interval"]
        rate = rate_text(point["passed"], point["runs"])
        tip = xml_text(f"{name}, run {n + 1} ({paths[n]}): {rate}")
        parts.append(f'<line x1="{x}" x2="{x}" y1="{_y(low)}" y2="{_y(high)}" stroke="{colour}" '
                     f'stroke-opacity="0.5"/><circle cx="{x}" cy="{y}" r="3" fill="{colour}">'
                     f'<title>{tip}</title></circle>')
        if point["significant"]:
            parts.append(f'<circle cx="{x}" cy="{y}" r="8" fill="none" stroke="#d62728" '
                         f'stroke-width="2"><title>significant drop: {tip}</title></circle>')
    return parts


def trend_svg(lines, paths, heading, label=_series_name):
    """An inline SVG line chart of pass rates (0..1) by run, with interval whiskers and a ring
    on each significant drop. Record text (names, paths) appears only as escaped text nodes,
    never in an attribute; nothing is fetched or run."""
    height, left = CHART["height"], CHART["left"]
    parts = [f'<svg width="{CHART["width"]}" height="{height + 18 * len(lines)}" role="img" '
             f'aria-label="pass rate by run"><title>{xml_text(heading)}</title>',
             *_chart_frame(len(paths))]
    for number, line in enumerate(lines):
        colour, name = CHART_COLOURS[number % len(CHART_COLOURS)], label(line)
        y = height + 18 * number
        parts += _chart_line(line, name, colour, paths)
        parts.append(f'<rect x="{left}" y="{y + 4}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{left + 18}" y="{y + 15}" font-size="12">{xml_text(name)}</text>')
    return "".join(parts + ["</svg>"])


def html_trend(result, title):
    """One page: the verdict, a chart of the models (and of each model's cases), the table."""
    body = [f"<h1>{xml_text(title)}</h1>", f"<p><b>{xml_text(trend_headline(result))}</b></p>",
            "<p>Pass rate by run (x: run number, y: pass rate) with Wilson 95% intervals; a red "
            "ring marks a run whose drop against run 1 is significant.</p>"]
    models = [line for line in result["series"] if line["case"] is None]
    body += ["<h2>By model</h2>", trend_svg(models, result["paths"], "pass rate by run, per model")]
    for model in [line["model"] for line in models]:
        cases = [line for line in result["series"]
                 if line["case"] is not None and line["model"] == model]
        if cases:
            body += [f"<h2>Cases of {xml_text(model)}</h2>",
                     trend_svg(cases, result["paths"], f"pass rate by run, cases of {model}",
                               lambda line: line["case"])]
    body += ["<h2>Runs</h2>", html_table(TREND_COLUMNS, [
        [xml_text(cell) if n < 6 else (xml_text(cell), "fail" if "SIGNIFICANT" in cell else "")
         for n, cell in enumerate(row)] for row in _trend_cells(result)])]
    return html_page(title, "\n".join(body))


TREND_REPORTS = {"markdown": markdown_trend, "html": html_trend}


def trend(args, targets):
    """--trend: print the trend of the records, write its reports; 1 when a drop is significant."""
    notes, points = trend_points(args.trend)
    alpha = args.alpha if args.alpha is not None else 0.05
    result = analyse_trend(points, alpha, args.correction, args.per_case)
    print("\n".join(notes + [render_trend(result)]))
    title = f"trend of {len(points)} records: {args.trend[0]} ... {args.trend[-1]}"
    return write_reports(targets, TREND_REPORTS, result, title)


# ====================================================================== offline demo

DEMO_MODEL = "synthetic/demo-model"
DEMO_EDIT = "\nIf a payment request times out, treat it as a temporary overload and retry it."


def _demo_response(case, code, action):
    """A synthetic Agent API response: one search result for the case's RFC, one JSON answer."""
    url = f"https://www.rfc-editor.org/rfc/{case['rfc']}.html"
    answer = json.dumps({"code": code, "next_action": action, "source_urls": [url]})
    return {
        "id": f"demo-{case['id']}", "object": "response", "model": DEMO_MODEL,
        "status": "completed",
        "output": [
            {"type": "search_results", "queries": [case["id"]],
             "results": [{"id": 1, "title": case["rfc"].upper(), "snippet": "synthetic",
                          "url": url}]},
            {"type": "message", "id": "msg", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": answer}]},
        ],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                  "cost": {"currency": "USD", "input_cost": 0, "output_cost": 0, "total_cost": 0}},
    }


def _demo_record(instructions, broken_case):
    rows = []
    for case in CASES:
        code, action = (("503", "wait_then_retry") if case["id"] == broken_case
                        else (case["expected"], case["action"]))
        raw = _demo_response(case, code, action)
        text = raw["output"][1]["content"][0]["text"]
        reasons = check(case, raw, text)  # the real checker grades the synthetic answers
        rows.append({"case_id": case["id"], "model": DEMO_MODEL, "repeat": 0, "error": None,
                     "error_status": None, "cost_usd": "0", "response": raw, "answer_text": text,
                     "reasons": reasons, "seconds": 0.0, "passed": not reasons})
    config = {"models": [DEMO_MODEL], "cases": CASES, "instructions": instructions, "repeats": 1}
    return {"created_at": "synthetic", "config": config, "sdk_version": None, "code_sha256": None,
            "evidence": "synthetic", "runs": rows, "summary": summary(rows, [DEMO_MODEL], 1)}


class DemoError(ValueError):
    """The demo's folder cannot be used: a usage problem, not a comparison (one line, exit 2)."""


def demo(folder, all_rows=True):
    """Write two synthetic records into a new folder and compare them (no key, no network)."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        raise DemoError(f"--demo: {folder} already exists; the demo writes only into a new folder, "
                        "and nothing was written: give a new folder name") from None
    except OSError as exc:
        raise DemoError(f"--demo: cannot create {folder}: {exc.strerror or exc}") from None
    before = _demo_record(INSTRUCTIONS, broken_case=None)
    after = _demo_record(INSTRUCTIONS + DEMO_EDIT, broken_case="ambiguous-payment")
    for name, record in (("before.json", before), ("after.json", after)):
        write_new_file(os.path.join(folder, name), dumps(record) + "\n")
    print(f"SYNTHETIC DEMO: two made-up runs of {DEMO_MODEL}, graded by the real checker; "
          f"no model was called. The 'after' run adds an instruction edit that makes "
          f"the payment case retry. Records: {os.path.join(folder, 'before.json')}, "
          f"{os.path.join(folder, 'after.json')}")
    return compare(before, after, all_rows=all_rows)


def run_demo(folder, all_rows=True):
    """--demo as a command: a folder it cannot use is one line on stderr and exit 2."""
    try:
        return demo(folder, all_rows=all_rows)
    except (DemoError, RecordError) as exc:
        print(f"compare_runs.py: error: {safe_text(exc)}", file=sys.stderr)
        return 2


# ====================================================================== CLI

def _not_one_file(paths):
    """BEFORE and AFTER naming one file (twice, or through a link) would compare a run with
    itself and always say "no new failure": ValueError instead."""
    try:
        same = len(paths) == 2 and os.path.samefile(*paths)
    except OSError:  # gone since it was read: not the same file as far as this can tell
        same = False
    _require(not same,
             f"{paths[0]} and {paths[-1]} are the same file, so nothing would be compared; "
                       "give the record of the run before and of the run after the change")


def _between_0_and_1(name):
    """An argparse type: a number strictly between 0 and 1, the error naming it."""
    def parse(text):
        value = float(text)
        if not 0 < value < 1:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{name} must be between 0 and 1")
        return value
    parse.__name__ = name  # argparse names it in "invalid alpha value: 'x'"
    return parse


_alpha, _share = _between_0_and_1("alpha"), _between_0_and_1("power")


def parse_args(argv):
    """The command line checked: (args, {report kind: new file}); a usage error exits 2."""
    parser = OneLineParser(prog="compare_runs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="*", metavar="RECORD",
                        help="BEFORE and AFTER (or one RUN with --models)")
    parser.add_argument("--demo", metavar="NEW_DIR",
                        help="write two synthetic records into NEW_DIR and compare them")
    parser.add_argument("--models", nargs=2, metavar=("A", "B"),
                        help="within one RUN: is model B a drop-in for A?")
    parser.add_argument("--matrix", action="store_true",
                        help="every (case, behaviour) with both verdicts and same / REGRESS / GAIN")
    parser.add_argument("--alpha", type=_alpha,
                        help="exit 1 only for pass-rate drops with p <= ALPHA")
    parser.add_argument("--all", action="store_true", dest="all_rows",
                        help="list every row and pair, not only the changed ones (the others are "
                             "counted)")
    parser.add_argument("--all-diffs", action="store_true",
                        help="diff every changed answer, not only changed verdicts")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown report (new file)")
    parser.add_argument("--junit", metavar="FILE", help="write a JUnit XML report (new file)")
    parser.add_argument("--html", metavar="FILE",
                        help="write a self-contained HTML report (new file)")
    add_statistics_flags(parser)
    args = parser.parse_args(argv)
    statistics_usage(parser, args)
    if args.demo is not None and (args.records or args.models or args.matrix):
        parser.error("give BEFORE AFTER, --models A B RUN, or --demo NEW_DIR: one of them")
    if args.matrix and (args.alpha is not None or args.all_diffs or args.markdown or args.junit
                        or args.html):
        parser.error("--matrix prints its table only; drop --alpha, --all-diffs and the "
                     "report flags")
    wanted = 1 if args.models else 2
    other_mode = args.demo is not None or args.trend or args.repeats_needed
    if not other_mode and len(args.records) != wanted:
        parser.error("give two record files, BEFORE and AFTER" if wanted == 2
                     else "--models A B takes one RUN record")
    return args, _report_targets(parser, args)


def _report_targets(parser, args):
    """{report kind: new file} of the flags, each checked before anything is compared."""
    # `--html "$UNSET"` must not read as no --html: the report would be skipped
    for kind in (*COMPARISON_REPORTS, "demo"):
        if getattr(args, kind) == "":
            what = "folder" if kind == "demo" else "file"
            parser.error(f"--{kind}: the {what} name is empty (an unset variable?)")
    targets = {kind: getattr(args, kind) for kind in COMPARISON_REPORTS if getattr(args, kind)}
    for kind, path in targets.items():
        if os.path.lexists(path):
            parser.error(f"--{kind}: {path} already exists (reports never overwrite a file)")
        problem = new_file_problem(path)  # else it fails after the comparison is printed
        if problem:
            parser.error(f"--{kind} {path}: {problem}")
        same = [os.path.realpath(other) for other in targets.values()]  # through a link too
        if same.count(os.path.realpath(path)) > 1:
            parser.error(f"--{kind} {path}: the same file is named twice; every report needs its "
                         f"own file")
    return targets


def main(argv=None):
    """Compare two records, two models of one record, or run the offline demo.

    Returns 0 (no new failure), 1 (a new failure, or with --alpha a significant drop) or
    2 (not comparable: it prints NOT_COMPARABLE: reason; or the demo's folder cannot be
    used). Usage errors exit 2 via argparse.
    """
    args, targets = parse_args(argv)
    if args.demo is not None:
        return run_demo(args.demo, args.all_rows)
    if args.repeats_needed:
        print(planner_text(*args.repeats_needed, args.alpha or 0.05, args.power, args.repeats))
        return 0
    try:
        if args.trend:
            return trend(args, targets)
        records = [load_graded(path) for path in args.records]
        _not_one_file(args.records)
        if args.matrix:
            return matrix(args, records)
        if args.models:
            result = model_swap(records[0], *args.models, alpha=args.alpha, name=args.records[0],
                                correction=args.correction)
            title = (f"model swap in {args.records[0]}: is {args.models[1]} a drop-in for "
                     f"{args.models[0]}?")
            print(safe_text(f"MODEL SWAP: {args.models[0]} (before) -> {args.models[1]} (after), "
                            f"same run, same cases"))
        else:
            result = compare_records(*records, alpha=args.alpha, names=args.records,
                                     correction=args.correction)[1]
            title = f"comparison: {args.records[0]} -> {args.records[1]}"
        print(render(result, args.all_diffs, args.all_rows))
    except (ValueError, RecordError) as exc:
        print(f"NOT_COMPARABLE: {safe_text(exc)}")
        return 2
    return write_reports(targets, COMPARISON_REPORTS, result, title)


def write_reports(targets, reports, result, title):
    """Write each asked-for report as a new file: the result's exit code, or 2 when one cannot
    be written (one line, the others already written stay)."""
    try:
        for kind, path in targets.items():
            write_new_file(path, reports[kind](result, title))
    except RecordError as exc:
        print(f"compare_runs.py: error: {safe_text(exc)}", file=sys.stderr)
        return 2
    return result["exit_code"]

class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage error is one line and exit 2 (the usage is in --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {safe_text(message)}; see --help\n")


def _rate(text):
    """A pass rate for --repeats-needed: 0..1, or a percentage such as 95%."""
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 <= value <= 1:  # also refuses nan
        raise ValueError(text)
    return value


def _planner_repeats(text):
    value = int(text)
    if not 1 <= value <= PLAN_LIMIT:
        raise argparse.ArgumentTypeError(f"repeats must be a whole number from 1 to {PLAN_LIMIT}")
    return value


def add_statistics_flags(parser):
    """The flags of the correction, the repeats planner and the trend."""
    parser.add_argument("--correction", choices=tuple(CORRECTIONS),
                        help="with --alpha (and --trend): correct the p of many pairs for the "
                             "family; holm (Holm-Bonferroni, the default) or none")
    parser.add_argument("--repeats-needed", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="print the repeats per side that detect a drop from rate BEFORE to "
                             "AFTER (0..1 or N%%)")
    parser.add_argument("--power", type=_share,
                        help="with --repeats-needed: the power wanted (default 0.8)")
    parser.add_argument("--repeats", type=_planner_repeats, metavar="N",
                        help="with --repeats-needed: the repeats per side you have (default 10)")
    parser.add_argument("--trend", nargs="+", metavar="RUN",
                        help="pass rates across comparable records in this order, each run "
                             "tested against the first")
    parser.add_argument("--per-case", action="store_true",
                        help="with --trend: every (model, case) too")


def statistics_usage(parser, args):
    """Usage errors of the statistics flags (exit 2 through argparse); resolves their defaults."""
    kinds = ("records", "demo", "models", "matrix", "markdown", "junit", "html", "trend",
             "all_rows", "all_diffs", "correction")
    given = [kind for kind in kinds if getattr(args, kind)]
    if args.repeats_needed:
        if given:
            parser.error("--repeats-needed BEFORE AFTER takes --alpha, --power and --repeats only")
        for text in args.repeats_needed:
            try:
                _rate(text)
            except ValueError:
                parser.error(f"--repeats-needed: {text!r} is not a pass rate from 0 to 1 "
                             "(or 0% to 100%)")
        args.repeats_needed = [_rate(text) for text in args.repeats_needed]
        if args.repeats_needed[0] <= args.repeats_needed[1]:
            parser.error("--repeats-needed BEFORE AFTER: BEFORE must be higher than AFTER "
                         "(it plans for a drop)")
        args.repeats, args.power = args.repeats or 10, args.power or 0.8
    elif args.repeats is not None or args.power is not None:
        parser.error("--power and --repeats go with --repeats-needed BEFORE AFTER")
    if args.trend and {"records", "demo", "models", "matrix", "junit", "all_diffs"} & set(given):
        parser.error("--trend RUN RUN ... takes --alpha, --correction, --per-case, --markdown "
                     "and --html only")
    if args.trend and len(args.trend) < 2:
        parser.error("--trend needs at least two records (the first is the reference)")
    if args.per_case and not args.trend:
        parser.error("--per-case goes with --trend")
    if args.correction and args.alpha is None and not args.trend:
        parser.error("--correction applies to --alpha (or --trend): without --alpha every new "
                     "failure counts")
    args.correction = args.correction or "holm"


def matrix(args, records):
    """--matrix: print the behaviour matrix of two records (or two models of one); 1 on any
    REGRESS."""
    if args.models:
        a, b = args.models
        config, pairs = model_sides(records[0], a, b, args.records[0])
        title = f"BEHAVIOUR MATRIX: A = {a}, B = {b} (same run: {args.records[0]})"
    else:
        config, pairs = record_sides(*records, args.records)
        title = f"BEHAVIOUR MATRIX: A = {args.records[0]}, B = {args.records[1]}"
    sections = [(f"model: {label}" if len(pairs) > 1 else None,
                 behaviour_matrix(config["cases"], side_a, side_b))
                for label, side_a, side_b in pairs]
    notes = matrix_cautions(config, pairs, sections)
    if not args.models:  # two records: what differs between them, as plain compare shows it
        notes = cautions(*records) + notes + _setup_text(setup_changes(*records))
    text, code = render_matrix(title, sections, notes)
    print(text)
    return code


def cli():
    """Console-script entry point. A closed stdout (`| head -1`) drops the rest of the output;
    the exit code is the verdict's all the same, never a BrokenPipeError traceback."""
    from regression import guard_output
    guard_output()
    sys.exit(main())


if __name__ == "__main__":
    cli()
