"""Judged checks, attacked: inputs that made a rubric lie (an example that "agreed" untested, a
rubric or judge prompt that says nothing), leak (a masked value sent to the third-party judge) or
lose (a merged shard's judge_examples gradings). Exit codes are pinned through the real CLI
(fakes.cli_table); the input spaces are property tests of validate_suite."""

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from testkit import cli_env

# characters that every check reads as nothing: spaces, invisible (format) and control characters
NOTHING = st.text(st.sampled_from(" \t\n\u00a0\u2003\u200b\u200c\u200d\u2060\ufeff\u00ad\x07"))


def write(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def suite(cases, judge="judge-pass", **extra):
    spec = {"provider": "openai", "model": judge} if isinstance(judge, str) else judge
    return {"name": "attacked", "instructions": "Answer.", "cases": cases, "judge": spec, **extra}


def cli(runs, env=None):
    return fakes.cli_table([([str(arg) for arg in argv], cwd) for argv, cwd in runs],
                           cli_env(**(env or {})))


def echo_run(tmp_path, server, data, name, *flags):
    """(argv, cwd) of an echo run of suite `data` judged on `server`."""
    path = write(tmp_path / f"{name}-suite.json", data)
    return (["--suite", path, "--provider", "echo", "--judge-base-url", server.url + "/v1",
             "--out", tmp_path / f"{name}.json", *flags], tmp_path)


@pytest.fixture
def judge():
    with fakes.FakeServer(fakes.scripted_judge(cost=0.001)) as server:
        yield server


def sent(server):
    """Every judge request body, as text."""
    return [json.dumps(request.json) for request in server.requests]


# ============================================================= set-up that must test something

CASE = {"id": "a", "input": "an answer without the marker", "rubric": "R"}
SAYS_NOTHING = [  # (suite, what the one line says): each judged by a judge that passes anything
    (suite([CASE], judge_examples=[{"rubric": "R", "answer": "", "verdict": "fail"}]),
     "judge_examples #1: answer is empty"),
    (suite([CASE], judge_examples=[{"rubric": "R", "answer": " \u200b\n", "verdict": "fail"}]),
     "judge_examples #1: answer is empty"),
    (suite([CASE], judge_examples=[{"rubric": "\u200b", "answer": "x", "verdict": "pass"}]),
     "judge_examples #1: rubric must be a non-empty string"),
    (suite([{**CASE, "rubric": "\u200b\u2060"}]), "rubric must be a non-empty string"),
    (suite([{**CASE, "rubric": ["R", "\ufeff"]}]), "rubric must be a non-empty string"),
    (suite([{**CASE, "rubric": ["Apologises.", " apologises. "]}]), "rubric lists one text twice"),
    (suite([CASE], {"provider": "openai", "model": "judge-pass", "prompt": "\u200b \u200b"}),
     "judge prompt must be a non-empty string"),
    # examples of one label: a judge that passes everything agrees with them all
    (suite([CASE], judge_examples=[{"rubric": "R", "answer": "ok", "verdict": "pass"}] * 3),
     'judge_examples must label at least one answer "pass" and one "fail"'),
    (suite([CASE], "judge-500", judge_examples=[{"rubric": "R", "answer": "x", "verdict": "fail"}]),
     'judge_examples must label at least one answer "pass" and one "fail"'),
]


def test_a_setup_that_would_judge_nothing_is_one_line_and_exit_2_before_a_judge_request(
        tmp_path, judge):
    # before: exit 0, the run passed; an empty example "agreed" without the judge being asked
    results = cli([echo_run(tmp_path, judge, data, f"n{number}")
                   for number, (data, _) in enumerate(SAYS_NOTHING)])
    for (code, stdout, stderr), (_, said) in zip(results, SAYS_NOTHING):
        assert code == 2 and said in stderr, stderr
        assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert judge.requests == []
    assert not any(tmp_path.glob("n*[0-9].json"))


@settings(max_examples=60, deadline=None)
@given(NOTHING, NOTHING, st.sampled_from(["answer", "rubric"]))
def test_any_example_or_rubric_that_reads_as_nothing_is_a_suite_error(blank, pad, where):
    example = {"rubric": "R", "answer": "x", "verdict": "fail", where: blank}
    with pytest.raises(regression.SuiteError, match=f"judge_examples #1: {where}"):
        regression.validate_suite(suite([CASE], judge_examples=[example]))
    with pytest.raises(regression.SuiteError, match="rubric must be a non-empty string"):
        regression.validate_suite(suite([{**CASE, "rubric": ["R", blank]}]))
    with pytest.raises(regression.SuiteError, match="rubric lists one text twice"):
        regression.validate_suite(suite([{**CASE, "rubric": ["Same text.",
                                                             f"{pad}SAME {pad} text.{pad}"]}]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["pass", "fail"]), min_size=1, max_size=6))
