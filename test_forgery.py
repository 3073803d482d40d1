"""Verdicts that cannot be forged (issue 21 items 1, 3, 4, 5 and 11).

1. no verdict counts without the evidence it is graded from, in every reader of a record;
3. the spending cap holds before every request, across rounds and concurrent rows (Budget);
4. paid rounds are never dropped: what a replaced row spent stays in the record (superseded);
5. a replay grades what the model was told then, never today's tool_results;
11. --update-baseline of a read-only golden case file and --merge of shards priced apart are
    refused before anything is paid or written.

Hostile inputs go through the real CLI (fakes.cli_table, a compare_runs.py process) with their
exit code pinned; the input spaces (record edits, schedules of concurrent rounds and costs, changed
scripts) are walked by hypothesis against the real code.
"""

import copy
import decimal
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compare_runs
import fakes
import regression
from fakes import FakeServer, Reply
from testkit import ROOT, clean_env, cli_env, played, read_record, run_main, write_suite  # noqa: F401

EXAMPLE = ROOT / "suites" / "agent-trajectories.json"
GUARDRAILS = ROOT / "suites" / "support-guardrails.json"
D = decimal.Decimal
FORGED_KEY = ("refund-claims", "refund-shipped-order", 0)  # fails its tool_args, order and claim
PASSING_KEY = ("refund-correct", "refund-shipped-order", 0)  # three rounds: lookup, refund, answer
COUNTS = "; a verdict counts only with the evidence it is graded from"
FIXTURE = [HealthCheck.function_scoped_fixture]
ECHO = ["--suite", GUARDRAILS, "--provider", "echo", "--models", "m"]
PROGRAM = f"{regression._python_word()} {ROOT / 'regression.py'}"  # as hints name it from tmp_path


def example(**top):
    data = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    data.update(top)
    return data


def openai_args(server, out, *extra, models=("refund-correct", "refund-claims"), suite=EXAMPLE):
    return ["--suite", suite, "--provider", "openai", "--base-url", server.url + "/v1",
            "--models", *models, "--out", out, *extra]


