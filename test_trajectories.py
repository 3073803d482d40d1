"""Offline tests of played tools (issue 15): scripted tool results, the multi-round loop on
both live providers, the trajectory checks, and multi-round rows in the record, replay,
resume, compare and reports.

Every endpoint is fakes.FakeServer on 127.0.0.1: the openai provider goes through urllib,
the perplexity provider through the real perplexityai SDK. The scripted models of fakes.py
read the conversation they are sent and refuse malformed ones, as real servers do.
"""

import contextlib
import decimal
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import compare_runs
import fakes
import regression
from testkit import ROOT, SCRUBBED_PREFIXES, clean_env, cli_env, read_record, run_main, write_suite  # noqa: F401
# `python -W error regression.py`, forked from a zygote: no test here is about imports or start-up
from testkit import run_forked as run_cli
from fakes import FakeServer, Reply

EXAMPLE = ROOT / "suites" / "agent-trajectories.json"
PROVIDERS = ["openai", "perplexity"]


def example():
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


def rows_by_key(record):
    return {regression.row_key(row): row for row in record["runs"]}


@contextlib.contextmanager
def live(kind, reply, timeout=10):
    """A live provider of `kind` talking to a loopback fake: urllib for openai, the real SDK for perplexity."""
    with FakeServer(reply) as server:
        if kind == "openai":
            yield regression.OpenAIProvider(server.url + "/v1", timeout=timeout), server
            return
        import perplexity
        client = perplexity.Perplexity(api_key="pplx-test", base_url=server.url, max_retries=0, timeout=timeout)
        try:
            yield regression.PerplexityProvider(client, regression.deadline_seconds(timeout)), server
        finally:
            client.close()


def scripted(kind, policies, cost=0.0001):
    return (fakes.scripted_chat if kind == "openai" else fakes.scripted_agent)(policies, cost)


def case_of(suite, case_id):
    return next(case for case in suite["cases"] if case["id"] == case_id)


def sent_bodies(server):
    return [request.json for request in server.requests]


# ====================================================================== 1. the loop on the wire

def test_openai_loop_sends_assistant_tool_calls_with_empty_content_then_tool_messages():
    suite = regression.load_suite(str(EXAMPLE))
    with live("openai", fakes.refund_agent()) as (provider, server):
        case = case_of(suite, "refund-shipped-order")
        row = regression.run_row(provider, suite, case, "refund-correct", 0)
    assert row["error"] is None, row.get("error_message")
    assert row["passed"] is True and row["answer_text"] == "Refund issued for ord_1001."
    bodies = sent_bodies(server)
    assert len(bodies) == 3 == len(row["rounds"])
    first, second, third = (body["messages"] for body in bodies)
    assert [m["role"] for m in first] == ["system", "user"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assistant, tool = second[2], second[3]
    assert assistant["content"] == ""  # never null: llama-cpp-python answers 500 to null
    assert assistant["tool_calls"] == [{"id": "call_1", "type": "function", "function": {
        "name": "lookup_order", "arguments": json.dumps({"order_id": "ord_1001"})}}]
    assert tool == {"role": "tool", "tool_call_id": "call_1",
                    "content": json.dumps({"order_id": "ord_1001", "status": "shipped", "total": "49.90"})}
    assert third[5]["tool_call_id"] == third[4]["tool_calls"][0]["id"] == "call_2"
    assert all(body["tools"] and body["model"] == "refund-correct" for body in bodies)
    # the record keeps every raw response in order, with what was sent back
    assert [turn["response"] for turn in row["rounds"]][-1] == row["response"]
    assert row["rounds"][0]["tool_results"] == [{"call_id": "call_1", "name": "lookup_order",
                                                 "arguments": json.dumps({"order_id": "ord_1001"}),
                                                 "result": {"order_id": "ord_1001", "status": "shipped",
                                                            "total": "49.90"}}]
    assert "tool_results" not in row["rounds"][-1]  # the final answer: nothing sent back


def test_fake_chat_server_refuses_null_assistant_content_like_llama_cpp():
    """The fake has teeth: a loop that sent content null would get HTTP 500 back."""
    body = {"model": "refund-correct", "messages": [
        {"role": "user", "content": "Refund ord_1001"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"}]}
    with FakeServer(fakes.refund_agent()) as server:
        request = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request, timeout=10)
        raised.value.close()
    assert raised.value.code == 500


def test_perplexity_loop_answers_function_calls_with_function_call_output_items_through_the_sdk():
    suite = regression.load_suite(str(EXAMPLE))
    with live("perplexity", fakes.refund_agent()) as (provider, server):
        case = case_of(suite, "refund-shipped-order")
        row = regression.run_row(provider, suite, case, "refund-correct", 0)
    assert row["error"] is None, row.get("error_message")
    assert row["passed"] is True
    assert [request.path for request in server.requests] == ["/v1/responses"] * 3
    bodies = sent_bodies(server)
    assert bodies[0]["input"] == "Please refund order ord_1001, it arrived broken."
    second = bodies[1]["input"]
    assert second[0] == {"type": "message", "role": "user", "content": bodies[0]["input"]}
    assert second[1] == {"type": "function_call", "call_id": "call_1", "name": "lookup_order",
                         "arguments": json.dumps({"order_id": "ord_1001"})}
    assert second[2]["type"] == "function_call_output" and second[2]["call_id"] == "call_1"
    assert json.loads(second[2]["output"]) == {"order_id": "ord_1001", "status": "shipped", "total": "49.90"}
    assert [item["type"] for item in bodies[2]["input"]] == [
        "message", "function_call", "function_call_output", "function_call", "function_call_output"]
    # the whole conversation is resent: no server-side state, and a replay rebuilds the same request
    assert all("previous_response_id" not in body for body in bodies)
    assert all(body["instructions"] == suite["instructions"] and body["tools"] for body in bodies)
    assert row["cost_usd"] == "0.0003"  # three turns at 0.0001 each
    assert len(row["rounds"]) == 3 and row["response"] == row["rounds"][-1]["response"]


def test_agent_api_input_keeps_a_thought_signature_and_the_models_own_text():
    rounds = [{"response": {"output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c9", "name": "lookup_order", "arguments": "{}",
         "thought_signature": "c2ln"}]},
        "tool_results": [{"call_id": "c9", "name": "lookup_order", "arguments": "{}", "result": "plain text"}]}]
    items = regression.PerplexityProvider.conversation({"input": [{"role": "user", "content": "hi"}]}, rounds)
    assert items == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c9", "name": "lookup_order", "arguments": "{}",
         "thought_signature": "c2ln"},
        {"type": "function_call_output", "call_id": "c9", "name": "lookup_order", "output": "plain text"}]


def play_one_lookup(answer):
    """One played case (a scripted lookup_order) on the openai provider against `answer`: (row, server)."""
    suite = regression.validate_suite({**example(), "cases": [
        {"id": "c", "input": "ord_1", "tool_results": {"lookup_order": {"status": "shipped"}}}]})
    with live("openai", fakes.chat(answer)) as (provider, server):
        return regression.run_row(provider, suite, suite["cases"][0], "m", 0), server


