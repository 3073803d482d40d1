"""Compare two saved agent-regression records and show which approved decision changed.

Usage:
    python compare_runs.py BEFORE.json AFTER.json
    python compare_runs.py BEFORE.json AFTER.json --alpha 0.05 --html diff.html
    python compare_runs.py --models A B RUN.json   # within one run: is model B a drop-in for A?
    python compare_runs.py --matrix BEFORE.json AFTER.json   # every (case, behaviour): same / REGRESS / GAIN
    python compare_runs.py --matrix --models A B RUN.json
    python compare_runs.py --demo NEW_DIR          # offline: two synthetic runs, no key

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
often (REGRESS) or less often (GAIN), pass rates over repeats with FLAKY and a
one-sided Fisher exact p for a drop, and a diff of each answer whose verdict changed.

Exit codes:
    0  comparable, no new failure
    1  comparable, at least one NEW_FAILURE (with --alpha: a drop with p <= alpha; with --matrix: a REGRESS)
    2  not comparable (missing file, bad JSON, different config, incomplete run, ...)
"""

import argparse
import collections
import difflib
import fractions
import json
import math
import os
import sys

from regression import (CASES, CHECK_KEYS, CHECK_TABLE, INSTRUCTIONS, RecordError, check, dumps, html_page,
                        html_table, junit_name, junit_xml, key_text, load_record, md_table, md_text, plan_rows,
                        record_problem, row_key, safe_text, summary, tool_sequence, write_new_file, xml_text)


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
    _require(expected_count == len(runs) or expected_count <= 100_000,  # never expand an absurd plan in memory
             f"the run is incomplete: {len(runs)} rows for {expected_count} expected")
    rows = {}
    for position, row in enumerate(runs):
        key = row_key(row)
        _require(key not in rows, f"duplicate row {_name(key)}")
        _require(row.get("error") is None, f"row {_name(key)} has an execution error ({row.get('error')})")
        reasons = row.get("reasons")
        _require(isinstance(reasons, list) and all(isinstance(reason, str) for reason in reasons),
                 f"row {_name(key)}: reasons is not a list of strings")
        _require(row.get("passed") is (not reasons), f"row {_name(key)}: passed disagrees with reasons")
        rows[key] = row
    expected = set(plan_rows(models, case_ids, repeats))
    extra = [key for key in rows if key not in expected]
    _require(not extra, f"row {_name(extra[0])} is not in models x cases x repeats" if extra else "")
    missing = [key for key in plan_rows(models, case_ids, repeats) if key not in rows]
    _require(not missing, f"the run is incomplete: {len(missing)} of {len(expected)} rows missing"
             f" (first: {_name(missing[0])})" if missing else "")
    return rows


_name = key_text  # the one spelling of a row key in messages


# ====================================================================== comparison

LABELS = {(True, False): "NEW_FAILURE", (False, True): "RECOVERED",
          (True, True): "PASS", (False, False): "STILL_FAILING"}


IGNORED_CASE_KEYS = ("instructions_sha256", "notes")  # a pin follows the instructions; notes are for people
_ABSENT = object()


def _config_view(config, without_checks=False):
    """The part of a config two comparable records share: all but the instructions and
    the cases' pins and notes (and, for a regrade, the cases' check keys and sources)."""
    view = {key: value for key, value in config.items()
            if key != "instructions" and not (without_checks and key == "sources")}
    if isinstance(view.get("cases"), list):
        dropped = IGNORED_CASE_KEYS + (tuple(CHECK_KEYS) if without_checks else ())
        view["cases"] = [{key: value for key, value in case.items() if key not in dropped}
                         if isinstance(case, dict) else case for case in view["cases"]]
    return view


def _ids(items):
    """The ids of a list of objects with distinct string ids, else None."""
    ids = [item.get("id") for item in items if isinstance(item, dict)]
    if len(ids) == len(items) and all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids):
        return ids
    return None


def _child(path, key):
    if isinstance(key, int):
        return f"{path}[{key}]"
    if key.isidentifier() and key.isprintable():
        return f"{path}.{key}" if path else key
    return f"{path}[{_visible(json.dumps(key, ensure_ascii=False))}]"


def same_json(old, new):
    """Whether two JSON values are the same JSON: Python's == calls true, 1 and 1.0 equal, but
    a request or tool schema that says `"strict": 1` instead of `true` is not the same config.
    Object key order is not a difference."""
    if old is _ABSENT or new is _ABSENT:
        return old is new
    try:
        return json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True)
    except (TypeError, ValueError):  # not JSON (an in-process caller): Python's equality
        return old == new


