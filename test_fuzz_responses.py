"""What a server returns, fuzzed: any JSON value at any place of a response body (openai chat
completions, anthropic Messages, perplexity through the real SDK), also in a played round and a
conversation's turn. A row is graded, or is an execution error (exit 2) that keeps the body as
its evidence; a body whose tool calls cannot be read is never graded as a turn without them.

The properties run the CLI in-process (regression.main) against one loopback FakeServer whose
replies each example sets; each fixed hostile body pins its exit code and its line through the
real CLI (fakes.cli_table)."""

import decimal
import itertools
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fakes
import regression
from fakes import Reply
from testkit import clean_env, cli_env, read_record, run_main  # noqa: F401,F811

PPLX = {"PERPLEXITY_API_KEY": "pplx-test-0123456789"}
TOOLS = [{"type": "function", "function": {"name": name, "description": name, "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}}}}}
    for name in ("lookup_order", "refund_order")]
RESULTS = {"lookup_order": {"status": "shipped"}, "refund_order": {"status": "refunded"}}
FORBID = {"input": "refund ord_1?", "contains": ["done"],
          "behaviors": ["forbid_tool:refund_order"]}
PLAYED = {**FORBID, "tool_results": RESULTS}
TURNS = {"turns": [{"user": "hi", "contains": ["ok"]}, {"user": "again", "contains": ["ok"]}]}
FUZZ = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
NUMBER = itertools.count()


def calling(provider, name="refund_order", text="done"):
    """A body of `provider` whose model says `text` and calls `name` (no call: name None)."""
    calls = [(name, {"order_id": "ord_1"})] if name else []
    if provider == "openai":
        return fakes.chat_response(text, tool_calls=calls, cost=0.001)
    if provider == "anthropic":
        return fakes.message_response(text, tool_uses=calls)
    return fakes.agent_response(text, function_calls=calls, cost=0.001)


@pytest.fixture(scope="module")
def server():
    with fakes.FakeServer(lambda request: Reply(404)) as server:
        yield server


@pytest.fixture(autouse=True)
def perplexity_env(server, monkeypatch, clean_env):  # after clean_env scrubs them
    """The perplexity provider's key and endpoint (the loopback server) for in-process runs."""
    monkeypatch.setenv("PERPLEXITY_API_KEY", PPLX["PERPLEXITY_API_KEY"])
    monkeypatch.setenv("PERPLEXITY_BASE_URL", server.url)


def argv(provider, server, folder, case):
    """The CLI arguments of a one-case run of `case` against `server`, and its record's path."""
    suite, out = folder / f"suite-{next(NUMBER)}.json", folder / f"run-{next(NUMBER)}.json"
    suite.write_text(json.dumps({"name": "fuzz", "instructions": "Answer.", "tools": TOOLS,
                                 "cases": [{"id": "c", **case}]}), encoding="utf-8")
    where = {"openai": ["--base-url", server.url + "/v1"], "anthropic": ["--base-url", server.url],
             "perplexity": []}[provider]
    return ["--provider", provider, *where, "--models", "m", "--suite", suite, "--out", out], out


def answers(replies):
    """A reply function answering request n with replies[n] (the last one from then on)."""
    sent = itertools.count()
    return lambda request: replies[min(next(sent), len(replies) - 1)]


def stored(provider, body):
    """A body as a record holds it: NaN and infinities as text, no null for the SDK's provider."""
    return json.loads(regression.dumps(
        regression._without_none(body) if provider == "perplexity" else body))


def run(server, folder, provider, case, replies):
    """(exit code, the row) of an in-process run whose server answers `replies` in turn."""
    server.reply = answers([reply if isinstance(reply, Reply) else Reply(body=reply)
                            for reply in replies])
    args, out = argv(provider, server, folder, case)
    code = run_main(args)
    (row,) = read_record(out)["runs"]
    return code, row


# ====================================================================== the body is the evidence

NO_ANSWER = {"openai": {"choices": [{"message": 7}]}, "anthropic": {"content": 5}}
SAYS_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


@pytest.mark.parametrize("provider, case, replies", [
    ("openai", FORBID, [NO_ANSWER["openai"]]),
    ("anthropic", FORBID, [NO_ANSWER["anthropic"]]),
    ("openai", PLAYED, [calling("openai", "lookup_order"), NO_ANSWER["openai"]]),
    ("anthropic", PLAYED, [calling("anthropic", "lookup_order"), NO_ANSWER["anthropic"]]),
    ("anthropic", PLAYED, [calling("anthropic", "lookup_order"), SAYS_ERROR]),
    ("openai", PLAYED, [calling("openai", "lookup_order"), {"error": {"message": "busy"}}]),
    ("openai", TURNS, [calling("openai", None, "ok"), NO_ANSWER["openai"]]),
], ids=["openai", "anthropic", "openai-round-2", "anthropic-round-2", "anthropic-error-round-2",
        "openai-error-round-2", "openai-turn-2"])
def test_a_body_that_is_no_answer_is_kept_as_the_rows_evidence(server, tmp_path, provider, case,
                                                                replies):
    """A JSON object without the parts of an answer (or one saying error) is an execution error
    whose row keeps that body: as its response, and as the last of its rounds when played."""
    code, row = run(server, tmp_path, provider, case, replies)
    assert (code, row["error"]) == (2, "ResponseError")
    assert row["response"] == replies[-1]
    rounds = row["turns"][-1]["rounds"] if "turns" in case else row.get("rounds")
    if rounds is not None:
        assert [turn["response"] for turn in rounds] == replies[-len(rounds):]
        assert len(rounds) == (1 if "turns" in case else 2)


# ====================================================================== a call that cannot be read

DELETED = object()
NOT_TEXT = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.just(10**400),
                     st.lists(st.text(max_size=3), max_size=2), st.just(DELETED),
                     st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
                     st.sampled_from(["", "  ", "\u200b"]))
NOT_OBJECT = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                       st.lists(st.integers(), max_size=2))
NOT_A_CALL = st.one_of(NOT_OBJECT, st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _put(body, path, value):
    """`body` with the value at `path` replaced by `value` (DELETED: the key removed)."""
    body = json.loads(json.dumps(body))
    *parents, last = path
    holder = body
    for step in parents:
        holder = holder[step]
    if value is DELETED:
        del holder[last]
    else:
        holder[last] = value
    return body


# (provider, where the call's name is, where the call is): each holds refund_order's call
NAME_AT = {"openai": ("choices", 0, "message", "tool_calls", 0, "function", "name"),
           "anthropic": ("content", 1, "name"), "perplexity": ("output", 0, "name")}


@FUZZ
@given(provider=st.sampled_from(sorted(NAME_AT)), played=st.booleans(), name=NOT_TEXT)
def test_a_tool_call_that_names_no_tool_is_an_execution_error_never_a_pass(server, tmp_path,
                                                                           provider, played, name):
    """forbid_tool passed on a call whose name is missing, not a text, or blank (it could have
    been the forbidden tool): now the row is an execution error that keeps the body."""
    bad = _put(calling(provider), NAME_AT[provider], name)
    replies = [calling(provider, "lookup_order"), bad] if played else [bad]
    code, row = run(server, tmp_path, provider, PLAYED if played else FORBID, replies)
    assert (code, row["error"]) == (2, "ResponseError")
    assert "tool call 1 of the response names no tool" in row["error_message"]
    assert row["response"] == stored(provider, bad)


# where each provider's body holds refund_order's call, and what may be put there instead
UNREADABLE_AT = {
    "openai": [(("choices", 0, "message", "tool_calls", 0), NOT_A_CALL),
               (("choices", 0, "message", "tool_calls"), st.one_of(NOT_OBJECT, st.just(DELETED),
                                                                   st.just({}), st.just([])))],
    "anthropic": [(("content", 1), st.one_of(NOT_OBJECT, st.just(DELETED)))],
    "perplexity": [(("output", 0), NOT_OBJECT)]}
UNREADABLE = ["names no tool", 'finish_reason "tool_calls", but the message holds no tool call',
              'stop_reason "tool_use", but the content holds no tool_use block',
              "a content block of the response is not an object",
              "an output item of the response is not an object"]


@st.composite
def unreadable_calls(draw):
    """(provider, a body of it whose call to refund_order cannot be read)."""
    provider = draw(st.sampled_from(sorted(UNREADABLE_AT)))
    path, values = draw(st.sampled_from(UNREADABLE_AT[provider]))
    return provider, _put(calling(provider), path, draw(values))


@FUZZ
@given(called=unreadable_calls(), played=st.booleans())
def test_a_turn_whose_calls_cannot_be_read_is_never_graded_as_one_without_them(server, tmp_path,
                                                                              called, played):
    """A call entry that is no call object, a finish_reason / stop_reason of tool calls with none
    left, a content block or output item that is no object: forbid_tool passed on each (the
    call was dropped unread); now each is an execution error that keeps the body."""
    provider, bad = called
    replies = [calling(provider, "lookup_order"), bad] if played else [bad]
    code, row = run(server, tmp_path, provider, PLAYED if played else FORBID, replies)
    assert (code, row["error"]) == (2, "ResponseError")
    assert any(said in row["error_message"] for said in UNREADABLE), row["error_message"]
    assert row["response"] == stored(provider, bad)


# ====================================================================== cost

NOT_A_NUMBER = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.floats(),
                         st.sampled_from(["0.001", "1e999", "5", [0.001], {"usd": 1}]))


