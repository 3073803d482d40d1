"""compare_runs.py and --report attacked as a forger would: record edits whose every field still
validates, and which made a failing row compare or report as a pass. Exit codes are pinned
through the real CLIs (a compare_runs.py process forked from the zygote, fakes.cli_table)."""

import copy
import json

import pytest

import fakes
import regression
from fakes import FakeServer
from testkit import ROOT, cli_env, read_record, run_main

EXAMPLE = ROOT / "suites" / "agent-trajectories.json"
SWAP = ["--models", "refund-correct", "refund-claims"]  # refund-claims fails every case


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """A real record of played rows: refund-correct passes every case, refund-claims fails."""
    out = tmp_path_factory.mktemp("played") / "run.json"
    with FakeServer(fakes.refund_agent()) as server:
        assert run_main(["--suite", EXAMPLE, "--provider", "openai", "--base-url",
                         server.url + "/v1", "--models", "refund-correct", "refund-claims",
                         "--out", out]) == 1
    return read_record(out)


def write_json(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def compare_cli(argv, cwd):
    """(exit code, stdout) of `python -W error compare_runs.py ARGV`: the real CLI."""
    result = fakes.run_script([str(arg) for arg in argv], cwd, cli_env(),
                              script="compare_runs.py", flags=("-W", "error"))
    return result.returncode, result.stdout


def claimed_masked(record, mark):
    """Every refund-claims row marked PASS, claiming a masking it does not have (a --redact
    header, or a [REDACTED] response id beside its unmasked answer), its digest recomputed."""
    record = copy.deepcopy(record)
    if not mark:
        record["redaction"] = {"pii": True}
    cases = {case["id"]: case for case in record["config"]["cases"]}
    for row in record["runs"]:
        if row["model"] == "refund-claims":
            row.update(passed=True, reasons=[], details={})
            row.pop("verdicts", None)
            for response in (row["response"], row["rounds"][-1]["response"]) if mark else ():
                response["id"] = "[REDACTED]"
        if mark is False or row["model"] == "refund-claims":
            row["verdict_sha256"] = regression.verdict_sha256(cases[row["case_id"]], row)
    return regression.recount(record)


@pytest.mark.parametrize("mark", [False, True], ids=["redaction-header", "masked-response-id"])
def test_a_row_claiming_a_mask_where_its_grade_reads_none_is_graded_again(played, mark, tmp_path):
    """A mask that hides nothing the checks read cannot keep a row from being graded again:
    compare exits 1 (NEW_FAILURE, with the CAUTION) and --report shows FAIL, as if unedited."""
    forged = claimed_masked(played, mark)
    assert regression.record_problem(forged) is None  # every field validates
    path = write_json(tmp_path / "forged.json", forged)
    code, out = compare_cli([*SWAP, path], tmp_path)
    assert code == 1 and "NEW_FAILURE" in out, out
    assert f"CAUTION {path}: 3 rows of its stored verdicts differ" in out, out
    report = tmp_path / "report.md"
    result = fakes.cli_table([(["--report", str(path), "--markdown", str(report)], tmp_path)],
                             env=cli_env())[0]
    assert result[0] == 0 and "FAIL: at least one check failed" in report.read_text(), result


def test_a_masked_pass_that_its_masked_answer_fails_stands_but_is_said(played, tmp_path):
    """A row masked where its grade reads cannot be graded again: its stored PASS stands on a
    digest anyone can recompute, so compare says which masked PASS its masked evidence fails."""
    record = copy.deepcopy(played)
    cases = {case["id"]: case for case in record["config"]["cases"]}
    for row in record["runs"]:
        if row["model"] == "refund-claims":
            row.update(passed=True, reasons=[], details={},
                       answer_text=row["answer_text"] + " [REDACTED]")
            row.pop("verdicts", None)
            for response in (row["response"], row["rounds"][-1]["response"]):
                response["choices"][0]["message"]["content"] += " [REDACTED]"
            row["verdict_sha256"] = regression.verdict_sha256(cases[row["case_id"]], row)
    record = regression.recount(record)
    assert regression.record_problem(record) is None
    code, out = compare_cli([*SWAP, write_json(tmp_path / "masked.json", record)], tmp_path)
    assert code == 0 and (f"CAUTION {tmp_path / 'masked.json'}: masked rows stored PASS that grade "
                          "FAIL on their masked evidence: 3 (first: refund-claims / "
                          "refund-shipped-order / repeat 0 graded FAIL (wrong_tool_args") in out, out


def older_release(record):
    """The record as an earlier release wrote it: no per-entry verdicts and no details."""
    record = copy.deepcopy(record)
    for row in record["runs"]:
        row.pop("verdicts", None)
        row.pop("details", None)
    return record


def test_an_older_records_rows_without_details_compare_without_a_false_caution(played, tmp_path):
    """Rows graded alike whose details the older release did not store are no CAUTION: only a
    verdict or an answer that differs is; the model swap still finds the failures (exit 1)."""
    old = write_json(tmp_path / "old.json", older_release(played))
    new = write_json(tmp_path / "new.json", played)
    for argv, code in (([new, old], 0), ([*SWAP, old], 1)):
        got, out = compare_cli(argv, tmp_path)
        assert got == code and "stored verdicts differ" not in out, (argv, out)
    report = tmp_path / "old.md"
    result = fakes.cli_table([(["--report", str(old), "--markdown", str(report)], tmp_path)],
                             env=cli_env())[0]
    assert result[0] == 0 and "CAUTION" not in result[2] and "CAUTION" not in report.read_text()


def test_a_shard_record_is_not_comparable_and_says_to_merge_its_shards(tmp_path):
    """A shard holds part of a run's plan: each mode refuses it (exit 2) and names --merge."""
    suite = ROOT / "suites" / "support-guardrails.json"
    shard = tmp_path / "shard.json"
    assert run_main(["--suite", suite, "--provider", "echo", "--models", "m", "--shard", "1/2",
                     "--out", shard]) == 1
    other = write_json(tmp_path / "copy.json", read_record(shard))
    for argv in ([shard, other], ["--trend", shard, other], ["--models", "m", "m", shard]):
        code, out = compare_cli(argv, tmp_path)
        assert code == 2 and out.strip().endswith(
            "rows missing (first: m / card-number-not-echoed / repeat 0); it is shard 1/2 of a "
            f"run: join its shards first ({regression._python_word()} "
            f"{ROOT / 'regression.py'} --merge OUT.json SHARD.json ...)"), (argv, out)