def first_difference(old, new, path=""):
    """(path, old, new) of the first place two JSON values differ, or None when equal.

    A list of objects with ids (the cases) is matched by id, so the path names the case:
    cases["refund-policy"].contains. A value missing on one side is _ABSENT. Values are
    compared as JSON (same_json): true and 1 differ."""
    if same_json(old, new):
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(key for key in new if key not in old)]:
            found = first_difference(old.get(key, _ABSENT), new.get(key, _ABSENT), _child(path, key))
            if found:
                return found
    elif isinstance(old, list) and isinstance(new, list):
        old_ids, new_ids = _ids(old), _ids(new)
        if old_ids is not None and new_ids is not None:
            by_old, by_new = dict(zip(old_ids, old)), dict(zip(new_ids, new))
            for key in [*old_ids, *(key for key in new_ids if key not in by_old)]:
                found = first_difference(by_old.get(key, _ABSENT), by_new.get(key, _ABSENT),
                                         f"{path}[{_visible(json.dumps(key, ensure_ascii=False))}]")
                if found:
                    return found
            if old_ids != new_ids:
                return (f"{path} order", old_ids, new_ids)
        elif any(isinstance(item, (dict, list)) for item in [*old, *new]):  # a list of strings is shown whole
            for position in range(max(len(old), len(new))):
                found = first_difference(old[position] if position < len(old) else _ABSENT,
                                         new[position] if position < len(new) else _ABSENT, _child(path, position))
                if found:
                    return found
    return (path or "(the whole value)", old, new)


SHORT = 60


def _visible(text):
    """Text with every non-printable character shown as an escape (no terminal tricks)."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def shorten(value, other=_ABSENT):
    """A value as short JSON for a one-line message; a long string is shown around the first
    character where it differs from `other`."""
    if value is _ABSENT:
        return "(absent)"
    if isinstance(value, str) and isinstance(other, str) and len(value) > SHORT:
        start = next((n for n, (a, b) in enumerate(zip(value, other)) if a != b), min(len(value), len(other)))
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


REGRADE_HINT = ("the checks differ: regrade the earlier record with the new suite "
                "(python regression.py --provider replay --replay BEFORE.json --suite SUITE --out REGRADED.json) "
                "and compare BEFORE.json with REGRADED.json")


def _comparable(before, after):
    """Raise ValueError (naming the first difference) unless the two records may be compared.

    Returns None for an ordinary comparison, or for a record and its replay whose cases
    differ only in their checks, the ids of the cases whose checks changed (a REGRADE)."""
    for side, record in (("before", before), ("after", after)):
        problem = record_problem(record, evidence=False)  # index() asks for the verdicts' evidence
        _require(problem is None, f"{side} is not a usable record: {problem}")
    labels = (before.get("evidence", "live"), after.get("evidence", "live"))
    replay_pair = _replayed(after, before) or _replayed(before, after)
    try:
        difference = first_difference(_config_view(before["config"]), _config_view(after["config"]))
        blocking = difference and first_difference(_config_view(before["config"], True),
                                                   _config_view(after["config"], True))
    except RecursionError:
        raise ValueError("the configs are nested too deeply to compare") from None
    regrade = replay_pair and not blocking  # a replay with the same checks regrades with the current checker
    if difference is not None and not regrade:
        # For a record and its replay, name what keeps them apart (an input, not a check).
        path, old, new = blocking if replay_pair and blocking else difference
        raise ValueError(f"{path} differs: {' -> '.join(shown_pair(old, new))}"
                         + (f"; {REGRADE_HINT}" if blocking is None else " (only the instructions may differ)"))
    _require(labels[0] == labels[1], f"evidence differs: {labels[0]} vs {labels[1]}")
    if not regrade:
        return None
    _same_evidence(before, after)

    def cases(record):
        found = _config_view(record["config"]).get("cases")
        return [case for case in found if isinstance(case, dict)] if isinstance(found, list) else []
    old_cases = {case.get("id"): case for case in cases(before)}
    return [str(case.get("id")) for case in cases(after)
            if not same_json(old_cases.get(case.get("id"), _ABSENT), case)] + \
        (["(sources)"] if not same_json(before["config"].get("sources"), after["config"].get("sources")) else [])


def _same_evidence(before, after):
    """A regrade claims the same evidence graded by other checks: the same instructions and,
    row by row, the same stored responses (every round of a played row). Otherwise the
    "after" side answered something else, and a regrade would call that no change."""
    _require(before["config"].get("instructions") == after["config"].get("instructions"),
             "config.instructions differs: a replay re-grades the stored responses and cannot test an "
             "instruction change; run the new instructions live and compare those records")
    rows_before, rows_after = index(before), index(after)
    for key, row in rows_before.items():
        other = rows_after.get(key) or {}
        _require(same_json(row.get("response"), other.get("response"))
                 and same_json(row.get("rounds"), other.get("rounds")),
                 f"a replay must keep the stored responses, but {_name(key)} differs")


def fisher_drop(passed_before, runs_before, passed_after, runs_after):
    """One-sided Fisher exact p-value that the pass rate dropped, computed exactly with integers.

    It is the chance, with the total passes fixed, that the 'before' side holds at least
    as many passes as it did if both sides had the same underlying pass rate.
    """
    total, passes = runs_before + runs_after, passed_before + passed_after
    tail = sum(math.comb(passes, x) * math.comb(total - passes, runs_before - x)
               for x in range(passed_before, min(runs_before, passes) + 1))
    return float(fractions.Fraction(tail, math.comb(total, runs_before)))


def _answer_diff(old, new):
    a, b = old.get("answer_text"), new.get("answer_text")
    if a == b or not isinstance(a, str) or not isinstance(b, str):
        return None
    return "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "before", "after", lineterm=""))


def analyse(pairs, alpha=None):
    """The comparison of paired rows [(key, old, new)]: labels, per-check changes, pass rates, diffs."""
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
        before = collections.Counter(reason for row in old for reason in row["reasons"])
        after = collections.Counter(reason for row in new for reason in row["reasons"])
        group.update(
            regress=sorted(reason for reason in after if after[reason] > before[reason]),
            gain=sorted(reason for reason in before if before[reason] > after[reason]),
            counts={reason: (before[reason], after[reason]) for reason in set(before) | set(after)},
            passed_before=sum(row["passed"] for row in old), runs_before=len(old),
            passed_after=sum(row["passed"] for row in new), runs_after=len(new))
        group["p"] = fisher_drop(group["passed_before"], len(old), group["passed_after"], len(new))
        group["flaky"] = [side for side, passed, runs in (("before", group["passed_before"], len(old)),
                                                          ("after", group["passed_after"], len(new)))
                          if 0 < passed < runs]
        group["dropped"] = group["passed_after"] * len(old) < group["passed_before"] * len(new)
    groups = list(groups.values())
    new_failures = sum(row["label"] == "NEW_FAILURE" for row in rows)
    significant = [g for g in groups if g["dropped"] and alpha is not None and g["p"] <= alpha]
    exit_code = (1 if significant else 0) if alpha is not None else (1 if new_failures else 0)
    return {"rows": rows, "groups": groups, "new_failures": new_failures, "alpha": alpha,
            "significant": significant, "exit_code": exit_code, "regrade": None,
            "repeats": max((g["runs_before"] for g in groups), default=0)}


def _key_text(key):
    """A row key for the console: names from a record are made visible, never interpreted."""
    model, case_id, repeat = key
    return safe_text(f"{model}  {case_id}  repeat {repeat}")


def changed(row):
    """A row worth its own line: the verdict flipped, or a failing row's reasons changed."""
    return row["label"] in ("NEW_FAILURE", "RECOVERED") or row["before"] != row["after"]