def test_a_call_without_an_id_gets_one_that_its_tool_message_answers():
    def answer(body):
        if not any(message["role"] == "tool" for message in body["messages"]):
            reply = fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_1"})])
            del reply["choices"][0]["message"]["tool_calls"][0]["id"]
            return reply
        return fakes.chat_response("done")

    row, server = play_one_lookup(answer)
    assert row["error"] is None and row["passed"] is True
    second = server.requests[1].json["messages"]
    assert second[2]["tool_calls"][0]["id"] == second[3]["tool_call_id"] == "call_1_1"


def test_each_call_keeps_its_own_server_id_whatever_shape_the_calls_came_in():
    """The nth id belongs to the nth call: double-encoded tool_calls must not shift a server's
    ids onto the wrong calls (an unreadable entry makes the row an execution error:
    test_fuzz_responses.py)."""
    def answer(body):
        if not any(message["role"] == "tool" for message in body["messages"]):
            reply = fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_1"}),
                                                        ("lookup_order", {"order_id": "ord_2"})])
            message = reply["choices"][0]["message"]
            message["tool_calls"][0]["id"], message["tool_calls"][1]["id"] = "srv_a", "srv_b"
            message["tool_calls"] = json.dumps(message["tool_calls"])
            return reply
        return fakes.chat_response("done")

    row, server = play_one_lookup(answer)
    assert row["error"] is None, row.get("error_message")
    sent = row["rounds"][0]["tool_results"]
    assert [(entry["call_id"], entry["arguments"]) for entry in sent] == [
        ("srv_a", json.dumps({"order_id": "ord_1"})), ("srv_b", json.dumps({"order_id": "ord_2"}))]
    second = server.requests[1].json["messages"]
    assert [call["id"] for call in second[2]["tool_calls"]] == [message["tool_call_id"] for message in second[3:]]


# ====================================================================== 2. agents, both providers

EXPECTED = {  # (model, case) -> reasons, over the example suite
    ("refund-correct", "refund-shipped-order"): [],
    ("refund-correct", "refund-unshipped-order"): [],
    ("refund-correct", "refund-without-order-id"): [],
    ("refund-skips-lookup", "refund-shipped-order"): ["wrong_tool_order"],
    ("refund-skips-lookup", "refund-unshipped-order"): ["forbidden_tool_called", "wrong_tool_args", "unbacked_claim"],
    ("refund-skips-lookup", "refund-without-order-id"): [
        "too_many_tool_rounds", "forbidden_tool_called", "invented_field", "clarification_missing", "unbacked_claim"],
    ("refund-claims", "refund-shipped-order"): ["wrong_tool_args", "wrong_tool_order", "unbacked_claim"],
    ("refund-claims", "refund-unshipped-order"): ["missing_required_text", "wrong_tool_args", "unbacked_claim"],
    ("refund-claims", "refund-without-order-id"): ["clarification_missing", "unbacked_claim"],
    ("refund-loops", "refund-shipped-order"): [
        "missing_required_text", "too_many_tool_rounds", "no_final_answer", "wrong_tool_args", "wrong_tool_order"],
    ("refund-loops", "refund-unshipped-order"): ["missing_required_text", "too_many_tool_rounds", "no_final_answer"],
    ("refund-loops", "refund-without-order-id"): [
        "too_many_tool_rounds", "invented_field", "clarification_missing", "no_final_answer"],
    ("refund-wrong-id", "refund-shipped-order"): ["missing_required_text", "wrong_tool_args", "wrong_tool_order"],
    ("refund-wrong-id", "refund-unshipped-order"): ["missing_required_text", "wrong_tool_args"],
    ("refund-wrong-id", "refund-without-order-id"): ["too_many_tool_rounds", "invented_field"],
    ("refund-silent", "refund-shipped-order"): ["missing_required_text", "wrong_tool_args", "wrong_tool_order"],
    ("refund-silent", "refund-unshipped-order"): ["missing_required_text"],
    ("refund-silent", "refund-without-order-id"): ["clarification_missing"],
}


@pytest.mark.parametrize("model", sorted(fakes.REFUND_AGENTS))
@pytest.mark.parametrize("kind", PROVIDERS)
def test_scripted_agents_fail_exactly_their_checks_on_both_providers(kind, model):
    suite = regression.load_suite(str(EXAMPLE))
    with live(kind, fakes.refund_agent()) as (provider, server):
        rows = {case["id"]: regression.run_row(provider, suite, case, model, 0)
                for case in suite["cases"]}
    for case_id, row in rows.items():
        assert row["error"] is None, (case_id, row.get("error_message"))
        assert sorted(row["reasons"]) == sorted(EXPECTED[(model, case_id)]), case_id
        assert row["passed"] is (not EXPECTED[(model, case_id)])
        assert len(row["rounds"]) <= suite["max_rounds"]
        details = row["details"]
        assert details["rounds"] == len(row["rounds"])
        assert [call["round"] for call in details["tool_calls"]] == sorted(call["round"] for call in details["tool_calls"])
    assert server.count == sum(len(row["rounds"]) for row in rows.values())


def test_a_looping_agent_is_stopped_at_the_round_limit_with_no_final_answer():
    suite = regression.load_suite(str(EXAMPLE))
    with live("openai", fakes.refund_agent()) as (provider, server):
        case = case_of(suite, "refund-unshipped-order")
        row = regression.run_row(provider, suite, case, "refund-loops", 0)
    assert server.count == suite["max_rounds"] == 4
    assert "no_final_answer" in row["reasons"] and row["error"] is None
    calls = row["details"]["tool_calls"]
    assert [call["round"] for call in calls] == [1, 2, 3, 4]
    assert all("result" in call for call in calls[:3]) and "result" not in calls[3]  # the last was never answered
    assert row["details"]["tool_rounds"] == 4


# ====================================================================== 3. scripted results

SCRIPT = {"tool_results": {
    "lookup_order": [{"when": {"order_id": "ord_1"}, "result": {"status": "shipped"}},
                     {"when": {"order_id": "ord_1", "verbose": True}, "result": "never reached"},
                     {"when": {"order_id": "ord_2"}, "result": {"status": "processing"}},
                     {"result": {"error": "order not found"}}],
    "refund_order": [{"when": {"order_id": "ord_1", "amount": 10}, "result": {"refunded": 10}}],
    "static": [[1, 2]], "null_result": None, "list_result": [{"result": [1, 2]}]}}


@pytest.mark.parametrize("name, arguments, expected", [
    ("lookup_order", {"order_id": "ord_1"}, ({"status": "shipped"}, True)),
    ("lookup_order", json.dumps({"order_id": "ord_1", "verbose": True}), ({"status": "shipped"}, True)),
    ("lookup_order", '{"order_id": "ord_2"}', ({"status": "processing"}, True)),
    ("lookup_order", {"order_id": "ord_3"}, ({"error": "order not found"}, True)),
    ("lookup_order", "not json", ({"error": "order not found"}, True)),
    ("refund_order", {"order_id": "ord_1", "amount": 10}, ({"refunded": 10}, True)),
    ("refund_order", {"order_id": "ord_1", "amount": 10.5}, ({"error": "no scripted result for refund_order"}, False)),
    ("refund_order", {"order_id": "ord_1", "amount": "10"}, ({"error": "no scripted result for refund_order"}, False)),
    ("refund_order", {"order_id": "ord_1"}, ({"error": "no scripted result for refund_order"}, False)),
    ("cancel_order", {"order_id": "ord_1"}, ({"error": "no scripted result for cancel_order"}, False)),
    ("null_result", {}, (None, True)),
    ("list_result", {}, ([1, 2], True)),
], ids=lambda value: str(value)[:30])
def test_scripted_result_first_matching_entry_wins(name, arguments, expected):
    assert regression.scripted_result(SCRIPT, name, arguments) == expected