def test_examples_gate_a_judge_only_when_they_hold_both_verdicts(labels):
    examples = [{"rubric": "R", "answer": f"answer {n}", "verdict": label}
                for n, label in enumerate(labels)]
    data = suite([CASE], judge_examples=examples)
    if set(labels) == {"pass", "fail"}:
        assert regression.validate_suite(data)["judge_examples"] == examples
    else:
        with pytest.raises(regression.SuiteError, match="one verdict would agree"):
            regression.validate_suite(data)


# ======================================================== what a third-party judge is sent

def same_number(request):
    """A judge that passes an answer naming the number the input asked about."""
    data = fakes.judge_request(request.json)[1]
    asked = re.findall(r"\[REDACTED[^\]]*\]|\d+", data["input"])
    said = "pass" if asked and asked[0] in data["answer"] else "fail"
    return fakes.Reply(body=fakes.chat_response(json.dumps({"verdict": said, "reason": "no"})))


def test_the_judge_grades_the_original_answer_and_only_what_is_stored_is_masked(tmp_path):
    # decided: a judge is a check, and checks read the original (masks apply to what is stored
    # and shown); masked, "order 1234" and "order 5678" would both read [REDACTED]: a false pass
    model = fakes.chat(lambda body: fakes.chat_response("Order 5678 ships Friday."))
    with fakes.FakeServer(model) as chat, fakes.FakeServer(same_number) as server:
        data = suite([{"id": "a", "input": "Where is order 1234?",
                       "rubric": "The reply names the order asked about."}], "j")
        run, _ = echo_run(tmp_path, server, data, "orig", "--redact", r"\b\d{4}\b")
        run[run.index("echo")] = "openai"
        ((code, stdout, stderr),) = cli([(run + ["--base-url", chat.url + "/v1", "--models", "m"],
                                          tmp_path)])
    assert code == 1, stderr  # rubric_failed: the judge saw 1234 asked and 5678 answered
    text = (tmp_path / "orig.json").read_text(encoding="utf-8")
    assert "rubric_failed" in text and "5678" not in text and "5678" not in stdout + stderr


def test_a_masked_value_cannot_be_guessed_back_from_the_hash_of_what_the_judge_read(
        tmp_path, judge):
    # before: data_sha256 hashed the unmasked answer, so 10,000 guesses gave the PIN back
    model = fakes.chat(lambda body: fakes.chat_response("GOOD: your PIN is 4821"))
    data = suite([{"id": "a", "input": "What is my PIN?", "rubric": "R"}], "judge-marker")
    with fakes.FakeServer(model) as chat:
        run, _ = echo_run(tmp_path, judge, data, "pin", "--redact", r"\b\d{4}\b")
        run[run.index("echo")] = "openai"
        ((code, _, stderr),) = cli([(run + ["--base-url", chat.url + "/v1", "--models", "m"],
                                     tmp_path)])
    assert code == 0, stderr
    assert "4821" in sent(judge)[0]  # the judge graded the original
    row = json.loads((tmp_path / "pin.json").read_text(encoding="utf-8"))["runs"][0]
    digest, answer = row["judgements"][0]["data_sha256"], row["answer_text"]
    assert answer == "GOOD: your PIN is [REDACTED]"
    assert digest == regression.judge_data("What is my PIN?", "R", answer)[1]
    guesses = (answer.replace("[REDACTED]", f"{n:04d}") for n in range(10_000))
    assert not any(regression.judge_data("What is my PIN?", "R", guess)[1] == digest
                   for guess in guesses)


# ================================================================ what --merge keeps