def group_changed(group):
    return group["passed_before"] != group["passed_after"] or group["flaky"] or group["regress"] or group["gain"]


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
        return f"NEW FAILURES (exit 1): {rows}" if result["exit_code"] else f"no new failure (exit 0): {rows}"
    alpha = result["alpha"]
    if result["exit_code"]:
        return (f"SIGNIFICANT DROP (exit 1): {_plural(len(result['significant']), 'model/case pair')} dropped at "
                f"p <= {alpha}; {rows}")
    return f"no significant drop (exit 0): {rows}, none at p <= {alpha}"


def _counts_text(counts):
    return ", ".join(f"{label} {count:,}" for label, count in counts.items())


def diff_groups(rows):
    """Identical answer diffs once: [(model, case, label, diff, [repeats])] in first-seen order."""
    groups = {}
    for row in rows:
        model, case_id, repeat = row["key"]
        groups.setdefault((model, case_id, row["label"], row["diff"]), []).append(repeat)
    return [(*key, repeats) for key, repeats in groups.items()]


def _repeats_text(repeats):
    return f"repeat {repeats[0]}" if len(repeats) == 1 else f"repeats {', '.join(map(str, repeats))}"


def _sequence_text(names):
    return safe_text(" -> ".join(map(str, names))) if names else "(no tool call)"  # tool names come from a model


def _tools_changed(row):
    """A row whose tool sequence changed, or whose verdict changed while it called tools."""
    before, after = row.get("tools_before") or [], row.get("tools_after") or []
    return before != after or (row["label"] in ("NEW_FAILURE", "RECOVERED") and bool(before or after))