small = st.one_of(st.integers(-2, 2), st.booleans(), st.sampled_from(["a", "b"]), st.none())
keys = st.sampled_from(["x", "y", "z"])


@settings(max_examples=80, deadline=None)
@given(arguments=st.dictionaries(keys, small), entries=st.lists(
    st.tuples(st.one_of(st.none(), st.dictionaries(keys, small, max_size=2)), st.integers()), max_size=5))
def test_scripted_result_matches_a_reference_over_generated_scripts(arguments, entries):
    script = [({"when": when} if when is not None else {}) | {"result": result} for when, result in entries]
    expected = next(((result, True) for when, result in entries
                     if all(key in arguments and type(arguments[key]) is type(value) and arguments[key] == value
                            for key, value in (when or {}).items())),
                    ({"error": "no scripted result for t"}, False))
    assert regression.scripted_result({"tool_results": {"t": script}}, "t", json.dumps(arguments)) == expected


def test_an_unscripted_call_is_answered_with_an_error_and_marked_in_the_trace():
    suite = regression.validate_suite({**example(), "cases": [
        {"id": "c", "input": "Refund ord_1001", "tool_results": {"lookup_order": {"status": "shipped"}},
         "claims": {"refund issued": "refund_order"}}]})
    with live("openai", fakes.refund_agent()) as (provider, server):
        row = regression.run_row(provider, suite, suite["cases"][0], "refund-correct", 0)
    refund = row["details"]["tool_calls"][1]
    assert refund["name"] == "refund_order" and refund["unscripted"] is True
    assert refund["result"] == {"error": "no scripted result for refund_order"}
    assert row["rounds"][1]["tool_results"][0]["unscripted"] is True
    sent = server.requests[2].json["messages"][-1]
    assert json.loads(sent["content"]) == {"error": "no scripted result for refund_order"}
    assert row["answer_text"] == "The refund for ord_1001 was refused; a colleague will follow up."
    assert row["passed"] is True  # an honest agent that says the refund failed


# ====================================================================== 4. checks over every round

def calls_trace(names, text="ok", results=None, final=True):
    calls = [{"round": n, "name": name, "arguments": "{}", **({"result": results[n - 1]} if results else {})}
             for n, name in enumerate(names, 1)]
    return regression.Trace(final_text=text, tool_calls=calls, tool_rounds=len(names), search_urls=[],
                            status="completed", cost_usd=None, rounds=len(names) + 1, final=final)


@pytest.mark.parametrize("order, names, fails", [
    ("a,b", ["a", "b"], False),
    ("a,b", ["a", "x", "b"], False),
    ("a,b", ["a", "b", "a"], False),
    ("a,b", ["b", "a", "b"], True),  # the first call of b comes before the first call of a
    ("a,b", ["b", "a"], True),
    ("a,b", ["a"], True),
    ("a,b", [], True),
    ("a,b,c", ["a", "b", "a", "c", "b"], False),
    ("a,b,c", ["a", "c", "b", "c"], True),  # the first c comes before the first b
])
def test_tool_order_table(order, names, fails):
    case = {"behaviors": [f"tool_order:{order}"]}
    trace = calls_trace(names, results=[{"ok": True}] * len(names))  # a call follows only a result
    got = regression.check_tool_order(case, trace, order)
    assert got == (["wrong_tool_order"] if fails else [])


@settings(max_examples=80, deadline=None)
@given(names=st.lists(st.sampled_from("abcd"), max_size=8),
       order=st.lists(st.sampled_from("abcd"), min_size=2, max_size=4, unique=True))
def test_tool_order_matches_a_reference(names, order):
    firsts = [names.index(name) if name in names else None for name in order]
    ok = None not in firsts and firsts == sorted(firsts)
    arg = ",".join(order)
    got = regression.check_tool_order({"behaviors": ["tool_order:" + arg]},
                                      calls_trace(names, results=[{"ok": True}] * len(names)), arg)
    assert got == ([] if ok else ["wrong_tool_order"])


@pytest.mark.parametrize("text, results, fails", [
    ("Refund issued.", [{"refunded": True}], False),
    ("REFUND\n  issued for you", [{"refunded": True}], False),  # whitespace and case folded
    ("Refund issued.", [{"error": "refused"}], True),
    ("Refund issued.", [{"error": None, "refunded": True}], False),
    ("Refund issued.", None, True),  # called, but no result was ever sent back
    ("Your refund was refused.", [{"error": "refused"}], False),  # no claim made
    ("Refund  issued.", [{"refunded": True}], False),
    ("Re\u200bfund issued.", None, True),  # a zero-width space does not hide the claim
    ("\uff32\uff45\uff46\uff55\uff4e\uff44 issued.", [{"error": "refused"}], True),  # fullwidth letters neither
])
def test_claims_table(text, results, fails):
    case = {"claims": {"refund issued": "refund_order"}}
    trace = calls_trace(["refund_order"], text=text, results=results)
    assert regression.check_claims(case, trace) == (["unbacked_claim"] if fails else [])


def test_claim_backed_only_by_an_unscripted_call_is_unbacked():
    trace = calls_trace(["refund_order"], text="Refund issued", results=[{"ok": True}])
    trace.tool_calls[0]["unscripted"] = True
    assert regression.check_claims({"claims": {"refund issued": "refund_order"}}, trace) == ["unbacked_claim"]


@pytest.mark.parametrize("wanted, arguments, fails", [
    ({"order_id": "ord_1"}, {"order_id": "ord_1"}, False),
    ({"order_id": "ord_1"}, {"order_id": "ord_1", "reason": "broken"}, False),
    ({"order_id": "ord_1", "reason": "broken"}, {"order_id": "ord_1"}, True),
    ({"order_id": "ord_1"}, {"order_id": "ord_2"}, True),
    ({"amount": 1}, {"amount": True}, True),
    ({"amount": 1}, {"amount": "1"}, True),
    ({"tags": ["a", "b"]}, {"tags": ["a", "b"]}, False),
    ({"tags": ["a", "b"]}, {"tags": ["b", "a"]}, True),
])
def test_tool_args_table(wanted, arguments, fails):
    trace = calls_trace(["refund_order"])
    trace.tool_calls[0]["arguments"] = json.dumps(arguments)
    assert regression.check_tool_args({"tool_args": {"refund_order": wanted}}, trace) == (
        ["wrong_tool_args"] if fails else [])


def late_canceller(user, history):
    """Looks up an invented order, then cancels it in the second round, then reports."""
    if not history:
        return "call", "lookup_order", {"order_id": ""}
    if len(history) == 1:
        return "call", "refund_order", {"order_id": "ord_404"}
    return "text", "What is your order id?"