def test_a_merge_keeps_every_shards_judge_agreement_and_its_spend(tmp_path, judge):
    # before: the merged record held shard 1's gradings only; shard 2's calls and spend were lost
    data = suite([{"id": f"c{n}", "input": f"GOOD {n}", "rubric": "R"} for n in range(2)],
                 "judge-marker",
                 judge_examples=[{"rubric": "R", "answer": "GOOD", "verdict": "pass"},
                                 {"rubric": "R", "answer": "bad", "verdict": "fail"}])
    shards = [echo_run(tmp_path, judge, data, f"s{n}", "--shard", f"{n}/2") for n in (1, 2)]
    merged = tmp_path / "merged.json"
    results = cli([*shards, (["--merge", merged, tmp_path / "s1.json", tmp_path / "s2.json"],
                             tmp_path)])
    assert [code for code, _, _ in results] == [0, 0, 0], results[-1][2]
    agreement = json.loads(merged.read_text(encoding="utf-8"))["judge_agreement"]
    assert agreement["agreed"] == agreement["examples"] == 4
    assert agreement["cost_usd"] == "0.004" and len(agreement["judgements"]) == 4
    assert [result["verdict"] for result in agreement["results"]] == ["pass", "fail"] * 2


@pytest.mark.parametrize("parts, expected", [
    ([{"agreed": 1, "examples": 1, "cost_usd": "0.5", "results": [1], "judgements": [1]}, None],
     {"agreed": 1, "examples": 1, "cost_usd": "0.5", "results": [1], "judgements": [1]}),
    ([{"agreed": 1, "examples": 1, "cost_usd": None}, {"agreed": 2, "examples": 2,
                                                       "cost_usd": "0.1"}],
     {"agreed": 3, "examples": 3, "cost_usd": None, "results": [], "judgements": []}),
    ([{"agreed": "x", "cost_usd": "NaN", "results": "x"}, {"agreed": 1, "cost_usd": "1",
                                                          "results": [2]}],
     {"agreed": 1, "examples": 0, "cost_usd": None, "results": [2], "judgements": []}),
    ([None, None], None),
])
def test_merged_agreements_sum_what_they_can_and_never_invent_a_cost(parts, expected):
    records = [{"judge_agreement": part} if part is not None else {} for part in parts]
    assert regression.merged_agreement(records) == expected


# ============================================================ what --dry-run says of the cap

def test_the_dry_run_warns_when_the_cap_cannot_hold_the_judges_spend(tmp_path, judge):
    # before: a model without a price got this warning, an unpriced judge none
    data = suite([{"id": "a", "input": "GOOD", "rubric": "R"}], "judge-marker")
    flags = [["--max-cost-usd", "1"], ["--max-cost-usd", "1", "--price", "judge-marker=1/2"], []]
    results = cli([echo_run(tmp_path, judge, data, f"d{n}", "--dry-run", *flag)
                   for n, flag in enumerate(flags)])
    assert [code for code, _, _ in results] == [0, 0, 0]
    warned = ["judge's cost reporting is unknown and judge-marker has no price" in stdout
              for _, stdout, _ in results]
    assert warned == [True, False, False] and judge.requests == []
    assert "Add --price judge-marker=IN/OUT" in results[0][1]


# ================================================ a judge reply that did not finish holds no verdict

PASS = '{"verdict": "pass", "reason": "it does"}'
UNFINISHED = {  # judge model -> a reply whose text is a whole pass verdict, but the reply is not
    "cut": fakes.chat_response(PASS, finish_reason="length"),
    "filtered": fakes.chat_response(PASS, finish_reason="content_filter"),
    "tool": fakes.chat_response(PASS, tool_calls=[("lookup", {})]),
}


def test_a_judge_reply_that_did_not_complete_is_an_execution_error_never_a_pass(tmp_path):
    # before: each of these graded the answer "pass" and the run passed (exit 0)
    def reply(request):
        return fakes.Reply(body=UNFINISHED[request.json["model"]])

    with fakes.FakeServer(reply) as server:
        results = cli([echo_run(tmp_path, server, suite([CASE], model), model)
                       for model in UNFINISHED])
    for (code, _, stderr), model in zip(results, UNFINISHED):
        assert code == 2, (model, stderr)
        row = json.loads((tmp_path / f"{model}.json").read_text(encoding="utf-8"))["runs"][0]
        assert row["error"] == "JudgeError" and "did not complete its reply" in row["error_message"]
        assert row["judgements"][0]["response"] == UNFINISHED[model]  # the reply is evidence


def _with_error(where):
    reply = fakes.chat_response(PASS)
    error = {"code": 502, "message": "upstream provider disconnected"}
    (reply if where == "top" else reply["choices"][0]).update(error=error)
    return reply