def render(result, all_diffs=False, all_rows=True):
    """The console text of a comparison: the SPEC A9 row lines first, then what changed and why.

    all_rows=False (the command's default) lists only the rows that changed and counts
    the unchanged ones per label, so a large unchanged run stays a few lines long."""
    lines = []
    if result.get("regrade") is not None:
        lines.append(safe_text("REGRADE: the same stored responses graded with changed checks; cases whose checks "
                               f"changed: {', '.join(result['regrade']) or 'none'}"))
    listed = [row for row in result["rows"] if all_rows or changed(row)]
    lines += [f"{row['label']:<13}  {_key_text(row['key'])}  "
              f"before={json.dumps(row['before'])}  after={json.dumps(row['after'])}" for row in listed]
    if not all_rows:
        lines += [f"{label} {count:,} (unchanged rows, not listed; --all lists every row)"
                  for label, count in unchanged_counts(result["rows"]).items()]
    moved = [g for g in result["groups"] if g["regress"] or g["gain"]]
    if moved:
        lines += ["", "changes by check (how often each reason occurred, before->after, over all repeats):"]
        for g in moved:
            if g["regress"]:
                lines.append(safe_text(f"REGRESS        {g['model']}  {g['case']}  " + "  ".join(
                    f"+{r} {g['counts'][r][0]}->{g['counts'][r][1]}" for r in g["regress"])))
            if g["gain"]:
                lines.append(safe_text(f"GAIN           {g['model']}  {g['case']}  " + "  ".join(
                    f"-{r} {g['counts'][r][0]}->{g['counts'][r][1]}" for r in g["gain"])))
    if result["repeats"] > 1:
        rated = [g for g in result["groups"] if all_rows or group_changed(g)]
        lines += ["", "pass rates over repeats (p: one-sided Fisher exact test that the rate dropped):"]
        for g in rated:
            flaky = f"  FLAKY({','.join(g['flaky'])})" if g["flaky"] else ""
            lines.append(f"RATE           {safe_text(g['model'])}  {safe_text(g['case'])}  {g['passed_before']}/{g['runs_before']} -> "
                         f"{g['passed_after']}/{g['runs_after']}  p={g['p']:.4f}{flaky}")
        if len(rated) < len(result["groups"]):
            lines.append(f"RATE unchanged: {len(result['groups']) - len(rated):,} model/case pair(s) with the same "
                         "pass count and no flakiness (--all lists them)")
    sequences = [row for row in result["rows"] if _tools_changed(row)]
    if sequences:
        lines += ["", "tool sequences of changed rows (before vs after):"]
        lines += [safe_text(f"TOOLS          {_key_text(row['key'])}  {_sequence_text(row['tools_before'])}  vs  "
                            f"{_sequence_text(row['tools_after'])}") for row in sequences]
    diffs = [row for row in result["rows"] if row["diff"] and (all_diffs or row["label"] in ("NEW_FAILURE", "RECOVERED"))]
    if diffs:
        lines += ["", "answers that changed (unified diff before -> after; an identical diff is shown once):"]
        for model, case_id, label, diff, repeats in diff_groups(diffs):
            lines += [safe_text(f"== {model}  {case_id}  {_repeats_text(repeats)} ({LABEL_WORDS[label]})"),
                      safe_text(diff, newlines=True)]
    lines.append("")
    lines.append(f"verdict: {headline(result)}")
    if result["alpha"] is not None:
        smallest = 1 / math.comb(2 * result["repeats"], result["repeats"]) if result["repeats"] else 1
        if smallest > result["alpha"]:
            lines.append(f"note: with {result['repeats']} repeat(s) per side no drop can reach p <= {result['alpha']} "
                         f"(the smallest possible p is {smallest:.4f}); add --repeats")
    return "\n".join(lines)


def cautions(before, after):
    """Differences that do not block a comparison but may explain it."""
    notes = [safe_text(f"CAUTION {field} differs: {before.get(field)} -> {after.get(field)}")
             for field in ("sdk_version", "code_sha256") if before.get(field) != after.get(field)]
    if (before.get("provider") or {"name": "perplexity"}) != (after.get("provider") or {"name": "perplexity"}):
        notes.append(safe_text(f"CAUTION provider differs: {before.get('provider')} -> {after.get('provider')}"))
    return notes


def compare_records(before, after, alpha=None):
    """Check two records are comparable and analyse them; (cautions, result). ValueError otherwise."""
    regrade = _comparable(before, after)
    rows_before, rows_after = index(before), index(after)
    config = before["config"]
    plan = plan_rows(config["models"], [case["id"] for case in config["cases"]], config["repeats"])
    result = analyse([(key, rows_before[key], rows_after[key]) for key in plan], alpha)
    result["regrade"] = regrade
    return cautions(before, after), result


def compare(before, after, alpha=None, all_diffs=False, all_rows=True):
    """SPEC A9: print one line per row key (and what changed); 1 if any NEW_FAILURE, else 0.

    With alpha, the exit code follows pass-rate drops with p <= alpha instead. With
    all_rows=False only the changed rows get a line and the others are counted.
    Raises ValueError when the records are not comparable.
    """
    notes, result = compare_records(before, after, alpha)
    print("\n".join(notes + [render(result, all_diffs, all_rows)]))
    return result["exit_code"]