def usage_of(provider, body, value):
    """`body` whose reported cost (openai, perplexity) or token counts (anthropic) are `value`."""
    body = json.loads(json.dumps(body))
    if provider == "openai":
        body["usage"]["cost"] = value
    elif provider == "anthropic":
        body["usage"] = {"input_tokens": value, "output_tokens": value}
    else:
        body["usage"]["cost"]["total_cost"] = value
    return body


def _amount(provider, value):
    """The cost an honest reading of `value` gives (None: none reported)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    if provider == "anthropic":  # priced at $1 a token each way
        return decimal.Decimal(2 * value) if number and isinstance(value, int) else None
    return decimal.Decimal(repr(value)) if number and math.isfinite(value) else None


@FUZZ
@given(provider=st.sampled_from(["openai", "anthropic"]), played=st.booleans(),
       value=st.one_of(NOT_A_NUMBER, st.integers(0, 10**6), st.floats(0, 10)))
def test_a_cost_is_read_only_from_a_number_the_body_holds(server, tmp_path, provider, played,
                                                          value):
    """A urllib provider's cost comes from the body's own JSON: a finite non-negative number, or
    no cost at all. (Perplexity's record keeps the SDK's reading, model_dump, as the record
    format says: its model coerces a total_cost of true to 1.0 before anything reads it.)"""
    case = {**PLAYED, "contains": ["ok"]} if played else SAYS_OK
    answer = usage_of(provider, calling(provider, None, "ok"), value)
    replies = [calling(provider, "lookup_order", "") if provider != "anthropic" else
               usage_of(provider, calling(provider, "lookup_order", ""), 1), answer]
    args, out = argv(provider, server, tmp_path, case)
    server.reply = answers([Reply(body=reply) for reply in replies[not played:]])
    code = run_main([*args, *["--price", "m=1000000/1000000"] * (provider == "anthropic")])
    (row,) = read_record(out)["runs"]
    first = {"openai": decimal.Decimal("0.001"), "perplexity": decimal.Decimal("0.001"),
             "anthropic": decimal.Decimal(2)}[provider] if played else 0
    want = _amount(provider, value)
    assert code == 0 and row["error"] is None
    assert (decimal.Decimal(row["cost_usd"]) if row["cost_usd"] is not None else None) == (
        None if want is None else want + first)
    assert row["response"] == stored(provider, answer)  # as the server sent it


# ====================================================================== a body that is no object

@FUZZ
@given(provider=st.sampled_from(["openai", "anthropic"]), played=st.booleans(),
       body=st.one_of(st.binary(max_size=40), st.sampled_from(
           [b"<html>502 Bad Gateway</html>", b"[1, 2]", b"null", b'"ok"', b"\xff\xfe{", b"{"])))
def test_a_body_that_is_no_json_object_is_quoted_in_the_rows_error(server, tmp_path, provider,
                                                                   played, body):
    """Such a body left only its size in the row ("the body is not JSON (28 bytes)", and
    through the SDK "Expecting value: ...", "the endpoint returned list"): now the row's error
    quotes its start, masked, control characters escaped: the only evidence the row can keep."""
    try:
        readable = isinstance(json.loads(body), dict)
    except ValueError:
        readable = False
    if readable:
        return
    replies = [calling(provider, "lookup_order"), Reply(raw=body)] if played else [Reply(raw=body)]
    code, row = run(server, tmp_path, provider, PLAYED if played else FORBID, replies)
    said = regression.endpoint_text(body.decode("utf-8", "replace"))
    assert (code, row["error"], row["error_status"]) == (2, "ResponseError", 200)
    assert row["error_message"].startswith("the body is not ")
    assert row["error_message"].endswith(f"({len(body)} bytes)" + f": {said}" * bool(said))


@pytest.mark.parametrize("provider", ["openai"])
def test_a_quoted_body_never_shows_the_key_it_echoes(server, tmp_path, monkeypatch, provider):
    key = PPLX["PERPLEXITY_API_KEY"]
    monkeypatch.setenv("MY_KEY", key)
    server.reply = answers([Reply(raw=f"<html>bad key {key}</html>".encode())])
    args, out = argv(provider, server, tmp_path, FORBID)
    flags = ["--api-key-env", "MY_KEY"] if provider == "openai" else []
    assert run_main([*args, *flags]) == 2
    (row,) = read_record(out)["runs"]
    assert row["error_message"].endswith("bytes): <html>bad key [REDACTED:secret]</html>")
    assert key not in out.read_text(encoding="utf-8")


# ====================================================================== through the real CLI

def _round(body):
    """Which round a request asks for: the assistant turns its conversation holds, plus one."""
    said = body.get("messages") or body.get("input")
    return sum(1 for item in said if isinstance(item, dict) and item.get("role") == "assistant") \
        if isinstance(said, list) else 0


SAYS_OK = {"input": "say ok", "contains": ["ok"]}
PINS = [  # (provider, case, replies, the row's line says); exit 2 but where it says PASS
    ("openai", FORBID, [NO_ANSWER["openai"]], "ERROR ResponseError 200: the response has no "
     "choices[0].message"),
    ("openai", FORBID, [_put(calling("openai"), NAME_AT["openai"], DELETED)],
     "ERROR ResponseError: tool call 1 of the response names no tool, so no check can tell "
     "which tool it called"),
    ("openai", PLAYED, [calling("openai", "lookup_order"),
                        _put(calling("openai"), ("choices", 0, "message", "tool_calls"), None)],
     'ERROR ResponseError 200: finish_reason "tool_calls", but the message holds no tool call'),
    ("perplexity", FORBID, [_put(calling("perplexity"), ("output", 0), "refund_order")],
     "ERROR ResponseError: an output item of the response is not an object"),
    ("anthropic", FORBID, [Reply(raw=b"<html>502 Bad Gateway</html>")],
     "ERROR ResponseError 200: the body is not JSON (28 bytes): <html>502 Bad Gateway</html>"),
]


def test_each_hostile_body_through_the_real_cli_pins_its_exit_code_and_line(tmp_path):
    """Each class above, once through the real CLI: exit 2, the row's line says why, the body is
    the row's evidence, stderr says only where the run stopped (a cost of true: no cost, exit 0)."""
    def reply(request):
        body = request.json or {}
        replies = PINS[int(body.get("model", "m0")[1:])][2]
        said = replies[min(_round(body), len(replies) - 1)]
        return said if isinstance(said, Reply) else Reply(body=said)

    runs, outs = [], []
    with fakes.FakeServer(reply) as server:
        for number, (provider, case, replies, line) in enumerate(PINS):
            args, out = argv(provider, server, tmp_path, case)
            args[args.index("m")] = f"m{number}"
            runs.append((args, tmp_path))
            outs.append(out)
        env = cli_env(**PPLX, PERPLEXITY_BASE_URL=server.url)
        results = fakes.cli_table(runs, env)
    for (provider, case, replies, line), out, (code, stdout, stderr) in zip(PINS, outs, results):
        passed = line.startswith("PASS")
        assert (code, stderr.count("\n")) == ((0, 0) if passed else (2, 1)), stdout + stderr
        assert line in stdout and (passed or stderr.startswith("stopped early: execution")), stdout
        (row,) = read_record(out)["runs"]
        last = replies[-1]
        assert row["response"] == (None if isinstance(last, Reply) else stored(provider, last))