ERRORED = {"top": _with_error("top"), "choice": _with_error("choice")}


def test_a_judge_reply_with_a_verdict_and_an_error_is_an_execution_error(tmp_path):
    # before: HTTP 200 holding choices with a pass verdict and an error object (top-level, or on
    # the choice: OpenRouter's upstream failure) was read as the verdict, and the row passed
    def reply(request):
        return fakes.Reply(body=ERRORED[request.json["model"]])

    with fakes.FakeServer(reply) as server:
        results = cli([echo_run(tmp_path, server, suite([CASE], model), model) for model in ERRORED])
    for (code, _, stderr), model in zip(results, ERRORED):
        assert code == 2, (model, stderr)
        row = json.loads((tmp_path / f"{model}.json").read_text(encoding="utf-8"))["runs"][0]
        assert row["error"] == "JudgeError" and "the endpoint answered with an error: upstream " \
            "provider disconnected" in row["error_message"]
        assert row["judgements"][0]["response"] == ERRORED[model]  # the reply is evidence


def test_a_key_in_the_judges_base_url_path_is_masked_in_the_record(tmp_path, judge):
    # before: config.judge.base_url kept the key the judge's endpoint took in its path
    key = "judge-path-key-0123456789"
    data = suite([CASE], {"provider": "openai", "model": "judge-pass", "api_key_env": "JUDGE_KEY"})
    path = write(tmp_path / "suite.json", data)
    ((code, stdout, stderr),) = cli([(["--suite", path, "--provider", "echo", "--judge-base-url",
                                       f"{judge.url}/{key}/v1", "--out", tmp_path / "run.json"],
                                      tmp_path)], env={"JUDGE_KEY": key})
    assert code == 0, stderr
    text = (tmp_path / "run.json").read_text(encoding="utf-8")
    assert key not in text + stdout + stderr
    assert json.loads(text)["config"]["judge"]["base_url"] == f"{judge.url}/[REDACTED:secret]/v1"


@pytest.mark.parametrize("provider, raw, verdict", [
    ("openai", fakes.chat_response(PASS), ("pass", "it does")),
    ("anthropic", fakes.message_response(PASS), ("pass", "it does")),
    *[("openai", raw, None) for raw in UNFINISHED.values()],
    ("anthropic", fakes.message_response(PASS, stop_reason="max_tokens"), None),
    ("anthropic", fakes.message_response(PASS, tool_uses=[("lookup", {})]), None),
])
def test_a_stored_judge_reply_stands_only_when_it_completed(provider, raw, verdict):
    judge = regression.Judge({"provider": provider, "model": "j", "repeats": 1,
                              "prompt": regression.JUDGE_PROMPT})
    assert judge.read(raw) == verdict


# ======================================================================== who may judge

def test_echo_cannot_judge_and_says_so_before_a_paid_model_request(tmp_path):
    # before: each model request was paid, then the row failed: echo repeats the data it is sent,
    # so it never replies a verdict
    model = fakes.chat(lambda body: fakes.chat_response("GOOD"))
    with fakes.FakeServer(model) as chat:
        live = ["--provider", "openai", "--base-url", chat.url + "/v1", "--models", "m"]
        named = write(tmp_path / "named.json", suite([CASE], {"provider": "echo", "model": "e"}))
        flagged = write(tmp_path / "flagged.json", suite([CASE], {"provider": "openai",
                                                                  "model": "j"}))
        results = cli([(["--suite", named, *live, "--out", tmp_path / "n.json"], tmp_path),
                       (["--suite", flagged, *live, "--judge-provider", "echo",
                         "--out", tmp_path / "f.json"], tmp_path)])
        assert chat.requests == []
    for code, _, stderr in results:
        assert code == 2 and "provider 'echo' cannot judge" in stderr, stderr
        assert len(stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob("[nf].json"))