def model_swap(record, model_a, model_b, alpha=None):
    """Pair model A's rows (before) with model B's (after) in one run: is B a drop-in for A?"""
    rows = index(record)
    config = record["config"]
    for model in (model_a, model_b):
        _require(model in config["models"], f"model {model!r} is not in this run ({', '.join(config['models'])})")
    _require(model_a != model_b, "give two different models")
    label = f"{model_a} -> {model_b}"
    pairs = [((label, case["id"], repeat), rows[(model_a, case["id"], repeat)], rows[(model_b, case["id"], repeat)])
             for repeat in range(config["repeats"]) for case in config["cases"]]
    return analyse(pairs, alpha)


# ====================================================================== behaviour matrix
# The golden-behaviours harness's model-swap view: every (case, behaviour) of the suite with
# both sides' verdicts, not only the changed ones. A behaviour's verdict is read from the
# reasons its check can give; a reason no declared rule explains gets a row of its own, so a
# failure is never hidden.

MATRIX_COLUMNS = ["case_id", "behavior", "A", "B", "delta"]


def _explains(check, reason):
    """Whether a check (a regression.CHECK_TABLE entry, or None) gives this reason ("wrong_<field>" is a family)."""
    return check is not None and any(
        reason == name or (name.endswith("<field>") and reason.startswith(name[:-len("<field>")]))
        for name in check.reasons)


def case_rules(case):
    """[(rule, check)] a case declares: each behaviour entry in its order, then each other check
    its keys switch on, in run order (read from the check table, so a new check needs no edit here)."""
    by_name = {check.name: check for check in CHECK_TABLE}
    behaviors = case.get("behaviors") if isinstance(case.get("behaviors"), list) else []
    rules = [(entry, by_name.get(entry.partition(":")[0])) for entry in behaviors if isinstance(entry, str)]
    return rules + [(check.name, check) for check in CHECK_TABLE
                    if not check.behavior and not check.always and check.active(case)]


def _verdict(rows, explains):
    """(passes, runs) of one rule over a side's rows (one per repeat)."""
    return sum(not any(explains(reason) for reason in row["reasons"]) for row in rows), len(rows)


def _verdict_text(passes, runs):
    return "PASS" if passes == runs else "FAIL" if passes == 0 else f"{passes}/{runs}"


def behaviour_matrix(cases, side_a, side_b):
    """Rows [case_id, behavior, A, B, delta] for every (case, rule); side_x: {case_id: [rows]}."""
    table = []
    for case in cases:
        rows_a, rows_b = side_a[case["id"]], side_b[case["id"]]
        rules = [(rule, lambda reason, check=check: _explains(check, reason)) for rule, check in case_rules(case)]
        seen = [reason for row in rows_a + rows_b for reason in row["reasons"]]
        rules += [(reason, lambda other, reason=reason: other == reason) for reason in dict.fromkeys(seen)
                  if not any(explains(reason) for _, explains in rules)]
        for rule, explains in rules:
            (pass_a, runs_a), (pass_b, runs_b) = _verdict(rows_a, explains), _verdict(rows_b, explains)
            # compare pass rates (a side may have a different number of repeats only in theory)
            delta = "same" if pass_a * runs_b == pass_b * runs_a else \
                "REGRESS" if pass_b * runs_a < pass_a * runs_b else "GAIN"
            table.append([case["id"], rule, _verdict_text(pass_a, runs_a), _verdict_text(pass_b, runs_b), delta])
    return table


def _sides(rows, model, repeats, cases):
    return {case["id"]: [rows[(model, case["id"], repeat)] for repeat in range(repeats)] for case in cases}


def matrix_records(before, after):
    """Two comparable records: per model, the matrix of before (A) against after (B)."""
    _comparable(before, after)
    rows_a, rows_b = index(before), index(after)
    config = before["config"]
    return [(model, behaviour_matrix(config["cases"], _sides(rows_a, model, config["repeats"], config["cases"]),
                                     _sides(rows_b, model, config["repeats"], config["cases"])))
            for model in config["models"]]


def matrix_models(record, model_a, model_b):
    """One record: the matrix of model A against model B on the same cases."""
    rows = index(record)
    config = record["config"]
    for model in (model_a, model_b):
        _require(model in config["models"], f"model {model!r} is not in this run ({', '.join(config['models'])})")
    _require(model_a != model_b, "give two different models")
    return behaviour_matrix(config["cases"], _sides(rows, model_a, config["repeats"], config["cases"]),
                            _sides(rows, model_b, config["repeats"], config["cases"]))


def render_matrix(title, sections):
    """The console text of [(heading or None, table)]: aligned columns, then the verdict."""
    lines = [safe_text(title)]
    for heading, table in sections:
        shown = [[safe_text(cell) for cell in row] for row in [MATRIX_COLUMNS] + table]  # record text, made visible
        widths = [max(len(row[n]) for row in shown) for n in range(len(MATRIX_COLUMNS))]
        if heading:
            lines += ["", safe_text(heading)]
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in shown]
    deltas = [row[4] for _, table in sections for row in table]
    code = 1 if "REGRESS" in deltas else 0
    lines += ["", f"verdict: {deltas.count('REGRESS')} REGRESS, {deltas.count('GAIN')} GAIN, "
                  f"{deltas.count('same')} same -> exit {code}"]
    return "\n".join(lines), code