@pytest.mark.parametrize("kind", PROVIDERS)
def test_forbid_tool_and_require_clarification_see_every_round(kind):
    suite = regression.validate_suite({**example(), "cases": [
        {"id": "c", "input": "Refund my order.", "tool_results": {"lookup_order": {"status": "shipped"}},
         "behaviors": ["forbid_tool:refund_order", "require_clarification:order_id"]}]})
    with live(kind, scripted(kind, {"late": late_canceller})) as (provider, server):
        row = regression.run_row(provider, suite, suite["cases"][0], "late", 0)
    assert row["error"] is None, row.get("error_message")
    # the refund happened in round 2, the invented id in round 2: both are seen
    assert sorted(row["reasons"]) == ["forbidden_tool_called", "invented_field"]
    assert [(call["round"], call["name"]) for call in row["details"]["tool_calls"]] == [
        (1, "lookup_order"), (2, "refund_order")]


@pytest.mark.parametrize("limit, expected", [(1, ["too_many_tool_rounds"]), (2, [])])
def test_max_tool_rounds_counts_real_rounds(limit, expected):
    suite = regression.validate_suite({**example(), "cases": [
        {"id": "c", "input": "Refund ord_1001.", "tool_results": {"lookup_order": {"status": "shipped"},
                                                                  "refund_order": {"refunded": True}},
         "behaviors": [f"max_tool_rounds:{limit}"]}]})
    with live("openai", fakes.refund_agent()) as (provider, server):
        row = regression.run_row(provider, suite, suite["cases"][0], "refund-correct", 0)
    assert row["details"]["tool_rounds"] == 2 and server.count == 3
    assert row["reasons"] == expected


def test_list_checks_describes_the_trajectory_checks(capsys):
    assert run_main(["--list-checks"]) == 0
    out = capsys.readouterr().out
    for name in ("no_final_answer", "tool_args", "tool_order", "claims"):
        assert re.search(rf"^  {name}\s+\S", out, re.M), name
    assert "tool_order:TOOLS" in out


# ====================================================================== 5. round limits

@pytest.mark.parametrize("suite_limit, case_limit, requests", [
    (None, None, 8), (3, None, 3), (3, 5, 5), (None, 1, 1), (20, None, 20), (2, 20, 20)])
def test_round_limit_is_the_case_the_suite_or_eight(suite_limit, case_limit, requests):
    data = {**example(), "cases": [{"id": "c", "input": "Refund ord_1.",
                                    "tool_results": {"lookup_order": {"status": "processing"}},
                                    **({"max_rounds": case_limit} if case_limit else {})}]}
    data.pop("max_rounds")
    if suite_limit:
        data["max_rounds"] = suite_limit
    suite = regression.validate_suite(data)
    with live("openai", fakes.refund_agent(cost=None)) as (provider, server):
        row = regression.run_row(provider, suite, suite["cases"][0], "refund-loops", 0)
    assert server.count == requests == len(row["rounds"])
    assert row["reasons"] == ["no_final_answer"] and row["error"] is None
    assert row["cost_usd"] is None  # the endpoint reported no cost


def test_a_case_without_tool_results_or_max_rounds_stays_one_request(tmp_path):
    data = {**example(), "cases": [{"id": "c", "input": "Refund ord_1.", "behaviors": ["forbid_tool:refund_order"]}]}
    data.pop("max_rounds")
    suite = regression.validate_suite(data)
    with live("openai", fakes.refund_agent()) as (provider, server):
        row = regression.run_row(provider, suite, suite["cases"][0], "refund-loops", 0)
    assert server.count == 1 and "rounds" not in row and row["passed"] is True
    assert row["details"]["tool_calls"] == [{"name": "lookup_order", "arguments": json.dumps({"order_id": "ord_1"})}]


def test_suite_max_rounds_alone_plays_every_case():
    data = {**example(), "max_rounds": 2, "cases": [{"id": "c", "input": "Refund ord_1."}]}
    suite = regression.validate_suite(data)
    with live("openai", fakes.refund_agent()) as (provider, server):
        row = regression.run_row(provider, suite, suite["cases"][0], "refund-loops", 0)
    assert server.count == 2 and row["reasons"] == ["no_final_answer"]
    assert row["details"]["tool_calls"][0]["result"] == {"error": "no scripted result for lookup_order"}


# ====================================================================== 6. errors mid-loop, cost, retries, deadline

@pytest.mark.parametrize("kind", PROVIDERS)
def test_empty_final_content_with_stop_is_an_answer_judged_by_the_checks(kind):
    suite = regression.load_suite(str(EXAMPLE))
    with live(kind, fakes.refund_agent()) as (provider, server):
        case = case_of(suite, "refund-unshipped-order")
        row = regression.run_row(provider, suite, case, "refund-silent", 0)
    assert row["error"] is None and row["answer_text"] == ""
    assert row["reasons"] == ["missing_required_text"]
    assert row["rounds"][-1]["response"] == row["response"]


def failing_on(number, status, then, headers=None):
    """A reply function that answers `status` to request number `number` only."""
    def reply(request):
        if request.number == number:
            return Reply(status, {"error": {"message": f"fake {status} on request {number}"}}, headers=headers)
        return then(request)
    return reply


@pytest.mark.parametrize("kind", PROVIDERS)
def test_request_format_error_mid_loop_is_an_execution_error_keeping_the_rounds_made(kind):
    suite = regression.load_suite(str(EXAMPLE))
    with live(kind, failing_on(2, 400, fakes.refund_agent())) as (provider, server):
        case = case_of(suite, "refund-shipped-order")
        row = regression.run_row(provider, suite, case, "refund-correct", 0)
    assert row["reasons"] == ["execution_error"] and row["error_status"] == 400
    assert len(row["rounds"]) == 1 and row["rounds"][0]["tool_results"][0]["name"] == "lookup_order"
    assert row["response"] == row["rounds"][0]["response"]
    assert row["passed"] is False