def test_the_key_note_of_a_judge_endpoint_names_the_judges_own_key_setting(tmp_path, judge):
    """A vendor key the judge's endpoint does not get is named with the judge's api_key_env:
    --api-key-env would give the key to the model's endpoint instead."""
    data = suite([CASE], judge={"provider": "openai", "model": "judge-pass"})
    plain = write(tmp_path / "plain.json", {"name": "p", "instructions": "Answer.",
                                            "cases": [{"id": "a", "input": "hi"}]})
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("hello"))) as chat:
        model = (["--suite", plain, "--provider", "openai", "--base-url", chat.url + "/v1",
                  "--models", "m", "--out", tmp_path / "model.json"], tmp_path)
        results = cli([echo_run(tmp_path, judge, data, "note"), model],
                      env={"OPENAI_API_KEY": "sk-vendor-key-not-for-this-host"})
    for (code, _, err), who, url, setting in zip(results, ("the judge: ", ""), (judge, chat),
                                                 ("the judge's api_key_env", "--api-key-env")):
        note = [line for line in err.splitlines() if "OPENAI_API_KEY is not sent" in line]
        assert code == 0 and note == [
            f"note: {who}OPENAI_API_KEY is not sent to {url.url}/v1; name the endpoint's key "
            f"variable with {setting}"], err
        assert "sk-vendor" not in err


# ===================================== a judged record graded again: masked, edited, resumed

REFUND = "The reply states a refund window."
SECRET_INPUT = "I am alice@example.com, re TICKET-4821. How long is the refund window?"


def compare(runs):
    """[(exit code, stdout, stderr)] of compare_runs.py for each (argv, cwd)."""
    return fakes.cli_table([([str(arg) for arg in argv], cwd) for argv, cwd in runs], cli_env(),
                           script="compare_runs.py", flags=("-W", "error"))


def model_run(tmp_path, chat, judge, data, name, *flags):
    """(argv, cwd) of a run of suite `data` by model m on `chat`, judged on `judge`."""
    path = write(tmp_path / f"{name}-suite.json", data)
    return (["--suite", path, "--provider", "openai", "--base-url", chat.url + "/v1", "--models",
             "m", "--judge-base-url", judge.url + "/v1", "--out", tmp_path / f"{name}.json",
             "--quiet", *flags], tmp_path)


def answering(state):
    """A model server that answers state["answer"] (a 503 while state["down"] holds the input)."""
    def answer(request):
        said = [m["content"] for m in request.json["messages"] if m["role"] == "user"][-1]
        if said == state.get("down"):
            return fakes.Reply(503, {"error": {"message": "overloaded"}})
        return fakes.Reply(body=fakes.chat_response(state["answer"], cost=0.001))
    return answer


@pytest.mark.parametrize("flags", [["--redact-pii"], ["--redact", r"TICKET-[0-9]+"],
                                   ["--redact-pii", "--redact", r"TICKET-[0-9]+"]])
def test_a_redacted_records_judgements_stand_so_compare_and_report_give_its_verdict(
        tmp_path, judge, flags):
    # before: the judgement hashed the masked input, a regrade the input as stored, so no stored
    # judgement stood: every row graded execution_error, and a real regression compared
    # STILL_FAILING (exit 0); two honest runs compared as both failing
    data = suite([{"id": "refund", "input": SECRET_INPUT, "rubric": REFUND}], "judge-marker")
    state = {}
    with fakes.FakeServer(answering(state)) as chat:
        for name, answer in (("before", "GOOD: 30 days"), ("after", "Ask support."),
                             ("again", "GOOD: 30 days")):
            state["answer"] = answer
            ((code, _, stderr),) = cli([model_run(tmp_path, chat, judge, data, name, *flags)])
            assert code == (1 if name == "after" else 0), stderr
    (new, _, _), (same, stdout, _) = compare([(["before.json", "after.json"], tmp_path),
                                              (["before.json", "again.json"], tmp_path)])
    assert new == 1 and same == 0, stdout
    regressed = compare([(["before.json", "after.json"], tmp_path)])[0][1]
    assert "NEW_FAILURE" in regressed and "CAUTION" not in regressed + stdout
    ((code, _, stderr),) = cli([(["--report", "before.json", "--markdown", "r.md"], tmp_path)])
    assert code == 0 and "CAUTION" not in stderr, stderr
    row = json.loads((tmp_path / "before.json").read_text(encoding="utf-8"))["runs"][0]
    # the hash is of what the record holds: the input as its config does, the answer as stored
    assert row["judgements"][0]["data_sha256"] == regression.judge_data(
        SECRET_INPUT, REFUND, row["answer_text"])[1]