# ====================================================================== reports

def _reasons_text(reasons):
    return ", ".join(reasons) or "pass"


def markdown_comparison(result, title):
    """Markdown for a CI job summary: the changed rows and pairs, the unchanged ones counted."""
    counts = unchanged_counts(result["rows"])
    listed = [row for row in result["rows"] if changed(row)]
    lines = [f"## {md_text(title)}", "", f"**{md_text(headline(result))}**"]
    if result.get("regrade") is not None:
        lines += ["", "REGRADE: the same stored responses graded with changed checks; cases whose checks changed: "
                  + md_text(", ".join(result["regrade"]) or "none")]
    lines += ["", md_table(["label", "model", "case", "repeat", "before", "after"], [
        [row["label"], md_text(row["key"][0]), md_text(row["key"][1]), md_text(row["key"][2]),
         md_text(_reasons_text(row["before"])), md_text(_reasons_text(row["after"]))]
        for row in listed]) if listed else "No row changed."]
    if counts:
        lines += ["", f"Unchanged rows (not listed): {md_text(_counts_text(counts))}."]
    moved = [g for g in result["groups"] if group_changed(g)]
    lines += ["", "### By model and case", ""]
    lines.append(md_table(
        ["model", "case", "passes before -> after", "p (drop)", "occurred more often", "occurred less often"],
        [[md_text(g["model"]), md_text(g["case"]),
          f"{g['passed_before']}/{g['runs_before']} -> {g['passed_after']}/{g['runs_after']}"
          + (" FLAKY" if g["flaky"] else ""), f"{g['p']:.4f}",
          md_text(", ".join(f"{r} {g['counts'][r][0]}->{g['counts'][r][1]}" for r in g["regress"])),
          md_text(", ".join(f"{r} {g['counts'][r][0]}->{g['counts'][r][1]}" for r in g["gain"]))]
         for g in moved]) if moved else "No model/case pair changed.")
    if len(moved) < len(result["groups"]):
        lines += ["", f"{len(result['groups']) - len(moved):,} model/case pair(s) unchanged (not listed)."]
    sequences = [row for row in result["rows"] if _tools_changed(row)]
    if sequences:
        lines += ["", "### Tool sequences of changed rows", "", md_table(
            ["label", "model", "case", "repeat", "tools before", "tools after"],
            [[row["label"], md_text(row["key"][0]), md_text(row["key"][1]), str(row["key"][2]),
              md_text(_sequence_text(row["tools_before"])), md_text(_sequence_text(row["tools_after"]))]
             for row in sequences])]
    return "\n".join(lines) + "\n"


def junit_comparison(result, title):
    """JUnit XML: one testcase per row key with a stable name (the label is in the outcome,
    never in the name); a model's dots are escaped so viewers do not split it into packages."""
    suites = {}
    significant = {(g["model"], g["case"]) for g in result["significant"]}
    for row in result["rows"]:
        model, case_id, repeat = row["key"]
        case = {"classname": f"compare.{junit_name(model)}", "name": f"{case_id} [repeat {repeat}]",
                "seconds": row["seconds"]}
        failing = (model, case_id) in significant if result["alpha"] is not None else row["label"] == "NEW_FAILURE"
        if failing:
            case["failure"] = (f"{row['label']}: {json.dumps(row['after'])}",
                               f"{LABEL_WORDS[row['label']]}\nbefore: {json.dumps(row['before'])}\n"
                               f"after: {json.dumps(row['after'])}\n{row['diff'] or ''}")
        suites.setdefault(model, []).append(case)
    return junit_xml(title, list(suites.items()))