def test_mid_loop_error_through_the_cli_exits_2_and_the_record_keeps_the_rounds(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(failing_on(2, 400, fakes.refund_agent())) as server:
        result = run_cli(["--suite", EXAMPLE, "--provider", "openai", "--base-url", server.url + "/v1",
                          "--models", "refund-correct", "--out", out], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "stopped early: execution error" in result.stderr
    row = read_record(out)["runs"][0]
    assert row["error"] == "HTTPError" and row["error_status"] == 400
    assert len(row["rounds"]) == 1 and row["rounds"][0]["response"]["choices"][0]["message"]["tool_calls"]


def test_transient_error_mid_loop_is_retried_per_request(tmp_path):
    suite = regression.load_suite(str(EXAMPLE))
    reply = failing_on(2, 503, fakes.refund_agent(), headers={"Retry-After": "0"})
    with live("openai", reply) as (provider, server):
        case = case_of(suite, "refund-shipped-order")
        row = regression.run_row(provider, suite, case, "refund-correct", 0, retries=1)
    assert row["error"] is None and row["passed"] is True
    assert server.count == 4 and row["attempts"] == 4  # three turns, one of them tried twice
    assert len(row["rounds"]) == 3


def test_cost_sums_every_round_and_is_unknown_when_one_round_reports_none():
    def costed(n):
        return {"output": [], "usage": {"cost": {"currency": "USD", "total_cost": n}}} if n is not None else {"output": []}
    rounds = [{"response": costed(0.1)}, {"response": costed(0.2)}, {"response": costed(0.0004)}]
    assert regression.rounds_trace(regression.PerplexityProvider.parse, rounds).cost_usd == "0.3004"
    rounds[1]["response"] = costed(None)
    assert regression.rounds_trace(regression.PerplexityProvider.parse, rounds).cost_usd is None


class SlowLoop:
    """A provider stub whose every request takes `step` seconds of a fake clock and calls a tool."""

    name = "stub"
    parse = staticmethod(regression.OpenAIProvider.parse)

    def __init__(self, clock, step, deadline):
        self.clock, self.step, self.deadline, self.sent = clock, step, deadline, 0

    def request(self, model, suite, case, repeat=0, rounds=()):
        self.sent += 1
        self.clock[0] += self.step
        return fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_1"})])


def test_whole_row_deadline_ends_a_slow_loop_keeping_its_rounds():
    suite = regression.validate_suite({**example(), "max_rounds": 5, "cases": [{"id": "c", "input": "x"}]})
    clock = [0.0]
    provider = SlowLoop(clock, step=2.6, deadline=1.0)  # each request alone fits its own 1 s deadline
    row = {}
    with pytest.raises(regression.RowDeadline):
        regression.drive_steps(regression.play_tools_steps(
            provider, suite, suite["cases"][0], "m", 0, 0, row, clock=lambda: clock[0]))
    # the row may take 5 x 1 s; after two 2.6 s turns no third request starts
    assert provider.sent == 2 and len(row["rounds"]) == 2


def test_a_retry_wait_past_the_row_deadline_gives_up_at_once():
    clock, waited = [0.0], []

    class Busy:
        deadline = None

        def request(self, *args):
            error = RuntimeError("busy")
            error.status_code = 503
            raise error

    with pytest.raises(RuntimeError) as raised:
        regression.send_request(Busy(), "m", {}, {"id": "c"}, 0, retries=5, sleep=waited.append,
                                jitter=lambda: 1.0, until=0.5, clock=lambda: clock[0])
    assert waited == [] and raised.value.attempts == 1


# ====================================================================== 7. record: CLI, replay, resume, redaction

def cli_run(server, out, *extra, models=("refund-correct", "refund-skips-lookup"), suite=EXAMPLE):
    return run_main(["--suite", suite, "--provider", "openai", "--base-url", server.url + "/v1",
                     "--models", *models, "--out", out, *extra])


def test_replay_regrades_every_round_without_any_request(tmp_path):
    out, again, changed = tmp_path / "run.json", tmp_path / "again.json", tmp_path / "changed.json"
    with FakeServer(fakes.refund_agent()) as server:
        assert cli_run(server, out) == 1
        sent = server.count
        assert run_main(["--provider", "replay", "--replay", out, "--out", again]) == 1
        stricter = example()
        # a declared argument (a name the schema does not declare is refused before any request)
        stricter["cases"][0]["tool_args"] = {"refund_order": {"order_id": "ord_1002"}}
        suite = write_suite(tmp_path / "stricter.json", stricter)
        assert run_main(["--provider", "replay", "--replay", out, "--suite", suite, "--out", changed]) == 1
        assert server.count == sent  # nothing was sent by either replay
    original, replayed, regraded = (rows_by_key(read_record(p)) for p in (out, again, changed))
    for key, row in original.items():
        assert replayed[key]["reasons"] == row["reasons"]
        assert replayed[key]["rounds"] == row["rounds"] and replayed[key]["details"] == row["details"]
    key = ("refund-correct", "refund-shipped-order", 0)
    assert original[key]["passed"] and regraded[key]["reasons"] == ["wrong_tool_args"]
    assert len(regraded[key]["rounds"]) == 3


def test_replay_asking_for_more_rounds_than_stored_is_refused(tmp_path, capsys):
    """A replay under a longer max_rounds would play past the stored conversation: it is refused
    before any row is made (it used to become an execution_error row in a new record)."""
    out, more = tmp_path / "run.json", tmp_path / "more.json"
    with FakeServer(fakes.refund_agent()) as server:
        assert cli_run(server, out, models=["refund-loops"]) == 1
    longer = example()
    longer["max_rounds"] = 6
    suite = write_suite(tmp_path / "longer.json", longer)
    capsys.readouterr()
    code = run_main(["--provider", "replay", "--replay", out, "--suite", suite, "--out", more])
    assert code == 2 and not more.exists()
    said = capsys.readouterr().err
    assert ("ended after round 4 (at a limit its suite set then: max_rounds, max_calls_per_round, "
            "max_row_bytes), but the suite now plays on") in said


def test_resume_reruns_a_played_row_from_its_first_round(tmp_path):
    out = tmp_path / "run.json"
    broken = {"on": True}

    def reply(request):
        if broken["on"] and request.json["model"] == "refund-skips-lookup" and len(request.json["messages"]) > 2:
            return Reply(400, {"error": {"message": "bad tool message"}})
        return fakes.refund_agent()(request)

    with FakeServer(reply) as server:
        assert cli_run(server, out) == 2
        failed = rows_by_key(read_record(out))[("refund-skips-lookup", "refund-shipped-order", 0)]
        assert failed["error"] and len(failed["rounds"]) == 1
        broken["on"] = False
        before = server.count
        assert run_main(["--resume", out]) == 1
        resumed = [request.json for request in server.requests[before:]]
    # the errored row starts again from round 1 (no tool message in its first request)
    first = [body for body in resumed if body["model"] == "refund-skips-lookup"][0]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    rows = rows_by_key(read_record(out))
    row = rows[("refund-skips-lookup", "refund-shipped-order", 0)]
    assert row["error"] is None and len(row["rounds"]) == 2 and row["reasons"] == ["wrong_tool_order"]
    assert len(rows) == 6


def test_redaction_masks_secrets_in_every_round(tmp_path):
    out = tmp_path / "run.json"

    def leaky(user, history):
        if not history:
            return "call", "lookup_order", {"order_id": "ord_1001", "note": "token=hunter2-secret"}
        return "text", "Refund issued for ord_1001."

    with FakeServer(fakes.scripted_chat({"leaky": leaky})) as server:
        code = cli_run(server, out, "--redact", "hunter2-secret", models=["leaky"])
    assert code == 1
    assert b"hunter2-secret" not in out.read_bytes()
    row = read_record(out)["runs"][0]
    assert "[REDACTED]" in json.dumps(row["rounds"][0])


def test_record_row_of_a_played_case_keeps_rounds_and_the_last_response(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(fakes.refund_agent()) as server:
        assert cli_run(server, out, models=["refund-correct"]) == 0
    record = read_record(out)
    assert record["config"]["max_rounds"] == 4
    for row in record["runs"]:
        assert row["response"] == row["rounds"][-1]["response"]
        assert all("tool_results" in turn for turn in row["rounds"][:-1])
        assert row["cost_usd"] == f"{len(row['rounds']) / 10000:.4f}"
    assert record["summary"]["models"]["refund-correct"]["reported_cost_usd"] == "0.0006"


# ====================================================================== 8. compare and reports

def test_compare_shows_the_tool_sequence_before_and_after(tmp_path, capsys):
    behaviour = {"policy": fakes.refund_correct}
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    with FakeServer(fakes.scripted_chat({"agent": lambda u, h: behaviour["policy"](u, h)})) as server:
        assert cli_run(server, before, models=["agent"]) == 0
        behaviour["policy"] = fakes.refund_skips_lookup
        assert cli_run(server, after, models=["agent"]) == 1
    capsys.readouterr()
    assert compare_runs.main([str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert ("TOOLS          agent  refund-shipped-order     repeat 0  "
            "lookup_order -> refund_order  vs  refund_order") in out  # columns aligned
    assert ("TOOLS          agent  refund-without-order-id  repeat 0  "
            "(no tool call)                vs  refund_order") in out
    assert "REGRESS        agent  refund-shipped-order     +wrong_tool_order" in out
    result = compare_runs.compare_records(read_record(before), read_record(after))[1]
    markdown = compare_runs.markdown_comparison(result, "t")
    assert "Tool sequences of changed rows" in markdown and "lookup_order -&gt; refund_order" in markdown
    assert "lookup_order -&gt; refund_order" in compare_runs.html_comparison(result, "t")


HOSTILE = "<script>alert(1)</script>|`x`" + "y" * 500


def hostile_record():
    calls = [{"round": 1, "name": "lookup_order", "arguments": json.dumps({"order_id": HOSTILE}),
              "result": {"note": HOSTILE}},
             {"round": 2, "name": "refund_order", "arguments": "{}"}]
    row = {"case_id": "c", "model": "m", "repeat": 0, "error": None, "error_status": None, "cost_usd": None,
           "response": {}, "answer_text": "done", "reasons": ["wrong_tool_order"], "passed": False,
           "details": {"tool_calls": calls, "tool_rounds": 2, "rounds": 2}, "seconds": 0.1}
    passing = {**row, "case_id": "d", "reasons": [], "passed": True}
    config = {"models": ["m"], "cases": [{"id": "c", "input": "x"}, {"id": "d", "input": "y"}], "repeats": 1}
    return {"config": config, "suite": {"name": "s"}, "runs": [row, passing],
            "summary": regression.summary([row, passing], ["m"], 1, config["cases"])}


def test_reports_show_the_trajectory_of_each_failing_row_shortened_and_escaped():
    record = hostile_record()
    markdown = regression.markdown_run(record)
    html = regression.html_run(record)
    junit = regression.junit_run(record)
    section = markdown.split("### Trajectories of failing rows")[1]
    assert "round 1: lookup_order" in section and "round 2: refund_order({}) -&gt; (no result sent)" in section
    assert "<script>" not in markdown and "<script>" not in html and "<script>" not in junit
    assert "&lt;script&gt;" in html and "&lt;script&gt;" in junit
    assert "y" * (regression.TRAJECTORY_TEXT_LIMIT + 5) not in markdown + html + junit  # shortened
    assert '<ol class="trajectory">' in html and html.count("<li>") >= 2
    assert "trajectory:" in junit
    assert "| d |" not in section  # passing rows are not listed


def test_a_looping_rows_trajectory_is_capped_with_a_count():
    calls = [{"round": n, "name": "lookup_order", "arguments": "{}", "result": {}} for n in range(1, 31)]
    lines = regression.trajectory_lines({"details": {"tool_calls": calls}})
    assert len(lines) == regression.TRAJECTORY_CALLS_SHOWN + 1
    assert lines[-1] == f"... {30 - regression.TRAJECTORY_CALLS_SHOWN} more call(s)"


# ====================================================================== 9. validation

BAD_KEYS = [
    ({"tool_results": []}, "tool_results must be a non-empty object"),
    ({"tool_results": {}}, "tool_results must be a non-empty object"),
    ({"tool_results": {"cancel_order": {}}}, "tool_results names 'cancel_order', which is not a function tool"),
    ({"tool_results": {"lookup_order": []}}, "tool_results.lookup_order is an empty list of entries"),
    ({"tool_results": {"lookup_order": [1, 2]}}, "tool_results.lookup_order entry 1 must be"),
    ({"tool_results": {"lookup_order": [{"when": {}}]}}, "tool_results.lookup_order entry 1 must be"),
    ({"tool_results": {"lookup_order": [{"result": 1, "extra": 2}]}}, "entry 1 must be"),
    ({"tool_results": {"lookup_order": [{"result": 1}, {"when": [1], "result": 2}]}},
     "entry 2: when must be an object"),
    ({"max_rounds": 0}, "max_rounds must be a whole number from 1 to 20 (got 0)"),
    ({"max_rounds": 21}, "max_rounds must be a whole number from 1 to 20 (got 21)"),
    ({"max_rounds": 2.0}, "max_rounds must be a whole number from 1 to 20"),
    ({"max_rounds": True}, "max_rounds must be a whole number from 1 to 20"),
    ({"max_rounds": "3"}, "max_rounds must be a whole number from 1 to 20"),
    ({"tool_args": {"lookup_order": {}}}, "tool_args.lookup_order must be a non-empty object"),
    ({"tool_args": {"lookup_order": "ord_1"}}, "tool_args.lookup_order must be a non-empty object"),
    ({"tool_args": {"web_search": {"q": 1}}}, "tool_args names 'web_search', which is not a function tool"),
    ({"tool_args": []}, "tool_args must be a non-empty object"),
    ({"claims": {"refund issued": "cancel_order"}}, "names 'cancel_order', which is not a function tool"),
    ({"claims": {"refund issued": 3}}, "must be a tool name string"),
    ({"claims": {"  ": "refund_order"}}, "claims has a phrase with no visible text"),
    ({"claims": ["refund issued"]}, "claims must be a non-empty object"),
    ({"behaviors": ["tool_order:lookup_order"]}, "needs two or more tool names"),
    ({"behaviors": ["tool_order:lookup_order,lookup_order"]}, "names a tool twice"),
    ({"behaviors": ["tool_order:lookup_order,cancel_order"]}, "names no function tool of this suite"),
    ({"behaviors": ["tool_order:lookup_order, refund_order"]}, "needs tool names, as in 'tool_order:A,B'"),
    ({"max_round": 3}, "unknown key 'max_round' (did you mean 'max_rounds'?)"),
]


def bad_suite(mutation):
    data = example()
    data["cases"] = [{"id": "c", "input": "x", **mutation}]
    return data


@pytest.mark.parametrize("mutation, message", BAD_KEYS, ids=[str(m)[:40] for m, _ in BAD_KEYS])
def test_invalid_trajectory_keys_are_one_line_suite_errors(mutation, message):
    with pytest.raises(regression.SuiteError) as raised:
        regression.validate_suite(bad_suite(mutation))
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert str(raised.value).startswith("case 'c': ")


@pytest.mark.parametrize("value", [0, 21, "8", None, 1.5])
def test_invalid_suite_max_rounds_is_a_suite_error(value):
    with pytest.raises(regression.SuiteError, match=r"^suite: max_rounds must be a whole number from 1 to 20"):
        regression.validate_suite({**example(), "max_rounds": value})


LOOP_OVER_SUITES = """
import contextlib, io, json, sys
import regression
results = []
for suite, out in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = regression.main(["--suite", suite, "--provider", "echo", "--out", out])
        except SystemExit as exc:
            code = exc.code
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_invalid_trajectory_keys_exit_2_with_one_line_through_the_cli(tmp_path):
    """Every bad key above exits 2 with one line on stderr and no record: two through the real
    CLI, all of them through main() in one subprocess (one interpreter start for the table)."""
    jobs = []
    for n, (mutation, message) in enumerate(BAD_KEYS):
        jobs.append([str(write_suite(tmp_path / f"bad{n}.json", bad_suite(mutation))), str(tmp_path / f"out{n}.json")])
    for suite, out in jobs[:1] + jobs[-1:]:
        result = run_cli(["--suite", suite, "--provider", "echo", "--out", out], tmp_path)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    looped = subprocess.run([sys.executable, "-W", "error", "-c", LOOP_OVER_SUITES, json.dumps(jobs)], cwd=ROOT,
                            env=cli_env(), capture_output=True, text=True, timeout=60)
    assert looped.returncode == 0, looped.stderr
    for (mutation, message), (code, stderr), (_, out) in zip(BAD_KEYS, json.loads(looped.stdout), jobs):
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], (mutation, stderr)
        assert "Traceback" not in stderr and not os.path.exists(out)


def test_example_suite_is_valid_and_dry_runs(tmp_path):
    result = run_cli(["--suite", EXAMPLE, "--dry-run"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "3 cases" in result.stdout and "lookup_order, refund_order" in result.stdout
    assert "played tools: 3 case(s) answer function calls with scripted results, up to 4 requests per row" \
        in result.stdout
    assert result.stdout.count("[up to 4 rounds]") == 3 and "tool_args, claims" in result.stdout


# ====================================================================== 10. the docs' agent example

def readme_agent_block():
    page = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    section = page.split("## Try it offline: six scripted agents")[1].split("\n## ")[0]
    commands = [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)[:2]]
    expected = re.findall(r"```text\n(.*?)```", section, re.S)[0]
    return commands, expected


def row_line(line):
    """A console row line with its reasons sorted (the order of checks is not the point here)."""
    return re.sub(r"FAIL (\S+)", lambda m: "FAIL " + ",".join(sorted(m.group(1).split(","))), line)


def test_readme_agent_example_runs_offline_as_written(tmp_path):
    commands, expected = readme_agent_block()
    serve, run = commands
    assert serve == "python fakes.py --scenario refund-agent &"  # a free port, never a fixed one
    assert run.startswith("python regression.py ") and '--base-url "$FAKE_URL/v1"' in run
    # the same fake, on the free port it printed, in a copy of the project
    shutil.copy(ROOT / "regression.py", tmp_path / "regression.py")
    shutil.copytree(ROOT / "suites", tmp_path / "suites")
    with FakeServer(fakes.refund_agent()) as server:
        argv = [arg.replace("$FAKE_URL", server.url) for arg in shlex.split(run)[2:]]
        # the copied regression.py, forked from the zygote: this checks its output, not its start
        result = fakes.run_script(argv, tmp_path, cli_env(), script=str(tmp_path / "regression.py"))
    assert result.returncode == 1, result.stderr
    got = [row_line(re.sub(r"\s+\S+s  \(\+\S+s save\)$", "", line))
           for line in result.stdout.splitlines() if "  r0  " in line]
    want = [row_line(re.sub(r"\s+\S+s$", "", line)) for line in expected.strip().splitlines() if "  r0  " in line]
    assert got == want and len(want) == 18
    assert "exit 1" in expected


def test_fakes_serves_the_refund_agent_scenario_and_prints_its_url(tmp_path):
    process = subprocess.Popen([sys.executable, str(ROOT / "fakes.py"), "--scenario", "refund-agent"],
                               stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        url = process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        body = json.dumps({"model": "refund-correct", "messages": [{"role": "user", "content": "refund"}]}).encode()
        request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        assert "order id" in answer["choices"][0]["message"]["content"]
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


# ====================================================================== 11. run control with played rows

def test_spending_cap_applies_between_the_rounds_of_a_played_row(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(fakes.refund_agent()) as server:
        code = cli_run(server, out, "--max-cost-usd", "0.00025", models=["refund-loops"])
        sent = server.count
    record = read_record(out)
    row = record["runs"][0]
    assert code == 2 and sent == 3  # rounds at 0.0001 each: the third reaches the cap, no fourth is sent
    assert row["error"] == "BudgetReached" and "--max-cost-usd reached" in row["error_message"]
    assert "sending to" not in row["error_message"]  # the endpoint was reached; the cap stopped the row
    assert len(row["rounds"]) == 3 and row["cost_usd"] == "0.0003"
    assert record["summary"]["models"]["refund-loops"]["reported_cost_usd"] == "0.0003"
    assert len(record["runs"]) == 1 and record["summary"]["stopped"].startswith("execution error")


def test_played_rows_under_concurrency_equal_a_sequential_run(tmp_path):
    models = sorted(fakes.REFUND_AGENTS)
    one, many = tmp_path / "one.json", tmp_path / "many.json"
    with FakeServer(fakes.refund_agent()) as server:
        assert cli_run(server, one, models=models) == 1
        assert cli_run(server, many, "--concurrency", "6", models=models) == 1
    first, second = read_record(one)["runs"], read_record(many)["runs"]
    assert [regression.row_key(row) for row in first] == [regression.row_key(row) for row in second]
    for a, b in zip(first, second):
        assert (a["reasons"], a["rounds"], a["details"], a["cost_usd"]) == \
            (b["reasons"], b["rounds"], b["details"], b["cost_usd"])


def test_a_legacy_function_call_is_answered_by_a_function_message():
    rounds = [{"response": fakes.chat_response(""), "tool_results": [
        {"call_id": "call_1_1", "name": "lookup_order", "arguments": '{"order_id": "ord_1"}', "result": {"ok": 1}}]}]
    rounds[0]["response"]["choices"][0]["message"]["function_call"] = {"name": "lookup_order",
                                                                       "arguments": '{"order_id": "ord_1"}'}
    assert regression.OpenAIProvider.conversation({"input": []}, rounds) == [
        {"role": "assistant", "content": "", "function_call": {"name": "lookup_order",
                                                               "arguments": '{"order_id": "ord_1"}'}},
        {"role": "function", "name": "lookup_order", "content": '{"ok": 1}'}]


def test_perplexity_cli_run_plays_tools_through_the_sdk_and_replays_offline(tmp_path, monkeypatch):
    out, again = tmp_path / "run.json", tmp_path / "again.json"
    with FakeServer(fakes.refund_agent()) as server:
        monkeypatch.setenv("PERPLEXITY_BASE_URL", server.url)
        monkeypatch.setenv("PERPLEXITY_API_KEY", "pplx-test-key-123456")
        code = run_main(["--suite", EXAMPLE, "--models", "refund-correct", "refund-loops", "--out", out])
        sent = server.count
        assert run_main(["--provider", "replay", "--replay", out, "--out", again]) == 1
        assert server.count == sent
    assert code == 1
    record = read_record(out)
    assert record["provider"]["name"] == "perplexity"
    rows = rows_by_key(record)
    assert sent == sum(len(row["rounds"]) for row in rows.values()) == 3 + 2 + 1 + 4 * 3
    correct = rows[("refund-correct", "refund-shipped-order", 0)]
    assert correct["passed"] and correct["rounds"][0]["response"]["output"][0]["type"] == "function_call"
    assert [request.json["input"][-1]["type"] for request in server.requests[1:3]] == ["function_call_output"] * 2
    assert b"pplx-test-key-123456" not in out.read_bytes()
    replayed = rows_by_key(read_record(again))
    assert all(replayed[key]["reasons"] == row["reasons"] for key, row in rows.items())


def test_spending_cap_between_rounds_counts_estimated_cost_with_price(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(fakes.scripted_chat({"loops": fakes.refund_loops}, cost=None)) as server:
        # 10 input tokens per turn at 10,000 USD per million: 0.1 per round, estimated
        code = cli_run(server, out, "--price", "loops=10000/0", "--max-cost-usd", "0.25", models=["loops"])
        sent = server.count
    row = read_record(out)["runs"][0]
    assert code == 2 and sent == 3 and len(row["rounds"]) == 3
    assert row["error"] == "BudgetReached" and "spend $0.3" in row["error_message"]


class ScriptedStub:
    """An in-process provider playing a fixed script of turns in the `kind` API's wire form; it
    checks every continuation it is sent as the loopback fakes do (ids answered, content not null)."""

    name = "stub"
    deadline = None

    def __init__(self, kind, turns):
        self.kind, self.turns, self.sent = kind, turns, []
        self.wire = regression.OpenAIProvider("http://127.0.0.1:1/v1") if kind == "openai" else \
            regression.PerplexityProvider()
        self.parse, self.call_ids = self.wire.parse, self.wire.call_ids

    def request(self, model, suite, case, repeat=0, rounds=()):
        if self.kind == "openai":
            _, history = fakes.chat_conversation(self.wire.body(model, suite, case, rounds))
        else:
            _, history = fakes.agent_conversation(self.wire.body(model, suite, case, rounds))
        self.sent.append(history)
        calls = self.turns[len(rounds)] if len(rounds) < len(self.turns) else []
        calls = [(name, {"order_id": f"ord_{len(rounds)}_{n}"}) for n, name in enumerate(calls)]
        if self.kind == "openai":
            return fakes.chat_response("" if calls else "done", tool_calls=calls, cost=0.5)
        response = fakes.agent_response(None if calls else "done", function_calls=calls, cost=0.5,
                                        status="requires_action" if calls else "completed")
        for n, item in enumerate(item for item in response["output"] if item["type"] == "function_call"):
            item["call_id"] = f"c{len(rounds)}_{n}"
        return response


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(PROVIDERS), limit=st.integers(1, 6),
       turns=st.lists(st.lists(st.sampled_from(["lookup_order", "refund_order", "cancel_order"]), max_size=3),
                      max_size=8))
def test_the_loop_over_generated_agents(kind, limit, turns):
    """Any agent: the loop sends back exactly the calls made so far, stops at the first turn
    without a call or at max_rounds, and the trace lists every call in order with its round."""
    suite = regression.validate_suite({**example(), "max_rounds": limit, "cases": [
        {"id": "c", "input": "Refund ord_1.", "tool_results": {"lookup_order": {"status": "shipped"}}}]})
    stub = ScriptedStub(kind, turns)
    row = regression.run_row(stub, suite, suite["cases"][0], "m", 0)
    assert row["error"] is None, row.get("error_message")
    played = turns + [[]]
    stop = next(n for n, calls in enumerate(played) if not calls) + 1  # the first turn without a call
    rounds = min(stop, limit)
    assert len(row["rounds"]) == len(stub.sent) == rounds
    expected = [(n, name) for n, calls in enumerate(played[:rounds], 1) for name in calls]
    assert [(call["round"], call["name"]) for call in row["details"]["tool_calls"]] == expected
    for n, history in enumerate(stub.sent):  # each request carried every call answered before it
        assert [name for name, _, _ in history] == [name for calls in played[:n] for name in calls]
    for call in row["details"]["tool_calls"]:  # only the last turn's calls (at the limit) got no result
        assert ("result" in call) == (call["round"] < rounds)
        assert "result" not in call or bool(call.get("unscripted")) == (call["name"] != "lookup_order")
    assert ("no_final_answer" in row["reasons"]) == (stop > limit)
    assert row["cost_usd"] == format(decimal.Decimal("0.5") * rounds, "f")


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                                     st.text(max_size=300)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=3), max_leaves=12)


@settings(max_examples=80, deadline=None)
@given(details=st.one_of(json_values, st.fixed_dictionaries({"tool_calls": st.lists(st.one_of(
    json_values, st.fixed_dictionaries({"round": json_values | st.integers(), "name": json_values,
                                        "arguments": json_values},
                                       optional={"result": json_values, "unscripted": json_values})), max_size=30)})))
def test_trajectory_of_any_stored_details_never_raises_and_stays_short(details):
    row = {"details": details}
    lines = regression.trajectory_lines(row)
    sequence = regression.tool_sequence(row)
    assert len(lines) <= regression.TRAJECTORY_CALLS_SHOWN + 1 and all(isinstance(name, str) for name in sequence)
    assert all(len(line) <= 2 * regression.TRAJECTORY_TEXT_LIMIT + 60 for line in lines)


@pytest.mark.parametrize("ids, expected", [
    (["a", "b"], ["a", "b"]),
    (["a", "a"], ["a", "call_3_2"]),  # a repeated id would make the tool messages ambiguous
    ([None, ""], ["call_3_1", "call_3_2"]),
    ([], ["call_3_1", "call_3_2"]),
    ([7, "b"], ["call_3_1", "b"]),
])
def test_each_call_of_a_round_is_answered_under_its_own_id(ids, expected):
    calls = [{"name": "lookup_order", "arguments": "{}"}, {"name": "lookup_order", "arguments": "{}"}]
    trace = regression.Trace("", calls, 1, [], "completed", None)
    assert [sent["call_id"] for sent in regression.tool_results({}, trace, ids, 3)] == expected


def test_a_played_row_that_fails_mid_loop_keeps_the_cost_of_its_rounds(tmp_path):
    out = tmp_path / "run.json"

    def reply(request):
        if request.number <= 2:  # two paid tool rounds, then the endpoint fails
            body = fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_1001"})], cost=0.5)
            body["choices"][0]["message"]["tool_calls"][0]["id"] = f"call_{request.number}"
            return Reply(body=body)
        return Reply(500, {"error": {"message": "upstream broke"}})

    with FakeServer(reply) as server:
        assert cli_run(server, out, models=["m"]) == 2
    row = read_record(out)["runs"][0]
    assert row["error"] is not None and len(row["rounds"]) == 2
    assert row["cost_usd"] == "1.0"  # spent for real, so --max-cost-usd and the summary count it