def test_a_stopped_redacted_run_resumes_and_keeps_its_judged_row(tmp_path, judge):
    # before: --resume refused it: "stored as PASS but its stored response now grades FAIL"
    data = suite([{"id": "refund", "input": SECRET_INPUT, "rubric": REFUND},
                  {"id": "other", "input": "q2", "contains": ["GOOD"]}], "judge-marker")
    state = {"answer": "GOOD: 30 days", "down": "q2"}
    with fakes.FakeServer(answering(state)) as chat:
        first = model_run(tmp_path, chat, judge, data, "run", "--redact-pii")
        ((code, _, stderr),) = cli([first])
        assert code == 2, stderr
        state["down"] = None
        ((code, _, stderr),) = cli([(["--resume", tmp_path / "run.json", "--base-url",
                                      chat.url + "/v1", "--quiet"], tmp_path)])
    assert code == 0, stderr
    assert len(judge.requests) == 1  # the kept row's judgement stood: it was not paid twice
    rows = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))["runs"]
    assert sorted((row["case_id"], row["passed"]) for row in rows) == [("other", True),
                                                                      ("refund", True)]


def split_judge(request):
    """A judge of repeats 3: every call passes an answer with the marker; any other answer gets
    pass, fail, fail (1 of 3 pass)."""
    data = fakes.judge_request(request.json)[1]
    with LOCK:
        COUNT[0] += 1
        said = "pass" if "GOOD" in data["answer"] or COUNT[0] % 3 == 1 else "fail"
    return fakes.Reply(body=fakes.chat_response(json.dumps({"verdict": said, "reason": said}),
                                                cost=0.001))


LOCK, COUNT = __import__("threading").Lock(), [0]


def _copied_pass(row):  # the real pass entry copied twice: five entries for repeats 3
    passing = next(entry for entry in row["judgements"] if entry["verdict"] == "pass")
    row["judgements"] = [passing, passing, *row["judgements"]]


def _flipped(row):
    row.update(passed=True, reasons=[])
    for key in ("verdicts", "details"):
        row.pop(key, None)


EDITS = {  # (side, edit of its one row)
    "after: a pass copied in": ("after", _copied_pass),
    "after: a pass copied in, the verdict flipped": ("after", lambda row: (_copied_pass(row),
                                                                            _flipped(row))),
    "before: cut to one judgement": ("before", lambda row: row.update(
        judgements=row["judgements"][:1])),
    "before: a failed call kept as a stand-in": ("before", lambda row: row.update(
        judgements=[*row["judgements"][:2], {**row["judgements"][2], "error": "x"}])),
    "before: the judged data's hash replaced": ("before", lambda row: [
        entry.update(data_sha256="0" * 64) for entry in row["judgements"]]),
}


def test_stored_judgements_stand_only_as_the_calls_a_run_makes(tmp_path):
    # before: five entries for repeats 3 (a pass copied in) and the verdict flipped compared
    # PASS, exit 0, no CAUTION; a before cut to fewer than repeats graded execution_error, so a
    # NEW_FAILURE compared STILL_FAILING, exit 0
    data = suite([{"id": "a", "input": "q1", "rubric": "R"}],
                 {"provider": "openai", "model": "j", "repeats": 3})
    state = {}
    with fakes.FakeServer(answering(state)) as chat, fakes.FakeServer(split_judge) as judge:
        for name, answer in (("before", "GOOD answer"), ("after", "an answer")):
            state["answer"] = answer
            ((code, _, stderr),) = cli([model_run(tmp_path, chat, judge, data, name)])
            assert code == (1 if name == "after" else 0), stderr
    honest = {side: json.loads((tmp_path / f"{side}.json").read_text(encoding="utf-8"))
              for side in ("before", "after")}
    write(tmp_path / "copy.json", honest["before"])
    runs = [(["before.json", "after.json"], tmp_path), (["before.json", "copy.json"], tmp_path)]
    for number, (side, edit) in enumerate(EDITS.values()):
        record = json.loads(json.dumps(honest[side]))
        edit(record["runs"][0])
        write(tmp_path / f"edit{number}.json", record)
        pair = ["edit%d.json" % number, "after.json"] if side == "before" else \
            ["before.json", f"edit{number}.json"]
        runs.append((pair, tmp_path))
    results = compare(runs)
    assert [code for code, _, _ in results[:2]] == [1, 0], results[0][1]  # honest controls
    for (code, stdout, _), name in zip(results[2:], EDITS):
        assert code == 2 and stdout.startswith("NOT_COMPARABLE: ") and \
            "cannot be graded again" in stdout and len(stdout.splitlines()) == 1, (name, stdout)
    ((code, _, stderr),) = cli([(["--report", "edit1.json", "--markdown", "r.md"], tmp_path)])
    report = (tmp_path / "r.md").read_text(encoding="utf-8")
    assert code == 0 and "CAUTION" in stderr, stderr  # reported as what it is: an error row
    assert "**ERROR" in report and "cannot be graded again" in report


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 5])
def test_a_stored_judgement_set_stands_only_at_exactly_repeats_calls(count):
    judge = regression.Judge({"provider": "openai", "model": "j", "repeats": 3,
                              "prompt": regression.JUDGE_PROMPT})
    entry = {"rubric": "R", "judge": judge.mark, "data_sha256": "d",
             "response": fakes.chat_response(PASS)}
    other = {**entry, "rubric": "another"}  # another rubric's calls never count for this one
    stood = judge.reused([entry] * count + [other] * 2, "R", "d")
    assert (stood is not None) == (count == 3)
    assert judge.reused([entry, entry, {**entry, "error": "x"}], "R", "d") is None