def html_comparison(result, title):
    """One page: the verdict, the changed pairs and rows (unchanged ones counted), the diffs."""
    css = {"NEW_FAILURE": "fail", "RECOVERED": "pass", "PASS": "", "STILL_FAILING": "error"}
    counts = unchanged_counts(result["rows"])
    listed = [row for row in result["rows"] if changed(row)]
    moved = [g for g in result["groups"] if group_changed(g)]
    body = [f"<h1>{xml_text(title)}</h1>", f"<p><b>{xml_text(headline(result))}</b></p>"]
    if result.get("regrade") is not None:
        body.append("<p>REGRADE: the same stored responses graded with changed checks; cases whose checks "
                    f"changed: {xml_text(', '.join(result['regrade']) or 'none')}</p>")
    body += ["<h2>By model and case</h2>",
             html_table(["model", "case", "passes before -> after", "p (drop)", "occurred more often (REGRESS)",
                         "occurred less often (GAIN)"],
                        [[xml_text(g["model"]), xml_text(g["case"]),
                          (f"{g['passed_before']}/{g['runs_before']} -> {g['passed_after']}/{g['runs_after']}"
                           + (" FLAKY" if g["flaky"] else ""), "flaky" if g["flaky"] else
                           "fail" if g["dropped"] else ""), f"{g['p']:.4f}",
                          xml_text(", ".join(f"{r} {g['counts'][r][0]}->{g['counts'][r][1]}" for r in g["regress"])),
                          xml_text(", ".join(f"{r} {g['counts'][r][0]}->{g['counts'][r][1]}" for r in g["gain"]))]
                         for g in moved]) if moved else "<p>No model/case pair changed.</p>"]
    if len(moved) < len(result["groups"]):
        body.append(f"<p>{len(result['groups']) - len(moved):,} model/case pair(s) unchanged (not listed).</p>")
    body += ["<h2>Rows that changed</h2>",
             html_table(["label", "model", "case", "repeat", "before", "after"],
                        [[(xml_text(row["label"]), css[row["label"]]), xml_text(row["key"][0]),
                          xml_text(row["key"][1]), xml_text(row["key"][2]),
                          xml_text(_reasons_text(row["before"])), xml_text(_reasons_text(row["after"]))]
                         for row in listed]) if listed else "<p>No row changed.</p>"]
    if counts:
        body.append(f"<p>Unchanged rows (not listed): {xml_text(_counts_text(counts))}.</p>")
    sequences = [row for row in result["rows"] if _tools_changed(row)]
    if sequences:
        body += ["<h2>Tool sequences of changed rows</h2>", html_table(
            ["label", "model", "case", "repeat", "tools before", "tools after"],
            [[(xml_text(row["label"]), css[row["label"]]), xml_text(row["key"][0]), xml_text(row["key"][1]),
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


COMPARISON_REPORTS = {"markdown": markdown_comparison, "junit": junit_comparison, "html": html_comparison}


# ====================================================================== offline demo

DEMO_MODEL = "synthetic/demo-model"
DEMO_EDIT = "\nIf a payment request times out, treat it as a temporary overload and retry it."


def _demo_response(case, code, action):
    """A synthetic Agent API response: one search result for the case's RFC, one JSON answer."""
    url = f"https://www.rfc-editor.org/rfc/{case['rfc']}.html"
    answer = json.dumps({"code": code, "next_action": action, "source_urls": [url]})
    return {
        "id": f"demo-{case['id']}", "object": "response", "model": DEMO_MODEL, "status": "completed",
        "output": [
            {"type": "search_results", "queries": [case["id"]],
             "results": [{"id": 1, "title": case["rfc"].upper(), "snippet": "synthetic", "url": url}]},
            {"type": "message", "id": "msg", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": answer}]},
        ],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                  "cost": {"currency": "USD", "input_cost": 0, "output_cost": 0, "total_cost": 0}},
    }


def _demo_record(instructions, broken_case):
    rows = []
    for case in CASES:
        code, action = ("503", "wait_then_retry") if case["id"] == broken_case else (case["expected"], case["action"])
        raw = _demo_response(case, code, action)
        text = raw["output"][1]["content"][0]["text"]
        reasons = check(case, raw, text)  # the real checker grades the synthetic answers
        rows.append({"case_id": case["id"], "model": DEMO_MODEL, "repeat": 0, "error": None,
                     "error_status": None, "cost_usd": "0", "response": raw, "answer_text": text,
                     "reasons": reasons, "seconds": 0.0, "passed": not reasons})
    config = {"models": [DEMO_MODEL], "cases": CASES, "instructions": instructions, "repeats": 1}
    return {"created_at": "synthetic", "config": config, "sdk_version": None, "code_sha256": None,
            "evidence": "synthetic", "runs": rows, "summary": summary(rows, [DEMO_MODEL], 1)}


def demo(folder, all_rows=True):
    """Write two synthetic records into a new folder and compare them (no key, no network)."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        raise ValueError(f"{folder} already exists; the demo writes only into a new folder") from None
    except OSError as exc:
        raise ValueError(f"cannot create {folder}: {exc.strerror or exc}") from None
    before = _demo_record(INSTRUCTIONS, broken_case=None)
    after = _demo_record(INSTRUCTIONS + DEMO_EDIT, broken_case="ambiguous-payment")
    for name, record in (("before.json", before), ("after.json", after)):
        write_new_file(os.path.join(folder, name), dumps(record) + "\n")
    print(f"SYNTHETIC DEMO: two made-up runs of {DEMO_MODEL}, graded by the real checker; "
          f"no model was called. The 'after' run adds an instruction edit that makes "
          f"the payment case retry. Records: {os.path.join(folder, 'before.json')}, "
          f"{os.path.join(folder, 'after.json')}")
    return compare(before, after, all_rows=all_rows)


# ====================================================================== CLI

def _not_one_file(paths):
    """BEFORE and AFTER naming one file (twice, or through a link) would compare a run with
    itself and always say "no new failure": ValueError instead."""
    try:
        same = len(paths) == 2 and os.path.samefile(*paths)
    except OSError:  # gone since it was read: not the same file as far as this can tell
        same = False
    _require(not same, f"{paths[0]} and {paths[-1]} are the same file, so nothing would be compared; "
                       "give the record of the run before and of the run after the change")


def _alpha(text):
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError("alpha must be between 0 and 1")
    return value


def main(argv=None):
    """Compare two records, two models of one record, or run the offline demo.

    Returns 0 (no new failure), 1 (a new failure, or with --alpha a significant drop) or
    2 (not comparable: it prints NOT_COMPARABLE: reason). Usage errors exit 2 via argparse.
    """
    parser = argparse.ArgumentParser(prog="compare_runs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="*", metavar="RECORD", help="BEFORE and AFTER (or one RUN with --models)")
    parser.add_argument("--demo", metavar="NEW_DIR", help="write two synthetic records into NEW_DIR and compare them")
    parser.add_argument("--models", nargs=2, metavar=("A", "B"), help="within one RUN: is model B a drop-in for A?")
    parser.add_argument("--matrix", action="store_true",
                        help="every (case, behaviour) with both verdicts and same / REGRESS / GAIN")
    parser.add_argument("--alpha", type=_alpha, help="exit 1 only for pass-rate drops with p <= ALPHA")
    parser.add_argument("--all", action="store_true", dest="all_rows",
                        help="list every row and pair, not only the changed ones (the others are counted)")
    parser.add_argument("--all-diffs", action="store_true", help="diff every changed answer, not only changed verdicts")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown report (new file)")
    parser.add_argument("--junit", metavar="FILE", help="write a JUnit XML report (new file)")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report (new file)")
    args = parser.parse_args(argv)
    if args.demo is not None and (args.records or args.models or args.matrix):
        parser.error("give BEFORE AFTER, --models A B RUN, or --demo NEW_DIR: one of them")
    if args.matrix and (args.alpha is not None or args.all_diffs or args.markdown or args.junit or args.html):
        parser.error("--matrix prints its table only; drop --alpha, --all-diffs and the report flags")
    wanted = 1 if args.models else 2
    if args.demo is None and len(args.records) != wanted:
        parser.error("give two record files, BEFORE and AFTER" if wanted == 2 else "--models A B takes one RUN record")
    for kind in COMPARISON_REPORTS:  # `--html "$UNSET"` must not read as no --html: the report would be skipped
        if getattr(args, kind) == "":
            parser.error(f"--{kind}: the file name is empty (an unset variable?)")
    targets = {kind: getattr(args, kind) for kind in COMPARISON_REPORTS if getattr(args, kind)}
    for kind, path in targets.items():
        if os.path.lexists(path):
            parser.error(f"--{kind}: {path} already exists (reports never overwrite a file)")
        if [os.path.abspath(other) for other in targets.values()].count(os.path.abspath(path)) > 1:
            parser.error(f"--{kind} {path}: the same file is named twice; every report needs its own file")
    try:
        if args.demo is not None:
            return demo(args.demo, all_rows=args.all_rows)
        records = [load_record(path) for path in args.records]
        _not_one_file(args.records)
        if args.matrix:
            return matrix(args, records)
        if args.models:
            notes, result = [], model_swap(records[0], *args.models, alpha=args.alpha)
            title = f"model swap in {args.records[0]}: is {args.models[1]} a drop-in for {args.models[0]}?"
            print(safe_text(f"MODEL SWAP: {args.models[0]} (before) -> {args.models[1]} (after), same run, same cases"))
        else:
            notes, result = compare_records(*records, alpha=args.alpha)
            title = f"comparison: {args.records[0]} -> {args.records[1]}"
        print("\n".join(notes + [render(result, args.all_diffs, args.all_rows)]))
    except (ValueError, RecordError) as exc:
        print(f"NOT_COMPARABLE: {safe_text(exc)}")
        return 2
    try:
        for kind, path in targets.items():
            write_new_file(path, COMPARISON_REPORTS[kind](result, title))
    except RecordError as exc:
        print(f"compare_runs.py: error: {safe_text(exc)}", file=sys.stderr)
        return 2
    return result["exit_code"]


def matrix(args, records):
    """--matrix: print the behaviour matrix of two records (or two models of one); 1 on any REGRESS."""
    if args.models:
        a, b = args.models
        sections = [(None, matrix_models(records[0], a, b))]
        title = f"BEHAVIOUR MATRIX: A = {a}, B = {b} (same run: {args.records[0]})"
    else:
        sections = [(f"model: {model}" if len(tables) > 1 else None, table)
                    for tables in [matrix_records(*records)] for model, table in tables]
        title = f"BEHAVIOUR MATRIX: A = {args.records[0]}, B = {args.records[1]}"
    text, code = render_matrix(title, sections)
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
