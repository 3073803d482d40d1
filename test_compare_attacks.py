"""compare_runs.py and --report attacked as a forger would: record edits whose every field still
validates, and which made a failing row compare or report as a pass. Exit codes are pinned
through the real CLIs (a compare_runs.py process forked from the zygote, fakes.cli_table)."""

import copy
import json

import pytest

import fakes
import regression
from fakes import FakeServer
from testkit import ROOT, cli_env, played, read_record, run_main  # noqa: F401 (a fixture)

SWAP = ["--models", "refund-correct", "refund-claims"]  # refund-claims fails every case


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
    compare exits 1 (NEW_FAILURE, with the CAUTION), --report shows FAIL and --merge refuses."""
    forged = claimed_masked(played, mark)
    assert regression.record_problem(forged) is None  # every field validates
    path = write_json(tmp_path / "forged.json", forged)
    code, out = compare_cli([*SWAP, path], tmp_path)
    assert code == 1 and "NEW_FAILURE" in out, out
    assert f"CAUTION {path}: 3 rows of its stored verdicts differ" in out, out
    report, merged = tmp_path / "report.md", tmp_path / "merged.json"
    (reported, _, err), (joined, _, said) = fakes.cli_table(
        [(["--report", str(path), "--markdown", str(report)], tmp_path),
         (["--merge", str(merged), str(path)], tmp_path)], env=cli_env())
    assert reported == 0 and "FAIL: at least one check failed" in report.read_text(), err
    assert joined == 2 and not merged.exists() and (  # --merge grades each shard again too
        "refund-claims / refund-shipped-order / repeat 0 is stored as PASS but its stored "
        "response now grades FAIL") in said, said


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


def passing_forged(record, model="refund-claims"):
    """Every row of `model` marked PASS beside its intact evidence, the summary recounted."""
    record = copy.deepcopy(record)
    for row in record["runs"]:
        if row["model"] == model:
            row.update(passed=True, reasons=[], details={})
            row.pop("verdicts", None)
    return regression.recount(record)


def test_a_custom_record_without_its_suite_header_cannot_pass_as_the_built_in_suite(played,
                                                                                     tmp_path):
    """A record that names no suite (or says it is built-in) is read as the built-in suite, none
    of whose cases it held, so no row was graded again and a forged PASS stood (exit 0): cases
    of another form cannot be built-in cases, so it is NOT_COMPARABLE, compare and --report."""
    bare = passing_forged(played)
    del bare["suite"]
    claimed = {**passing_forged(played), "suite": {**played["suite"], "builtin": True}}
    why = ("the record's suite is not valid: it is of the built-in suite (its header names no "
           "other), but case \"refund-shipped-order\" holds checks of no built-in case (keys action, "
           "expected, id, question, rfc), so its verdicts cannot be graded again")
    runs = []
    for name, record in (("bare", bare), ("claimed", claimed)):
        assert regression.record_problem(record) is None
        path = write_json(tmp_path / f"{name}.json", record)
        code, out = compare_cli([*SWAP, path], tmp_path)
        assert code == 2 and out.strip().endswith(why), out
        runs.append((["--report", str(path), "--markdown", str(tmp_path / f"{name}.md")],
                     tmp_path))
    for code, _, err in fakes.cli_table(runs, env=cli_env()):
        assert code == 2 and err.strip().endswith(why), err


def advisor_record(folder, monkeypatch, unsafe):
    """A built-in suite record (the perplexity provider against the fake Agent API) whose
    ambiguous-payment case is one an older release had under the id old-payment."""
    out = folder / f"builtin-{unsafe}.json"
    with FakeServer(fakes.advisor(unsafe_payment=unsafe)) as server:
        monkeypatch.setenv("PERPLEXITY_BASE_URL", server.url)
        monkeypatch.setenv("PERPLEXITY_API_KEY", "test-key")
        assert run_main(["--models", "a", "--out", out]) == int(unsafe)
    record = read_record(out)
    for item in [*record["config"]["cases"], *record["runs"]]:
        key = "id" if "question" in item else "case_id"
        item[key] = "old-payment" if item[key] == "ambiguous-payment" else item[key]
    return regression.recount(record)


def test_a_built_in_case_an_older_release_had_is_graded_by_its_own_definition(tmp_path,
                                                                            monkeypatch):
    """Built-in records (perplexity provider) compare as they grade; a case today's built-in
    suite lacks was left out of the regrade, so its forged PASS compared as a pass."""
    good = write_json(tmp_path / "good.json", advisor_record(tmp_path, monkeypatch, False))
    honest = advisor_record(tmp_path, monkeypatch, True)
    bad = write_json(tmp_path / "bad.json", honest)
    forged = write_json(tmp_path / "forged.json", passing_forged(honest, "a"))
    for argv, code in (([good, bad], 1), ([bad, good], 0), ([good, forged], 1)):
        got, out = compare_cli(argv, tmp_path)
        assert got == code and ("NEW_FAILURE" in out) is (code == 1), (argv, out)
        assert ("stored verdicts differ" in out) is (argv[1] == forged), (argv, out)
