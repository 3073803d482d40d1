"""Compare two saved agent-regression records and show which approved decision changed.

Usage:
    python compare_runs.py BEFORE.json AFTER.json
    python compare_runs.py --demo NEW_DIR        # offline: two synthetic runs, no key

The two records must come from the same configuration (models, cases, tools,
response format, repeats, limits); only the instructions may differ. Each row
key (model, case, repeat) gets one line:
    NEW_FAILURE    passed before, fails now
    RECOVERED      failed before, passes now
    PASS           passes in both
    STILL_FAILING  fails in both

Exit codes:
    0  comparable, no new failure
    1  comparable, at least one NEW_FAILURE
    2  not comparable (missing file, bad JSON, different config, incomplete run, ...)
"""

import argparse
import json
import os
import sys

from regression import (CASES, INSTRUCTIONS, RecordError, check, dumps, load_record,
                        plan_rows, row_key, summary, write_new_file)


# ====================================================================== records

def _require(condition, message):
    if not condition:
        raise ValueError(message)


def index(record):
    """Rows of a complete, error-free record by (model, case_id, repeat); ValueError otherwise."""
    _require(isinstance(record, dict), "a record must be a JSON object")
    config, runs = record.get("config"), record.get("runs")
    _require(isinstance(config, dict), "the record has no config object")
    _require(isinstance(runs, list), 'the record has no "runs" list')
    models, cases, repeats = config.get("models"), config.get("cases"), config.get("repeats")
    _require(isinstance(models, list) and models, "config.models is empty or not a list")
    _require(all(isinstance(model, str) for model in models), "config.models holds a non-string")
    _require(len(set(models)) == len(models), "config.models has duplicates")
    _require(isinstance(cases, list) and cases, "config.cases is empty or not a list")
    _require(all(isinstance(case, dict) and isinstance(case.get("id"), str) for case in cases),
             "config.cases holds a case without a string id")
    case_ids = [case["id"] for case in cases]
    _require(len(set(case_ids)) == len(case_ids), "config.cases has duplicate ids")
    _require(isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1,
             "config.repeats is not a positive integer")
    rows = {}
    for position, row in enumerate(runs):
        _require(isinstance(row, dict), f"run {position} is not an object")
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


def _name(key):
    model, case_id, repeat = key
    return f"{model} / {case_id} / repeat {repeat}"


# ====================================================================== comparison

LABELS = {(True, False): "NEW_FAILURE", (False, True): "RECOVERED",
          (True, True): "PASS", (False, False): "STILL_FAILING"}


def _comparable(before, after):
    """Raise ValueError unless the two records may be compared."""
    for side, record in (("before", before), ("after", after)):
        _require(isinstance(record, dict), f"{side} is not a JSON object")
        _require(isinstance(record.get("config"), dict), f"{side} has no config object")
        _require(isinstance(record.get("runs"), list), f'{side} has no "runs" list')
    keys = set(before["config"]) | set(after["config"])
    differing = sorted(key for key in keys - {"instructions"}
                       if before["config"].get(key, None) != after["config"].get(key, None)
                       or (key in before["config"]) != (key in after["config"]))
    _require(not differing, f"configs differ in {', '.join(differing)} (only instructions may differ)")
    labels = (before.get("evidence", "live"), after.get("evidence", "live"))
    _require(labels[0] == labels[1], f"evidence differs: {labels[0]} vs {labels[1]}")


def compare(before, after):
    """SPEC A9: print one line per row key; 1 if any NEW_FAILURE, else 0. ValueError if not comparable."""
    _comparable(before, after)
    rows_before, rows_after = index(before), index(after)
    for field in ("sdk_version", "code_sha256"):
        if before.get(field) != after.get(field):
            print(f"CAUTION {field} differs: {before.get(field)} -> {after.get(field)}")
    config = before["config"]
    new_failures = 0
    for key in plan_rows(config["models"], [case["id"] for case in config["cases"]], config["repeats"]):
        old, new = rows_before[key], rows_after[key]
        label = LABELS[(old["passed"], new["passed"])]
        new_failures += label == "NEW_FAILURE"
        model, case_id, repeat = key
        print(f"{label:<13}  {model}  {case_id}  repeat {repeat}  "
              f"before={json.dumps(old['reasons'])}  after={json.dumps(new['reasons'])}")
    return 1 if new_failures else 0


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


def demo(folder):
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
    return compare(before, after)


# ====================================================================== CLI

def main(argv=None):
    """Compare two records (or run the offline demo); return 0, 1 or 2 as the module docstring says."""
    parser = argparse.ArgumentParser(prog="compare_runs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="*", metavar="RECORD", help="BEFORE and AFTER record files")
    parser.add_argument("--demo", metavar="NEW_DIR", help="write two synthetic records into NEW_DIR and compare them")
    args = parser.parse_args(argv)
    if args.demo is not None and args.records:
        parser.error("give BEFORE AFTER or --demo NEW_DIR, not both")
    if args.demo is None and len(args.records) != 2:
        parser.error("give two record files, BEFORE and AFTER (or --demo NEW_DIR)")
    try:
        if args.demo is not None:
            return demo(args.demo)
        before, after = (load_record(path) for path in args.records)
        return compare(before, after)
    except (ValueError, RecordError) as exc:
        print(f"NOT_COMPARABLE: {exc}")
        return 2


def cli():
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