# ================================================ the judge reads what the customer was shown

ADDRESS = "Customer 42 lives at 12 Elm Street."
REFUSAL = "Sorry, I can't share customer addresses."


def address_judge(request):
    """A perfect judge of "reveals no address": fails any answer naming a street address."""
    answer = fakes.judge_request(request.json)[1]["answer"]
    said = "fail" if re.search(r"\d+ \w+ Street", answer) else "pass"
    return fakes.Reply(body=fakes.chat_response(json.dumps({"verdict": said, "reason": said}),
                                                cost=0.001))


@pytest.mark.parametrize("content, shown, code", [
    # no <think> opened: a UI has no start to fold from, so the customer read the address
    (f"{ADDRESS} </think> {REFUSAL}", f"{ADDRESS}  {REFUSAL}", 1),
    (f"{ADDRESS}</think>{REFUSAL}<think>more</think>", f"{ADDRESS}{REFUSAL}", 1),
    (f"{ADDRESS}</think>", ADDRESS, 1),  # an empty answer after it: what was shown is judged
    # controls: a block the content opened folds; plain text is judged as it came
    (f"<think>{ADDRESS}</think> {REFUSAL}", REFUSAL, 0),
    (f"{REFUSAL}\n", f"{REFUSAL}\n", 0),
])
def test_the_judge_reads_text_before_a_think_close_the_content_never_opened(
        tmp_path, content, shown, code):
    # before: the judge was sent only the text after </think> and passed an answer that gave the
    # customer's address (exit 0)
    data = suite([{"id": "a", "input": "Where does customer 42 live?",
                   "rubric": "The reply reveals no customer's address."}], "j")
    state = {"answer": content}
    with fakes.FakeServer(answering(state)) as chat, fakes.FakeServer(address_judge) as judge:
        ((got, _, stderr),) = cli([model_run(tmp_path, chat, judge, data, "run")])
        assert got == code, stderr
        assert [fakes.judge_request(r.json)[1]["answer"] for r in judge.requests] == [shown]
        bare = write(tmp_path / "bare.json", {key: value for key, value in data.items()
                                              if key != "judge"})
        replay = cli([(["--suite", bare, "--provider", "replay", "--replay", "run.json",
                        "--out", "replayed.json", "--quiet"], tmp_path)])
        assert replay[0][0] == code and len(judge.requests) == 1, replay[0][2]  # it stood
    record = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
    assert record["runs"][0]["answer_text"] == regression.OpenAIProvider.answer(content)
    write(tmp_path / "copy.json", record)
    ((same, stdout, _),) = compare([(["run.json", "copy.json"], tmp_path)])
    assert same == 0 and "CAUTION" not in stdout, stdout  # its judgement stands when regraded


# ======================================================================== a judge of its own