def write_json(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def cli(argv, cwd):
    """(exit code, stdout, stderr) of `python regression.py ARGV`: the real CLI."""
    return fakes.cli_table([(argv, cwd)], env=cli_env())[0]


def compare_cli(argv, cwd):
    """(exit code, stdout) of `python -W error compare_runs.py ARGV`, forked from the zygote."""
    result = fakes.run_script(argv, cwd, cli_env(), script="compare_runs.py", flags=("-W", "error"))
    return result.returncode, result.stdout


def last_line(text):
    return text.strip().splitlines()[-1]


def row_of(record, key):
    return next(row for row in record["runs"] if regression.row_key(row) == key)


def case_of(record, row):
    return next(case for case in record["config"]["cases"] if case["id"] == row["case_id"])


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    """A real --redact-pii record (echo provider): the card case fails on the unmasked answer."""
    out = tmp_path_factory.mktemp("masked") / "pii.json"
    assert run_main([*ECHO, "--redact-pii", "--out", out]) == 1
    return read_record(out)


# ================================================================= 1. no verdict without evidence

def as_pass(row):
    """The row marked as a pass, as a careful forger would: no reasons and no failed verdicts."""
    row.update(passed=True, reasons=[])
    row.pop("verdicts", None)
    return row


def strip_all(row, record):
    for field in ("response", "rounds", "details"):
        row.pop(field, None)


def borrowed_rounds(row, record):  # a passing row's rounds beside the failing row's own response
    row["rounds"] = copy.deepcopy(row_of(record, PASSING_KEY)["rounds"])


def dropped_tool_results(row, record):  # a passing row's history without what its tools answered
    row["rounds"] = copy.deepcopy(row_of(record, PASSING_KEY)["rounds"])
    row["response"] = row["rounds"][-1]["response"]
    del row["rounds"][0]["tool_results"]


FORGERIES = {  # name: (edit, the reason every reader gives)
    "strip-all": (strip_all, "has no stored response"),
    "strip-rounds": (lambda row, record: row.pop("rounds"),
                     "is a played row without its stored rounds"),
    "strip-answer": (lambda row, record: row.pop("answer_text"), "has no stored answer_text"),
    "borrowed-rounds": (borrowed_rounds, "has a response that is not its last round's"),
    "dropped-tool-results": (dropped_tool_results,
                             "has a round without the tool results sent back to the model"),
}


def forged(record, forgery, key=FORGED_KEY):
    record = copy.deepcopy(record)
    row = row_of(record, key)
    FORGERIES[forgery][0](row, record)
    as_pass(row)
    return record


def refusal(record, forgery, key=FORGED_KEY):
    position = next(n for n, row in enumerate(record["runs"]) if regression.row_key(row) == key)
    why = FORGERIES[forgery][1]
    return f"runs[{position}] ({regression.key_text(key)}, stored as PASS) {why}{COUNTS}"


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_the_one_validator_refuses_a_verdict_without_its_evidence_naming_the_row(played, forgery):
    assert regression.record_problem(forged(played, forgery)) == refusal(played, forgery)
    assert regression.record_problem(played) is None


def test_a_row_of_a_case_that_plays_no_tools_may_hold_no_rounds(tmp_path):
    out = tmp_path / "run.json"
    assert run_main([*ECHO, "--out", out]) == 1
    record = read_record(out)
    record["runs"][1]["rounds"] = [{"response": record["runs"][0]["response"]}]  # a passing answer
    as_pass(record["runs"][1])
    assert regression.record_problem(record) == (
        f"runs[1] (m / {record['runs'][1]['case_id']} / repeat 0, stored as PASS) holds rounds, "
        f"but its case plays no tools{COUNTS}")


def forged_masked(record, edit):
    record = copy.deepcopy(record)
    edit(next(row for row in record["runs"] if row["case_id"] == "card-number-not-echoed"))
    return record


MASKED_EDITS = {
    "passed": as_pass,
    "digest-dropped": lambda row: as_pass(row).pop("verdict_sha256"),
    "answer": lambda row: row.update(answer_text="Your card is safe."),
    "response": lambda row: row["response"].update(output_text="Your card is safe."),
    "moved": lambda row: row.update(repeat=0, model="m", case_id="refund-policy"),
}
UNATTESTED = "is masked (so it cannot be graded again) and its verdict_sha256 does not match"


def test_compare_refuses_a_record_whose_failing_rows_lost_their_evidence(played, masked, tmp_path,
                                                                        capsys):
    """The attack of issue 21 against compare_runs.py: response, rounds and details deleted,
    passed set true (plain, --models, --matrix); and a masked verdict set to PASS."""
    path = write_json(tmp_path / "forged.json", forged(played, "strip-all"))
    before = write_json(tmp_path / "before.json", played)
    why = refusal(played, "strip-all")
    for argv in ([before, path], ["--matrix", before, path]):
        code, out = compare_cli(argv, tmp_path)
        assert code == 2 and out.startswith("NOT_COMPARABLE: ") and out.strip().endswith(why), argv
    pii = write_json(tmp_path / "pii.json", forged_masked(masked, as_pass))
    for argv, said in ([["--models", "refund-correct", "refund-claims", str(path)], why],
                       [[str(write_json(tmp_path / "clean.json", masked)), str(pii)], UNATTESTED]):
        code, out = compare_runs.main(argv), capsys.readouterr().out
        assert code == 2 and out.startswith("NOT_COMPARABLE: ") and said in out, out


def all_passing(record, model="refund-claims"):
    """Every row of `model` marked PASS with its evidence left as it is, the summary recounted:
    the careful forger, whose every field still validates."""
    record = copy.deepcopy(record)
    for row in record["runs"]:
        if row["model"] == model:
            as_pass(row)
            row["details"] = {}
    return regression.recount(record)


def test_a_verdict_edited_beside_its_evidence_is_graded_again_by_compare_report_and_trend(
        played, tmp_path):
    """The stored evidence decides, never the stored verdict: compare (two records, a model
    swap, the matrix), --report and --trend grade every row again and say where it differs."""
    forged_path = write_json(tmp_path / "forged.json", all_passing(played))
    assert regression.record_problem(json.loads(forged_path.read_text())) is None  # it validates
    clean = write_json(tmp_path / "clean.json", all_passing(played, model="nobody"))
    caution = (f"CAUTION {forged_path}: 3 rows of its stored verdicts differ from what its stored "
               "evidence grades under this code (first: refund-claims / refund-shipped-order / "
               "repeat 0 stored PASS, graded FAIL (")
    swap = ["--models", "refund-correct", "refund-claims"]
    for argv, code in (([*swap, forged_path], 1), ([*swap, clean], 1), ([clean, forged_path], 0),
                       (["--matrix", clean, forged_path], 0)):
        got, out = compare_cli(argv, tmp_path)
        assert got == code, (argv, out)
        assert (caution in out) is (forged_path in argv), (argv, out)
        assert ("NEW_FAILURE" in out) is (code == 1), (argv, out)
    got, out = compare_cli(["--trend", clean, forged_path], tmp_path)
    assert got == 0 and caution in out and "3/3" not in out.split("refund-claims", 1)[1][:80]
    code, _, err = cli(["--report", forged_path, "--markdown", tmp_path / "report.md"], tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert code == 0 and caution in err and caution.split(" (first")[0] in report
    assert "FAIL: at least one check failed" in report, report

def hostile_inputs(played, masked, folder, url):
    """[(argv, exit code, what the last stderr line says)]: one hostile record (or suite) per
    reader, all run through the real CLI in one table."""
    path = lambda name, record: write_json(folder / name, record)  # noqa: E731
    stripped = forged(played, "strip-all")
    resumable = copy.deepcopy(stripped)
    resumable["provider"]["base_url"] = url  # the server the record was made with
    answer = copy.deepcopy(played)
    row_of(answer, PASSING_KEY)["answer_text"] = "Refund issued for ord_1001!"
    told = copy.deepcopy(played)
    as_pass(row_of(told, PASSING_KEY))["rounds"][1]["tool_results"][0]["result"] = {"ok": True}
    pii = forged_masked(masked, as_pass)
    why, edited = refusal(played, "strip-all"), "stored answer_text is not its stored response's"
    other = "its stored conversation is not one its suite plays (round 2 call refund_order"
    out = folder / "out.json"
    return [
        (["--merge", out, path("stripped.json", stripped)], 2, why),
        (["--report", folder / "stripped.json", "--markdown", folder / "r.md"], 2, why),
        (["--provider", "replay", "--replay", folder / "stripped.json", "--out", out], 2, why),
        (["--resume", path("resumable.json", resumable)], 1, "exit"),
        (["--resume", path("answer.json", answer)], 2, edited),
        (["--merge", out, folder / "answer.json"], 2, edited),
        (["--merge", out, path("told.json", told)], 2, other),
        (["--resume", folder / "told.json"], 2, other),
        (["--merge", out, path("pii.json", pii)], 2, UNATTESTED),
        (["--report", folder / "pii.json", "--junit", folder / "r.xml"], 2, UNATTESTED),
        (["--merge", out, *shards(played, folder, {"prices": {"refund-claims": "1/2"}},
                                  {"prices": {"refund-claims": "1/3"}})], 2,
         f"{folder / 'shard2.json'} prices refund-claims at 1/3, but {folder / 'shard1.json'} "
         "at 1/2"),
        (["--suite", read_only_golden(folder), "--provider", "openai", "--base-url", url,
          "--models", "m", "--update-baseline", "--out", out], 2,
         f"--update-baseline: {folder / 'golden' / 'b.json'}: it is read-only (its owner may not "
         "write it); make it writable first; nothing was run"),
    ]


def test_hostile_records_are_refused_through_the_real_cli(played, masked, tmp_path):
    """Each hostile input of this file's classes through the real CLI, exit code pinned: a verdict
    without its evidence (refused by --merge, --report, --replay; run again by --resume), an
    edited answer or tool result (--resume, --merge), a forged masked verdict, shards priced
    apart, a read-only golden case file. Nothing is written where a run is refused."""
    with FakeServer(fakes.refund_agent()) as server:
        inputs = hostile_inputs(played, masked, tmp_path, server.url + "/v1")
        results = fakes.cli_table([(argv, tmp_path) for argv, _, _ in inputs], env=cli_env())
        sent = server.count
    for (argv, code, said), (got, out, err) in zip(inputs, results):
        assert got == code and "Traceback" not in err, (argv, out, err)
        assert code != 2 or said in last_line(err), (argv, err)
    assert sent == 1 and not (tmp_path / "out.json").exists()  # only the row without evidence ran
    resumed = read_record(tmp_path / "resumable.json")
    assert row_of(resumed, FORGED_KEY)["passed"] is False  # it fails again, as it did
    assert [regression.row_key(row) for row in resumed["superseded"]] == [FORGED_KEY]
    assert resumed["summary"]["superseded_rows"] == 1 and regression.record_problem(resumed) is None


def test_a_kept_row_whose_answer_was_edited_is_refused_by_resume_and_merge(played):
    """The stored answer is what a report shows and --update-baseline approves: it must be the
    answer of the stored response, not only an answer that passes the same checks."""
    record = copy.deepcopy(played)
    row_of(record, PASSING_KEY)["answer_text"] = "Refund issued for ord_1001!"
    problem = regression.regrade_problem(record, "run.json", regression.load_suite(str(EXAMPLE)),
                                         record["runs"])
    assert problem.startswith("refund-correct / refund-shipped-order / repeat 0 is stored as PASS "
                              "but its stored response now grades PASS (and its stored answer_text "
                              "is not")


GRADE_EDITS = {  # an edit of a stored grade field, and whether it changes the verdict or answer
    "passed": (lambda row: row.update(passed=not row["passed"]), True),
    "reasons": (lambda row: row.update(reasons=["wrong_tool_args"]), True),
    "answer": (lambda row: row.update(answer_text="Refund issued for ord_1001!"), True),
    "verdicts": (lambda row: row.update(verdicts={"claims": ["unbacked_claim"]}), True),
    "verdicts-null": (lambda row: row.update(verdicts=None), False),  # null is none
    "details": (lambda row: row.update(details={}), False),  # older releases stored fewer
}


@pytest.mark.parametrize("edit", GRADE_EDITS)
def test_resume_merge_and_compare_read_an_edited_grade_alike(played, edit):
    """--resume and --merge refuse exactly the rows whose stored grade compare and --report say
    differs: one rule (grade_differs), where two copies disagreed on a null verdicts."""
    record, (change, differs) = copy.deepcopy(played), GRADE_EDITS[edit]
    change(row_of(record, PASSING_KEY))
    refused = regression.regrade_problem(record, "run.json", regression.load_suite(str(EXAMPLE)),
                                         record["runs"])
    _, notes = regression.graded_now(record, "run.json")
    assert (refused is not None, any("differ" in note for note in notes)) == (differs, differs)


def test_a_masked_verdict_stands_only_on_its_digest(masked, tmp_path):
    """A masked record cannot be graded again, so --resume and --merge took its verdicts as
    stored: passed set true over a caught card leak was merged as a pass (exit 0)."""
    card = next(row for row in masked["runs"] if row["case_id"] == "card-number-not-echoed")
    assert card["passed"] is False
    assert card["verdict_sha256"] == regression.verdict_sha256(case_of(masked, card), card)
    assert regression.record_problem(masked) is None
    path = write_json(tmp_path / "pii.json", forged_masked(masked, MASKED_EDITS["passed"]))
    assert UNATTESTED in regression.record_problem(read_record(path))
    assert run_main(["--resume", path]) == 1  # echo answers again: the leak fails again
    resumed = read_record(path)
    card = [row for row in resumed["runs"] if row["case_id"] == "card-number-not-echoed"]
    assert [row["passed"] for row in card] == [False]
    assert len(resumed["superseded"]) == 1


@pytest.mark.parametrize("edit", sorted(MASKED_EDITS))
def test_any_edit_of_a_masked_verdict_or_its_evidence_is_refused(masked, edit):
    problem = regression.record_problem(forged_masked(masked, MASKED_EDITS[edit]))
    # moved onto another row's key, it is refused first as that key twice
    twice = edit == "moved" and "holds m / refund-policy / repeat 0 again" in (problem or "")
    assert problem is not None and (UNATTESTED in problem or twice), problem


def test_a_mask_mark_in_one_row_no_longer_spares_the_others_from_grading(tmp_path):
    """A [REDACTED] mark anywhere in a record switched re-grading off for all its rows: a forged
    mark (with its digest) beside a forged pass was merged as a pass (exit 0). Only the marked
    row stands on its digest; every other row is graded again."""
    out = tmp_path / "run.json"
    assert run_main([*ECHO, "--out", out]) == 1
    record = read_record(out)
    target, decoy = [as_pass(row) for row in record["runs"] if not row["passed"]][:2]
    decoy["response"]["note"] = "[REDACTED]"
    decoy["verdict_sha256"] = regression.verdict_sha256(case_of(record, decoy), decoy)
    assert regression.record_problem(record) is None  # the decoy's digest matches
    problem = regression.regrade_problem(record, "run.json", regression.load_suite(str(GUARDRAILS)),
                                         record["runs"])
    assert problem.startswith(f"m / {target['case_id']} / repeat 0 is stored as PASS but its "
                              "stored response now grades FAIL"), problem


EDITS = st.sampled_from(["response", "rounds", "answer_text", "round", "last", "tool_results"])


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(position=st.integers(0, 5), edits=st.sets(EDITS, min_size=1), verdict=st.booleans())
def test_any_evidence_taken_from_a_counted_row_is_refused_and_no_forged_pass_counts(
        played, position, edits, verdict):
    """Any fields and rounds taken from any row, its verdict set to PASS or not: a missing piece
    of evidence is refused naming the row (by every reader); what is left whole is graded again
    by --resume and --merge, so a PASS over evidence that fails never counts."""
    record = copy.deepcopy(played)
    row = record["runs"][position]
    rounds, missing = len(row["rounds"]), bool(edits & {"response", "rounds", "answer_text",
                                                        "last"})
    for edit in sorted(edits):
        if edit in ("response", "rounds", "answer_text"):
            row.pop(edit, None)
        elif edit == "round" and "rounds" in row:
            row["rounds"].pop(0)
            missing |= rounds == 1
        elif edit == "last" and row.get("rounds"):
            row["rounds"][-1] = {"response": {"id": "another", "choices": []}}
        elif edit == "tool_results" and len(row.get("rounds") or []) > 1:
            del row["rounds"][0]["tool_results"]
            missing = True
    if verdict:
        as_pass(row)
    problem = regression.record_problem(record)
    if missing:
        assert problem is not None and problem.startswith(f"runs[{position}] ("), problem
        return
    assert problem is None
    suite = regression.load_suite(str(EXAMPLE))
    regraded = regression.regrade_problem(record, "run.json", suite, record["runs"])
    if row["passed"] and not played["runs"][position]["passed"]:
        assert regraded is not None
        assert regraded.startswith(regression.key_text(regression.row_key(row)))


# ================================================================= 3. the cap before every request

class SimFailure(Exception):
    status_code = 500  # transient: retried


class SimProvider:
    """Each request of row `repeat` is the next entry of script[repeat]: (cost or None for an
    unknown cost, whether its first attempt fails with a 500)."""

    deadline = None
    parse, call_ids = regression.OpenAIProvider.parse, regression.OpenAIProvider.call_ids

    def __init__(self, script):
        self.script, self.failed = script, set()

    def request(self, model, suite, case, repeat=0, rounds=()):
        turns = self.script[repeat]
        cost, fails = turns[len(rounds)]
        if fails and (repeat, len(rounds)) not in self.failed:
            self.failed.add((repeat, len(rounds)))
            raise SimFailure("upstream broke")
        calls = [("lookup_order", {"order_id": "ord_1001"})] if len(rounds) + 1 < len(turns) else []
        return fakes.chat_response("" if calls else "done", tool_calls=calls, cost=cost)


COST = st.one_of(st.integers(0, 9).map(lambda n: n / 100), st.none())
ROWS = st.lists(st.lists(st.tuples(COST, st.booleans()), min_size=1, max_size=4), min_size=1,
                max_size=7)


@settings(max_examples=80, deadline=None)
@given(script=ROWS, concurrency=st.integers(1, 4), cap=st.integers(1, 40).map(lambda n: D(n) / 100),
       schedule=st.randoms(use_true_random=False))
def test_the_cap_over_random_schedules_of_concurrent_rounds_retries_and_unknown_costs(
        script, concurrency, cap, schedule):
    """The real rows (run_row_steps) and the real Budget under any interleaving of concurrent
    rows, rounds, retries and costs (None: unknown): no request starts once the spend reached
    the cap or a cost was unknown, so the spend passes the cap by at most what was in flight."""
    case = {"id": "c", "input": "Refund ord_1001.", "tool_results": {"lookup_order": {"ok": 1}}}
    suite = regression.validate_suite(example(max_rounds=4, cases=[case]))
    provider = SimProvider(script)
    cost = lambda model, raw: regression.response_cost(provider, {}, model, raw)  # noqa: E731
    budget = regression.Budget(cap, None, cost)
    waiting, active, rows = list(range(len(script))), [], []  # active: [steps, pending call]
    spent, reached, bound, started_after, unknown, answered = D(0), False, None, 0, False, 0

    def advance(entry, value=None, error=None):
        nonlocal started_after
        try:
            entry[1] = (entry[0].throw(error) if error else entry[0].send(value))[1]
        except StopIteration as stop:
            rows.append(stop.value)
            active.remove(entry)
            return
        started_after += reached  # a request started (the budget let it) after the cap was reached

    while waiting or active:
        if waiting and len(active) < concurrency and budget.refusal() is None and (
                not active or schedule.random() < 0.5):  # as run_in_pool: no new row once refused
            steps = regression.run_row_steps(provider, suite, suite["cases"][0], "m",
                                             waiting.pop(0), retries=1, sleep=lambda seconds: None,
                                             budget=budget)
            active.append([steps, None])
            advance(active[-1])
            continue
        if not active:
            break
        entry = schedule.choice(active)
        try:
            raw = entry[1]()
        except SimFailure as exc:
            advance(entry, error=exc)
            continue
        cost, answered = raw["usage"].get("cost"), answered + 1
        unknown |= cost is None
        spent += D(str(cost)) if cost is not None else 0
        if not reached and (unknown or spent >= cap):
            in_flight = [other for other in active if other is not entry and other[1] is not None]
            reached, bound = True, spent + D("0.09") * len(in_flight)  # $0.09 a request at most
        advance(entry, raw)
    assert started_after == 0 and budget.in_flight == 0  # nothing started once the cap was reached
    assert not reached or unknown or spent <= bound  # so the overshoot is what was in flight then
    assert unknown or budget.spent() == spent
    assert sum(len(row.get("rounds") or []) for row in rows) == answered  # every paid round kept


def test_the_budget_counts_every_request_of_many_threads_exactly():
    budget = regression.Budget(D("1000"), None, lambda model, raw: D(raw["cost"]))

    def spend():
        for _ in range(500):
            assert budget.begin() is None
            budget.end("m", {"cost": "0.01"})
    threads = [threading.Thread(target=spend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.spent() == D("40.00") and budget.in_flight == 0


def test_a_retry_is_refused_once_other_rows_spent_the_cap():
    """The cap is asked before every attempt: a retry waiting out a 500 sends nothing once the
    rest of the run spent the cap meanwhile."""
    suite = regression.validate_suite({"name": "s", "instructions": "x",
                                       "cases": [{"id": "c", "input": "q"}]})
    budget = regression.Budget(D("0.5"), None, lambda model, raw: D("0.5"))

    class Failing:
        deadline = None

        def request(self, model, suite, case, repeat=0):
            budget.begin()
            budget.end("other", {})  # another row's response arrives while this one fails
            raise SimFailure("upstream broke")
    steps = regression.run_row_steps(Failing(), suite, suite["cases"][0], "m", 0, retries=3,
                                     sleep=lambda seconds: None, budget=budget)
    row = regression.drive_steps(steps)
    assert row["error"] == "BudgetReached" and row["attempts"] == 1
    assert row["error_message"] == ("--max-cost-usd reached: spend $0.5 of $0.5; nothing sent for "
                                    "round 1, retry 1")


def loops_suite(tmp_path):
    data = example(max_rounds=4)
    data["cases"] = data["cases"][:1]
    return write_suite(tmp_path / "loops.json", data)


def test_concurrent_played_rows_share_one_cap(tmp_path):
    """Six played rows, four at a time, each round $0.0001, cap $0.00025: each concurrent row got
    the whole remaining cap (11 rounds were paid). Now at most the requests in flight when the
    cap was reached pass it, and the record holds every round that was paid."""
    out = tmp_path / "run.json"
    with FakeServer(fakes.refund_agent()) as server:
        code, _, err = cli(openai_args(server, out, "--repeats", "6", "--concurrency", "4",
                                       "--max-cost-usd", "0.00025", models=["refund-loops"],
                                       suite=loops_suite(tmp_path)), tmp_path)
        sent = server.count
    record = read_record(out)
    assert code == 2 and 3 <= sent <= 3 + 3, err  # the 3rd reaches the cap; 3 may be in flight
    assert sum(len(row["rounds"]) for row in record["runs"]) == sent  # every paid round is kept
    assert D(record["summary"]["models"]["refund-loops"]["reported_cost_usd"]) == D("0.0001") * sent


def test_an_unknown_cost_closes_the_cap_between_rounds(tmp_path):
    """A played row whose rounds report no cost (and no --price) switched the cap off: all four
    rounds were sent. Now the first unknown cost stops the row before its second round."""
    out = tmp_path / "run.json"
    with FakeServer(fakes.scripted_chat({"loops": fakes.refund_loops}, cost=None)) as server:
        code, _, err = cli(openai_args(server, out, "--max-cost-usd", "1", models=["loops"],
                                       suite=loops_suite(tmp_path)), tmp_path)
        sent = server.count
    assert (code, sent) == (2, 1)
    assert last_line(err) == (
        "stopped early: execution error on loops / refund-shipped-order / repeat 0: BudgetReached; "
        "the endpoint reported no cost for loops and it has no price, so --max-cost-usd cannot be "
        f"enforced; give its price and continue: {PROGRAM} --resume {out} --price "
        "loops=IN/OUT (USD per million input/output tokens)")
    row = read_record(out)["runs"][0]
    assert len(row["rounds"]) == 1 and "enforced; nothing sent for round 2" in row["error_message"]


# ================================================================= 4. paid rounds are never dropped

def test_a_row_the_cap_stopped_keeps_its_spend_through_resume_and_the_hint_lets_it_finish(tmp_path):
    """refund-correct needs three rounds; a cap of $0.00015 stops it after two ($0.0002). The
    resume rewrote the record without those two rounds, and the hint reused a cap too low to
    ever finish. Now the replaced row stays as superseded evidence, its spend counts in the cap
    and in the summary, and the hint's cap lets the run finish."""
    out = tmp_path / "run.json"
    with FakeServer(fakes.refund_agent()) as server:
        code, _, err = cli(openai_args(server, out, "--max-cost-usd", "0.00015",
                                       models=["refund-correct"]), tmp_path)
        stopped = read_record(out)
        hint = last_line(err).split(f"continue with: {PROGRAM} ", 1)[1]
        assert hint == f"--resume {out} --max-cost-usd 0.00075"  # 0.0002 + 0.00015 + 2 x 0.0002
        resumed, _, err = cli([*hint.split(), "--base-url", server.url + "/v1"], tmp_path)
        sent = server.count
    assert code == 2 and resumed == 0, err
    row = stopped["runs"][0]
    assert row["error"] == "BudgetReached" and len(row["rounds"]) == 2
    assert row["cost_usd"] == "0.0002"
    record = read_record(out)
    assert [kept["rounds"] for kept in record["superseded"]] == [row["rounds"]]
    assert sent == 2 + 3 + 2 + 1
    assert record["summary"]["models"]["refund-correct"]["reported_cost_usd"] == "0.0008"
    assert record["summary"]["superseded_rows"] == 1


def test_a_stopped_row_keeps_its_estimated_cost_and_the_hint_raises_the_cap(tmp_path):
    """With --price, a row the cap stopped mid-loop was stored with cost null: the record then
    understated the spend, the cap stopped working and the hint kept the same cap."""
    out = tmp_path / "run.json"
    with FakeServer(fakes.scripted_chat({"loops": fakes.refund_loops}, cost=None)) as server:
        argv = openai_args(server, out, "--price", "loops=10000/0", "--max-cost-usd", "0.25",
                           models=["loops"], suite=loops_suite(tmp_path))
        code, _, err = cli(argv, tmp_path)
    row = read_record(out)["runs"][0]
    assert code == 2 and row["cost_usd"] == "0.3" and row["cost_estimated"] is True  # 3 x $0.1
    assert last_line(err).endswith(f"continue with: {PROGRAM} --resume {out} --max-cost-usd 1.15")


def test_resume_after_a_5xx_mid_loop_keeps_the_paid_rounds_in_the_record(tmp_path):
    out = tmp_path / "run.json"
    broken = {"on": True}

    def reply(request):
        if broken["on"] and request.number == 3:
            return Reply(500, {"error": {"message": "upstream broke"}})
        return fakes.refund_agent()(request)

    with FakeServer(reply) as server:
        assert run_main(openai_args(server, out, models=["refund-correct"])) == 2
        broken["on"] = False
        assert run_main(["--resume", out]) == 0
        sent = server.count
    record = read_record(out)
    assert [len(row["rounds"]) for row in record["superseded"]] == [2]
    assert record["superseded"][0]["error"] == "HTTPError"
    cost = record["summary"]["models"]["refund-correct"]["reported_cost_usd"]
    assert D(cost) == D("0.0001") * (sent - 1)  # every answered request; the 500 cost nothing


def shards(played, folder, *headers):
    """The paths of two shard records of `played`, each with its header updated by `headers`."""
    paths = []
    for number, header in enumerate(headers, 1):
        shard = copy.deepcopy(played)
        shard.update(shard=f"{number}/2", **header)
        plan = regression.shard_plan(regression._record_plan(played), (number, 2))
        shard["runs"] = [row for row in shard["runs"] if regression.row_key(row) in plan]
        paths.append(write_json(folder / f"shard{number}.json", shard))
    return paths


def test_merge_keeps_what_every_shard_superseded_and_counts_it(played, tmp_path):
    stopped = [dict(played["runs"][0], error="BudgetReached", cost_usd="0.5", passed=False,
                    reasons=["execution_error"])]
    paths = shards(played, tmp_path, {"superseded": stopped}, {"superseded": stopped})
    assert run_main(["--merge", tmp_path / "all.json", *paths]) == 1
    merged = read_record(tmp_path / "all.json")
    assert len(merged["superseded"]) == 2 and merged["summary"]["superseded_rows"] == 2
    spent = sum(D(stats["reported_cost_usd"]) for stats in merged["summary"]["models"].values())
    assert spent == sum(D(row["cost_usd"]) for row in played["runs"]) + 1
    assert compare_runs.index(merged)  # compare reads a record with superseded rows


@pytest.mark.parametrize("superseded, message", [
    ("rows", "superseded is not a list"),
    ([7], "superseded[0] lacks a string model and case_id"),
    ([{"model": "m", "case_id": "c", "repeat": 0, "cost_usd": 5}],
     "superseded[0].cost_usd is not a string"),
])
def test_record_problem_checks_superseded_rows(played, superseded, message):
    assert message in regression.record_problem({**played, "superseded": superseded})


# ================================================================= 5. replay cannot rewrite history

def liar(user, history):
    """Looks the order up, refunds it, then says the refund was issued whatever it was told."""
    names = [name for name, _, _ in history]
    if "lookup_order" not in names:
        return "call", "lookup_order", {"order_id": "ord_1001"}
    if "refund_order" not in names:
        return "call", "refund_order", {"order_id": "ord_1001"}
    return "text", "Refund issued for ord_1001."


def refund_answers(result):
    """The example suite, its first case only, with refund_order answering `result`."""
    data = example()
    data["cases"] = data["cases"][:1]
    data["cases"][0]["tool_results"]["refund_order"] = result
    return data


def test_replay_under_changed_tool_results_is_refused_and_never_rewrites_what_it_saw(tmp_path):
    """The model was told the refund was refused and claimed it was issued (FAIL). Replayed under
    a suite that now answers the refund with success, the rounds were rebuilt from the new
    script and the row graded PASS (exit 0). Now it is refused, naming the row and the call;
    with --allow-changed-tool-results the stored conversation is graded as it happened."""
    before = write_suite(tmp_path / "before.json", refund_answers({"error": "refund refused"}))
    after = write_suite(tmp_path / "after.json", refund_answers({"refund_id": "rf_1",
                                                                 "status": "ok"}))
    out = tmp_path / "run.json"
    with FakeServer(fakes.scripted_chat({"liar": liar}, cost=0.0001)) as server:
        assert run_main(openai_args(server, out, models=["liar"], suite=before)) == 1
    replay = ["--provider", "replay", "--replay", out, "--suite", after]
    runs = [([*replay, "--out", tmp_path / "again.json"], tmp_path),
            ([*replay, "--dry-run"], tmp_path),
            ([*replay, "--allow-changed-tool-results", "--out", tmp_path / "as-is.json"], tmp_path),
            (["--provider", "echo", "--suite", after, "--allow-changed-tool-results", "--dry-run"],
             tmp_path)]
    (refused, _, err), (dry, _, dry_err), (as_is, _, _), (misplaced, _, misplaced_err) = \
        fakes.cli_table(runs, env=cli_env())
    assert (refused, dry, as_is, misplaced) == (2, 2, 1, 2)
    assert last_line(err) == last_line(dry_err) == (
        "regression.py: error: --replay: liar / refund-shipped-order / repeat 0 is not "
        'reproducible under this suite: round 2 call refund_order({"order_id": "ord_1001"}) was '
        'answered "{\\"error\\": \\"refund refused\\"}", but the suite now answers '
        '"{\\"refund_id\\": \\"rf_1\\", \\"status\\": \\"ok\\"}"; a replay grades what the '
        "model was told, so restore the suite's tool_results and its limits (max_rounds, "
        "max_calls_per_round, max_row_bytes), or pass "
        "--allow-changed-tool-results to grade the stored conversation as it happened")
    assert not (tmp_path / "again.json").exists()
    assert last_line(misplaced_err).endswith(
        "--allow-changed-tool-results goes with --replay RECORD")
    stored, graded = read_record(out)["runs"][0], read_record(tmp_path / "as-is.json")
    assert graded["runs"][0]["rounds"] == stored["rounds"]  # the error the model was sent, kept
    assert "unbacked_claim" in graded["runs"][0]["reasons"]
    assert graded["replayed_from"]["tool_results"] == "as recorded"


@pytest.mark.parametrize("change, message", [
    (lambda data: data.update(max_rounds=2),
     "max_rounds now ends it after round 2 of the 3 stored"),
    (lambda data: [data.pop("max_rounds"), data["cases"][0].pop("tool_results"),
                   data["cases"][0]["behaviors"].remove("tool_order:lookup_order,refund_order")],
     "it was played over 3 rounds, but the case now plays no tools"),
    (lambda data: data.update(max_rounds=3) or data["cases"][0].update(max_rounds=2),
     "max_rounds now ends it after round 2 of the 3 stored"),
])
def test_replay_refuses_limits_that_would_cut_the_stored_conversation(played, change, message):
    data = example()
    data["cases"] = data["cases"][:1]
    change(data)
    record = {**played, "runs": [row_of(played, PASSING_KEY)]}
    suite = regression.validate_suite(data)
    replayer = regression.ReplayProvider(record, "run.json")
    assert replayer.changed(suite, suite["cases"][0], record["runs"][0], results=False) == message


def test_a_record_whose_stored_tool_results_were_edited_is_refused_by_resume_and_merge(played):
    """An edited tool result stored beside a verdict: the stored conversation is not one the
    record's own suite plays, so --resume and --merge refuse it (the CLI table above)."""
    record = copy.deepcopy(played)
    row_of(record, PASSING_KEY)["rounds"][1]["tool_results"][0]["result"] = {"refund_id": "rf_9"}
    problem = regression.regrade_problem(record, "run.json", regression.load_suite(str(EXAMPLE)),
                                         record["runs"])
    assert problem.startswith("refund-correct / refund-shipped-order / repeat 0: its stored "
                              "conversation is not one its suite plays (round 2 call "
                              "refund_order("), problem


RESULTS = st.sampled_from([{"status": "shipped"}, {"status": "processing"}, {"error": "not found"},
                           {"refund_id": "rf_77", "status": "refunded"}, {"error": "refused"}])


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE)
@given(lookup=st.one_of(st.none(), RESULTS), refund=st.one_of(st.none(), RESULTS),
       allow=st.booleans())
def test_a_replay_never_grades_tool_results_the_model_was_not_sent(played, lookup, refund, allow):
    """Any change of the scripted results: the replay refuses exactly when a stored call would
    now be answered otherwise (never with the flag), and grades the stored rounds as they are."""
    data = example()
    for name, result in (("lookup_order", lookup), ("refund_order", refund)):
        if result is not None:
            data["cases"][0]["tool_results"][name] = result
    suite = regression.validate_suite(data)
    case = suite["cases"][0]
    record = {**played, "runs": [row_of(played, PASSING_KEY)]}
    stored = record["runs"][0]
    replayer = regression.ReplayProvider(record, "run.json")
    same = all(regression.scripted_result(case, sent["name"], sent["arguments"])[0]
               == sent["result"] for turn in stored["rounds"][:-1] for sent in turn["tool_results"])
    assert (replayer.changed(suite, case, stored, results=not allow) is None) == (same or allow)
    again = regression.run_row(replayer, suite, case, *PASSING_KEY[::2])
    assert again["rounds"] == stored["rounds"]


# ============================================================ 11. refused before anything is paid

def read_only_golden(folder):
    """A golden folder of two case files with placeholder pins, one of them read-only."""
    golden = folder / "golden"
    golden.mkdir()
    (golden / "SYSTEM.txt").write_text("You are a support agent.", encoding="utf-8")
    for name in ("a", "b"):
        write_json(golden / f"{name}.json", {"id": name, "user": "Hello?",
                                              "system_sha256": "compute-from-SYSTEM.txt"})
    (golden / "b.json").chmod(0o444)
    return golden


def test_update_baseline_of_a_golden_folder_with_a_read_only_case_file_sends_nothing(tmp_path,
                                                                                      capsys):
    golden = read_only_golden(tmp_path)
    with FakeServer(fakes.chat(lambda body: fakes.chat_response("hello"))) as server:
        code = run_main(["--suite", golden, "--provider", "openai", "--base-url",
                         server.url + "/v1", "--models", "m", "--update-baseline", "--out",
                         tmp_path / "run.json"])
        sent = server.count
    assert (code, sent) == (2, 0) and not (tmp_path / "run.json").exists()
    assert last_line(capsys.readouterr().err) == (
        f"regression.py: error: --update-baseline: {golden / 'b.json'}: it is read-only (its owner "
        "may not write it); make it writable first; nothing was run")


@pytest.mark.parametrize("prices, named", [
    (({"refund-claims": "1/2"}, {"refund-claims": "1/3"}), "prices refund-claims at 1/3, but"),
    (({"refund-claims": "1/2"}, None), "prices refund-claims at nothing, but"),
])
def test_merge_refuses_shards_priced_differently_naming_the_model(played, tmp_path, capsys, prices,
                                                                  named):
    paths = shards(played, tmp_path, *({"prices": price} if price else {} for price in prices))
    assert run_main(["--merge", tmp_path / "all.json", *paths]) == 2
    assert not (tmp_path / "all.json").exists()
    assert last_line(capsys.readouterr().err).startswith(
        f"regression.py: error: --merge: {paths[1]} {named} {paths[0]} at 1/2; one record keeps "
        "one price per model")