def test_a_model_judging_its_own_answers_is_warned_of_at_dry_run_and_run_start(tmp_path):
    # before: no word of it: the model under test graded its own answers and passed them
    def reply(request):
        if fakes.judge_request(request.json)[1] is not None:
            return fakes.Reply(body=fakes.chat_response(PASS, cost=0.001))
        return fakes.Reply(body=fakes.chat_response("Your parcel ships Friday.", cost=0.001))

    data = suite([{"id": "a", "input": "Where is my parcel?", "rubric": "It apologises."}], "m")
    other = suite(data["cases"], "j")
    with fakes.FakeServer(reply) as chat, fakes.FakeServer(reply) as elsewhere:
        own = model_run(tmp_path, chat, chat, data, "own")
        runs = [own, (own[0] + ["--dry-run"], tmp_path),
                model_run(tmp_path, chat, chat, other, "other"),  # another model, same endpoint
                model_run(tmp_path, chat, elsewhere, data, "away")]  # m, another endpoint
        results = cli(runs)
    warned = [[line for line in (out + err).splitlines() if "grades its own answers" in line]
              for _, out, err in results]
    assert [code for code, _, _ in results] == [0, 0, 0, 0], results
    assert [len(lines) for lines in warned] == [1, 1, 0, 0], warned
    assert warned[0][0].startswith("warning: the judge openai m at http://127.0.0.1:")


# ======================================================== a judge reply that says it failed

def test_a_judge_reply_with_a_top_level_error_beside_its_choices_gives_no_verdict(tmp_path):
    # a 200 whose body says error and also holds a pass: the judge failed, so no verdict stands
    def reply(request):
        return fakes.Reply(body={**fakes.chat_response(PASS), "error": {"message": "internal"}})

    with fakes.FakeServer(reply) as server:
        ((code, _, stderr),) = cli([echo_run(tmp_path, server, suite([CASE], "j"), "err")])
    assert code == 2, stderr
    row = json.loads((tmp_path / "err.json").read_text(encoding="utf-8"))["runs"][0]
    assert row["error"] == "JudgeError" and not row["passed"]


# ============================ a masked judged record: its hash is of what a regrade reads

ANCHORED = "<think>Look up the ticket.</think>\n\nTICKET-123 is open."
LONE_THINK = "I will give the support address.</think>help@example.com answers within a day."


@pytest.mark.parametrize("content, flags, original", [
    (ANCHORED, ["--redact", "^TICKET-[0-9]+"], "TICKET-123"),  # masked after the think block
    (LONE_THINK, ["--redact-pii"], "help@example.com"),  # the rule matched across the </think>
    (ANCHORED, [], "TICKET-123"),  # the controls: nothing masked
    ("TICKET-123 is open.", ["--redact", "^TICKET-[0-9]+"], "TICKET-123")])  # they commute
def test_a_masked_judged_record_is_reported_compared_and_resumed_as_it_was_judged(
        tmp_path, judge, content, flags, original):
    # before: data_sha256 hashed the masked answer the judge read, a regrade the answer it reads
    # out of the masked response; masking and reading it do not commute, so no stored judgement
    # stood: --report CAUTION (execution_error), compare with its own copy NOT_COMPARABLE (exit
    # 2), --resume exit 2: the paid record was lost
    data = suite([{"id": "a", "input": "Is my ticket open?", "rubric": "R"},
                  {"id": "tail", "input": "plain", "contains": ["e"]}])
    with fakes.FakeServer(answering({"answer": content})) as chat:
        ((code, _, stderr),) = cli([model_run(tmp_path, chat, judge, data, "run", *flags)])
        assert code == 0, stderr
        assert original in sent(judge)[0]  # the judge is sent the answer unmasked
        text = (tmp_path / "run.json").read_bytes()
        stored = json.loads(text)["runs"][0]  # the judged row: its answer as stored
        assert (original in stored["answer_text"]) == (not flags), stored["answer_text"]
        (tmp_path / "copy.json").write_bytes(text)
        (tmp_path / "torn.json").write_bytes(text[:text.rindex(b"\n{") + 60])
        table = cli([(["--report", "run.json", "--markdown", "r.md"], tmp_path),
                     (["--resume", "torn.json", "--base-url", chat.url + "/v1", "--quiet", *flags],
                      tmp_path)])
    assert [code for code, _, _ in table] == [0, 0], table
    assert "CAUTION" not in "".join(out + err for _, out, err in table), table
    assert len(sent(judge)) == 1  # the resume kept the judged row: not judged (paid) again
    resumed = json.loads((tmp_path / "torn.json").read_text(encoding="utf-8"))
    assert resumed["resumed"][0]["kept_rows"] == 1 and len(resumed["runs"]) == 2
    for other in ("copy.json", "torn.json"):
        ((same, stdout, _),) = compare([(["run.json", other], tmp_path)])
        assert same == 0 and "CAUTION" not in stdout, (other, stdout)
