"""Offline tests of regression.py against SPEC Part A (A2-A8) and the crash-safe record.

No key and no network beyond 127.0.0.1: the real perplexityai SDK talks to
httpx.MockTransport in-process, and to fakes.FakeServer (loopback) end to end.
"""

import datetime
import decimal
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace
from unittest import mock

import httpx
import pytest

import fakes
import regression

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "regression.py"
CASE = {case["id"]: case for case in regression.CASES}
DEFAULT_MODELS = ["openai/gpt-5.6-sol", "anthropic/claude-sonnet-4-6"]
CASE_IDS = ["rate-limit", "temporary-overload", "failed-precondition", "ambiguous-payment"]


def rfc_url(doc, suffix=".html", host="www.rfc-editor.org"):
    return f"https://{host}/rfc/{doc}{suffix}"


# ====================================================================== A2 constants

QUESTIONS = {
    "rate-limit": (
        "Checkout log: GET /v1/payments/pay_8f3 (read-only status poll)\n"
        'Response: 429; Retry-After: 30; body: {"error":"rate_limited"}'
    ),
    "temporary-overload": (
        "Checkout log: GET /v1/payments/pay_8f3 (read-only status poll)\n"
        'Response: 503; no Retry-After; body: "Service temporarily unavailable"'
    ),
    "failed-precondition": (
        'Checkout log: PUT /v1/orders/ord_21; If-Match: "v7"\n'
        'Response: 412; body: {"error":"precondition_failed"}\n'
        "Order service audit: stored version is v8; requested update not applied."
    ),
    "ambiguous-payment": (
        "Checkout log: POST /v1/payments; order_id=ord_21\n"
        "Idempotency-Key: absent; provider offers no idempotency guarantee.\n"
        "Request body sent; httpx.ReadTimeout after 30s; no response received.\n"
        "Payment outcome not yet reconciled."
    ),
}


def test_cases_are_the_contract_in_order():
    assert [
        (case["id"], case["expected"], case["action"], case["rfc"]) for case in regression.CASES
    ] == [
        ("rate-limit", "429", "wait_then_retry", "rfc6585"),
        ("temporary-overload", "503", "wait_then_retry", "rfc9110"),
        ("failed-precondition", "412", "refresh_precondition", "rfc9110"),
        ("ambiguous-payment", "unknown", "verify_outcome", "rfc9110"),
    ]
    for case in regression.CASES:
        assert set(case) == {"id", "expected", "rfc", "action", "question"}


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_question_strings_are_exact(case_id):
    assert CASE[case_id]["question"] == QUESTIONS[case_id]


def test_models_default():
    assert regression.MODELS == DEFAULT_MODELS


def test_tool_is_exact():
    assert regression.TOOL == {
        "type": "web_search",
        "search_context_size": "medium",
        "max_results": 5,
        "filters": {"search_domain_filter": ["rfc-editor.org"]},
    }


def test_format_is_the_status_answer_schema():
    fmt = regression.FORMAT
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "StatusAnswer"
    schema = fmt["json_schema"]["schema"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"code", "next_action", "source_urls"}
    assert len(schema["required"]) == 3
    props = schema["properties"]
    assert set(props) == {"code", "next_action", "source_urls"}
    assert props["code"] == {"type": "string"}
    assert props["next_action"]["type"] == "string"
    assert sorted(props["next_action"]["enum"]) == sorted(
        ["wait_then_retry", "refresh_precondition", "verify_outcome"])
    assert props["source_urls"] == {"type": "array", "items": {"type": "string"}}


@pytest.mark.parametrize("needle", [
    "6585", "9110", "rfc-editor.org", "www.rfc-editor.org", "/rfc/", ".html", ".txt",
    "https", "pdf", "/info/", "query", "source_urls", "code", "next_action", "unknown",
    "wait_then_retry", "refresh_precondition", "verify_outcome", "json", "search",
    "evidence", "execute", "advise", "retry",
])
def test_instructions_mention_required_points(needle):
    assert needle in regression.INSTRUCTIONS.lower()


# ====================================================================== A3 URL rules

ACCEPTED = [
    ("https://www.rfc-editor.org/rfc/rfc9110", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110.html", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110.txt", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110/", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110.html/", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110.html#section-15.6.4", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110#", "rfc9110"),
    ("https://www.rfc-editor.org/rfc/rfc9110#a?b", "rfc9110"),
    ("https://WWW.RFC-EDITOR.ORG/rfc/rfc9110", "rfc9110"),
    ("https://Rfc-Editor.Org/rfc/rfc6585.txt", "rfc6585"),
    ("https://www.rfc-editor.org:443/rfc/rfc9110.html", "rfc9110"),
    ("https://rfc-editor.org:443/rfc/rfc6585", "rfc6585"),
    ("https://rfc-editor.org/rfc/rfc6585", "rfc6585"),
    ("https://rfc-editor.org/rfc/rfc6585.html", "rfc6585"),
    ("https://www.rfc-editor.org/rfc/rfc7231.html", "rfc7231"),
]

REJECTED = [
    "http://www.rfc-editor.org/rfc/rfc9110.html",
    "ftp://www.rfc-editor.org/rfc/rfc9110.html",
    "//www.rfc-editor.org/rfc/rfc9110.html",
    "www.rfc-editor.org/rfc/rfc9110.html",
    "https://www.rfc-editor.org/info/rfc9110",
    "https://www.rfc-editor.org/rfc/rfc9110.html?x=1",
    "https://www.rfc-editor.org/rfc/rfc9110?",
    "https://www.rfc-editor.org/rfc/rfc9110.html?#frag",
    "https://www.rfc-editor.org:8443/rfc/rfc9110.html",
    "https://www.rfc-editor.org:80/rfc/rfc9110.html",
    "https://www.rfc-editor.org:444/rfc/rfc9110.html",
    "https://user@www.rfc-editor.org/rfc/rfc9110.html",
    "https://user:pass@www.rfc-editor.org/rfc/rfc9110.html",
    "https://:pass@rfc-editor.org/rfc/rfc9110.html",
    "https://www.rfc-editor.org@evil.com/rfc/rfc9110.html",
    "https://rfc-editor.org.evil.com/rfc/rfc9110.html",
    "https://evil-rfc-editor.org/rfc/rfc9110.html",
    "https://evilrfc-editor.org/rfc/rfc9110.html",
    "https://evil.rfc-editor.org/rfc/rfc9110.html",
    "https://rfc-editor.org./rfc/rfc9110.html",
    "https://datatracker.ietf.org/doc/html/rfc9110",
    " https://www.rfc-editor.org/rfc/rfc9110.html",
    "https://www.rfc-editor.org/rfc/rfc9110.html ",
    "https://www.rfc-editor.org/rfc/rfc 9110.html",
    "https://www.rfc-editor.org/rfc/rfc9110.html\n",
    "https://www.rfc-editor.org/rfc/\nrfc9110.html",
    "https://www.rfc-editor.org/rfc/rfc9110\t.html",
    "https://www.rfc-editor.org/rfc/rfc9110.html#a b",
    "https://www.rfc-editor.org/rfc/rfc9110.html\u00a0",
    "https://www.rfc-editor.org/rfc/rfc9110.pdf",
    "https://www.rfc-editor.org/rfc/pdfrfc/rfc9110.txt.pdf",
    "https://www.rfc-editor.org/rfc/rfc9110.htm",
    "https://www.rfc-editor.org/rfc/rfc9110.json",
    "https://www.rfc-editor.org/rfc/rfc9110.html.txt",
    "https://www.rfc-editor.org/rfc/rfc9110//",
    "https://www.rfc-editor.org/rfc/rfc",
    "https://www.rfc-editor.org/rfc/9110",
    "https://www.rfc-editor.org/rfc/rfc9110x",
    "https://www.rfc-editor.org/rfc/rfc9110;x",
    "https://www.rfc-editor.org/rfc/rfc9110%2ehtml",
    "https://www.rfc-editor.org/rfc//rfc9110",
    "https://www.rfc-editor.org/RFC/rfc9110",
    "https://www.rfc-editor.org//rfc/rfc9110",
    "https://www.rfc-editor.org/x/rfc/rfc9110",
    "https://www.rfc-editor.org/rfc/rfc9110/extra",
    "https://www.rfc-editor.org/rfc/inline-errata/rfc9110.html",
    "https://www.rfc-editor.org",
    "https://www.rfc-editor.org/",
    "https://www.rfc-editor.org/rfc/rfc\u0669\u0661\u0661\u0660",
    "https://[::1",
    "https://[::1]/rfc/rfc9110",
    "https://www.rfc-editor.org:notaport/rfc/rfc9110",
    "https:///rfc/rfc9110",
    "",
    "rfc9110",
]


@pytest.mark.parametrize("url, doc", ACCEPTED)
def test_rfc_document_accepts(url, doc):
    assert regression.rfc_document(url) == doc


@pytest.mark.parametrize("url", REJECTED)
def test_rfc_document_rejects(url):
    assert regression.rfc_document(url) is None


@pytest.mark.parametrize("value", [
    None, 9110, 9110.0, True, b"https://www.rfc-editor.org/rfc/rfc9110.html",
    ["https://www.rfc-editor.org/rfc/rfc9110.html"], {"url": "x"}, object(),
])
def test_rfc_document_non_string_is_none(value):
    assert regression.rfc_document(value) is None


@pytest.mark.parametrize("url, rfc, expected", [
    ("https://www.rfc-editor.org/rfc/rfc9110.html", "rfc9110", True),
    ("https://rfc-editor.org/rfc/rfc6585.txt", "rfc6585", True),
    ("https://www.rfc-editor.org/rfc/rfc9110.html", "rfc6585", False),
    ("https://www.rfc-editor.org/rfc/rfc6585", "rfc9110", False),
    ("http://www.rfc-editor.org/rfc/rfc9110.html", "rfc9110", False),
    ("https://www.rfc-editor.org/rfc/rfc9110.pdf", "rfc9110", False),
    ("https://rfc-editor.org.evil.com/rfc/rfc9110", "rfc9110", False),
    ("not a url", "rfc9110", False),
    (None, "rfc9110", False),
])
def test_approved_source(url, rfc, expected):
    assert regression.approved_source(url, rfc) is expected


def _mutants(count=3000, seed=20240101):
    """Deterministic fuzz: valid URLs with random characters inserted, deleted or replaced."""
    import random
    rng = random.Random(seed)
    alphabet = list("/:.@?#%&=+-_ \t\n\r\x00\u00a0\u200b\u0130\uff0e[]\\abcdefhilmoprstwx0123456789ABC")
    seeds = [url for url, _ in ACCEPTED]
    for _ in range(count):
        chars = list(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(chars) + 1)
            action = rng.random()
            if action < 0.4:
                chars.insert(pos, rng.choice(alphabet))
            elif action < 0.7 and pos < len(chars):
                del chars[pos]
            elif pos < len(chars):
                chars[pos] = rng.choice(alphabet)
        yield "".join(chars)


def test_rfc_document_fuzz_accepts_only_a3_shapes():
    import re
    import urllib.parse
    accepted = 0
    for text in _mutants():
        doc = regression.rfc_document(text)
        if doc is None:
            continue
        accepted += 1
        assert re.fullmatch(r"rfc[0-9]+", doc), text
        assert text.isascii() and not any(ch.isspace() or ord(ch) < 32 for ch in text), text
        parts = urllib.parse.urlsplit(text)
        assert parts.scheme == "https", text
        assert parts.hostname in ("rfc-editor.org", "www.rfc-editor.org"), text
        assert parts.username is None and parts.password is None, text
        assert parts.port in (None, 443), text
        assert "?" not in text.split("#", 1)[0], text
        assert re.fullmatch(r"/rfc/rfc[0-9]+(\.html|\.txt)?/?", parts.path), text
        assert doc == re.search(r"rfc[0-9]+", parts.path).group(0), text
    assert accepted > 50  # the fuzz also exercises the accepting side


# ====================================================================== A4 checker

def answer(code, action, urls):
    return json.dumps({"code": code, "next_action": action, "source_urls": list(urls)})


def good(case_id, **overrides):
    """A correct response and answer text for a case, with overrides for the table."""
    case = CASE[case_id]
    url = rfc_url(case["rfc"])
    spec = {"status": "completed", "search": [url],
            "text": answer(case["expected"], case["action"], [url])}
    spec.update(overrides)
    raw = fakes.agent_response(spec["text"] if isinstance(spec["text"], str) else "x",
                               urls=spec["search"], status=spec["status"])
    return case, raw, spec["text"]


R9110, R6585, R7231 = rfc_url("rfc9110"), rfc_url("rfc6585"), rfc_url("rfc7231")

CHECK_TABLE = [
    # (name, case_id, overrides, expected reasons)
    ("all-correct-rate-limit", "rate-limit", {}, []),
    ("all-correct-overload", "temporary-overload", {}, []),
    ("all-correct-precondition", "failed-precondition", {}, []),
    ("all-correct-payment", "ambiguous-payment", {}, []),
    ("429-may-also-cite-9110", "rate-limit",
     {"search": [R6585, R9110], "text": answer("429", "wait_then_retry", [R6585, R9110])}, []),
    ("bare-and-txt-urls", "temporary-overload",
     {"search": [rfc_url("rfc9110", "")], "text": answer("503", "wait_then_retry", [rfc_url("rfc9110", ".txt")])},
     []),
    ("status-failed", "rate-limit", {"status": "failed"}, ["response_not_completed"]),
    ("status-in-progress", "rate-limit", {"status": "in_progress"}, ["response_not_completed"]),
    ("status-incomplete", "ambiguous-payment", {"status": "incomplete"}, ["response_not_completed"]),
    ("no-search", "ambiguous-payment", {"search": []},
     ["search_not_observed", "citation_not_in_search_results"]),
    ("not-json", "rate-limit", {"text": "429, wait then retry"}, ["invalid_json"]),
    ("empty-text", "rate-limit", {"text": ""}, ["invalid_json"]),
    ("fenced-json", "rate-limit", {"text": "```json\n" + answer("429", "wait_then_retry", [R6585]) + "\n```"},
     ["invalid_json"]),
    ("extra-key", "rate-limit",
     {"text": json.dumps({"code": "429", "next_action": "wait_then_retry", "source_urls": [R6585], "why": "x"})},
     ["invalid_answer_shape"]),
    ("missing-key", "rate-limit", {"text": json.dumps({"code": "429", "next_action": "wait_then_retry"})},
     ["invalid_answer_shape"]),
    ("code-int", "rate-limit",
     {"text": json.dumps({"code": 429, "next_action": "wait_then_retry", "source_urls": [R6585]})},
     ["invalid_answer_shape"]),
    ("action-null", "rate-limit",
     {"text": json.dumps({"code": "429", "next_action": None, "source_urls": [R6585]})},
     ["invalid_answer_shape"]),
    ("urls-string", "rate-limit",
     {"text": json.dumps({"code": "429", "next_action": "wait_then_retry", "source_urls": R6585})},
     ["invalid_answer_shape"]),
    ("urls-with-non-str", "rate-limit",
     {"text": json.dumps({"code": "429", "next_action": "wait_then_retry", "source_urls": [R6585, 1]})},
     ["invalid_answer_shape"]),
    ("urls-with-null", "rate-limit",
     {"text": json.dumps({"code": "429", "next_action": "wait_then_retry", "source_urls": [None]})},
     ["invalid_answer_shape"]),
    ("top-level-list", "rate-limit", {"text": json.dumps(["429", "wait_then_retry", [R6585]])},
     ["invalid_answer_shape"]),
    ("top-level-string", "rate-limit", {"text": json.dumps("429")}, ["invalid_answer_shape"]),
    ("top-level-null", "rate-limit", {"text": "null"}, ["invalid_answer_shape"]),
    ("wrong-code", "temporary-overload", {"text": answer("500", "wait_then_retry", [R9110])}, ["wrong_code"]),
    ("wrong-action", "failed-precondition", {"text": answer("412", "wait_then_retry", [R9110])},
     ["wrong_next_action"]),
    ("unknown-action-value", "failed-precondition", {"text": answer("412", "retry_now", [R9110])},
     ["wrong_next_action"]),
    ("payment-retried", "ambiguous-payment", {"text": answer("503", "wait_then_retry", [R9110])},
     ["wrong_code", "wrong_next_action"]),
    ("no-sources", "ambiguous-payment", {"text": answer("unknown", "verify_outcome", [])},
     ["missing_or_duplicate_sources", "primary_reference_missing"]),
    ("same-doc-html-and-txt", "ambiguous-payment",
     {"text": answer("unknown", "verify_outcome", [R9110, rfc_url("rfc9110", ".txt")])},
     ["missing_or_duplicate_sources"]),
    ("same-url-twice", "temporary-overload", {"text": answer("503", "wait_then_retry", [R9110, R9110])},
     ["missing_or_duplicate_sources"]),
    ("cited-doc-not-searched", "rate-limit",
     {"search": [R6585], "text": answer("429", "wait_then_retry", [R6585, R9110])},
     ["citation_not_in_search_results"]),
    ("searched-other-spelling-is-same-doc", "rate-limit",
     {"search": [rfc_url("rfc6585", ".txt", "rfc-editor.org")], "text": answer("429", "wait_then_retry", [R6585])},
     []),
    ("unrecognised-url-even-if-searched", "rate-limit",
     {"search": [R6585, rfc_url("rfc6585", ".pdf")],
      "text": answer("429", "wait_then_retry", [rfc_url("rfc6585", ".pdf")])},
     ["citation_not_in_search_results", "citation_not_approved", "primary_reference_missing"]),
    ("search-results-unrecognised-only", "rate-limit",
     {"search": ["https://evil.example/rfc/rfc6585.html"]},
     ["citation_not_in_search_results"]),
    ("payment-cites-6585", "ambiguous-payment",
     {"search": [R9110, R6585], "text": answer("unknown", "verify_outcome", [R9110, R6585])},
     ["citation_not_approved"]),
    ("older-rfc-cited", "temporary-overload",
     {"search": [R9110, R7231], "text": answer("503", "wait_then_retry", [R9110, R7231])},
     ["citation_not_approved"]),
    ("429-without-6585", "rate-limit", {"search": [R9110], "text": answer("429", "wait_then_retry", [R9110])},
     ["primary_reference_missing"]),
    ("overload-cites-only-6585", "temporary-overload",
     {"search": [R6585], "text": answer("503", "wait_then_retry", [R6585])},
     ["citation_not_approved", "primary_reference_missing"]),
    # early returns keep the reasons found before them
    ("not-json-after-two", "rate-limit", {"status": "failed", "search": [], "text": "{"},
     ["response_not_completed", "search_not_observed", "invalid_json"]),
    ("bad-shape-after-two", "ambiguous-payment",
     {"status": "failed", "search": [], "text": json.dumps({"code": "unknown"})},
     ["response_not_completed", "search_not_observed", "invalid_answer_shape"]),
    # every non-early reason at once, in the A4 order
    ("all-in-order", "rate-limit",
     {"status": "incomplete", "search": [],
      "text": answer("503", "verify_outcome", [R7231, rfc_url("rfc7231", ".txt")])},
     ["response_not_completed", "search_not_observed", "wrong_code", "wrong_next_action",
      "missing_or_duplicate_sources", "citation_not_in_search_results", "citation_not_approved",
      "primary_reference_missing"]),
]


@pytest.mark.parametrize("case_id, overrides, expected",
                         [row[1:] for row in CHECK_TABLE], ids=[row[0] for row in CHECK_TABLE])
def test_check_reasons(case_id, overrides, expected):
    case, raw, text = good(case_id, **overrides)
    assert regression.check(case, raw, text) == expected


def test_check_requires_action_is_not_completed():
    """A4.1: anything but status "completed" is response_not_completed, even a turn that ended in tool calls."""
    case, raw, text = good("rate-limit", status="requires_action")
    raw["output"].insert(1, {"type": "function_call", "id": "fc1", "call_id": "c1", "name": "retry",
                             "arguments": "{}", "status": "completed"})
    assert regression.check(case, raw, text) == ["response_not_completed"]


def test_check_missing_status_is_not_completed():
    case, raw, text = good("rate-limit")
    del raw["status"]
    assert regression.check(case, raw, text) == ["response_not_completed"]


def test_check_grades_the_given_text_not_the_message():
    case, raw, _ = good("ambiguous-payment", text=answer("503", "wait_then_retry", [R9110]))
    assert regression.check(case, raw, answer("unknown", "verify_outcome", [R9110])) == []


@pytest.mark.parametrize("results, observed", [
    ([{"url": 5}, {"url": None}, {"title": "no url"}, {"url": ["x"]}, {"url": {"u": R6585}}], False),
    ([{"url": 5}, {"url": R6585}], True),
    ([], False),
])
def test_non_string_search_urls_are_ignored(results, observed):
    case = CASE["rate-limit"]
    text = answer("429", "wait_then_retry", [R6585])
    raw = fakes.agent_response(text)
    raw["output"].insert(0, {"type": "search_results", "results": results})
    reasons = regression.check(case, raw, text)
    assert ("search_not_observed" in reasons) is (not observed)
    assert reasons == ([] if observed else ["search_not_observed", "citation_not_in_search_results"])


def test_search_urls_only_from_search_results_items():
    case = CASE["rate-limit"]
    text = answer("429", "wait_then_retry", [R6585])
    raw = fakes.agent_response(text)
    raw["output"].insert(0, {"type": "fetch_url_results", "results": [{"url": R6585}]})
    raw["output"].insert(0, {"type": "message", "results": [{"url": R6585}], "content": []})
    assert regression.check(case, raw, text) == ["search_not_observed", "citation_not_in_search_results"]


@pytest.mark.parametrize("raw", [
    None, [], "completed", 42, {}, {"status": "completed"},
    {"status": "completed", "output": "search_results"},
    {"status": "completed", "output": None},
    {"status": "completed", "output": {"type": "search_results"}},
    {"status": "completed", "output": [1, None, "x", []]},
    {"status": "completed", "output": [{"type": "search_results", "results": "x"}]},
    {"status": "completed", "output": [{"type": "search_results", "results": [1, None, "u", {"url": 3}]}]},
    {"status": "completed", "output": [{"type": "search_results"}]},
    {"status": ["completed"], "output": []},
], ids=repr)
@pytest.mark.parametrize("text", [answer("429", "wait_then_retry", [R6585]), "not json", None])
def test_malformed_raw_never_raises(raw, text):
    reasons = regression.check(CASE["rate-limit"], raw, text)
    assert isinstance(reasons, list) and reasons
    assert all(isinstance(reason, str) for reason in reasons)
    assert "search_not_observed" in reasons
    completed = isinstance(raw, dict) and raw.get("status") == "completed"
    assert ("response_not_completed" in reasons) is (not completed)


# ====================================================================== A5 cost

def usage(amount, currency="USD"):
    return {"usage": {"cost": {"currency": currency, "total_cost": amount}}}


@pytest.mark.parametrize("raw, expected", [
    (usage(0.0012), "0.0012"),
    (usage(1e-05), "0.00001"),
    (usage(0.1), "0.1"),
    (usage(0.30000000000000004), "0.30000000000000004"),
    (usage(2), "2"),
    (usage(0), "0"),
    (usage(0.0), "0"),
    (usage(1e20), "100000000000000000000"),
    (usage(10**30), "1000000000000000000000000000000"),
    (usage(-0.0001), None),
    (usage(-1), None),
    (usage(float("nan")), None),
    (usage(float("inf")), None),
    (usage(float("-inf")), None),
    (usage(True), None),
    (usage(False), None),
    (usage("0.0012"), None),
    (usage(None), None),
    (usage([0.1]), None),
    (usage(0.0012, "EUR"), None),
    (usage(0.0012, "usd"), None),
    (usage(0.0012, None), None),
    ({"usage": {"cost": {"total_cost": 0.0012}}}, None),
    ({"usage": {"cost": {"currency": "USD"}}}, None),
    ({"usage": {"cost": 0.0012}}, None),
    ({"usage": {"input_tokens": 1}}, None),
    ({"usage": None}, None),
    ({"usage": "0.0012"}, None),
    ({}, None),
    (None, None),
    ([], None),
], ids=repr)
def test_reported_cost(raw, expected):
    cost = regression.reported_cost(raw)
    assert not isinstance(cost, float)
    if expected is None:
        assert cost is None
    else:
        assert isinstance(cost, str)
        assert "e" not in cost.lower()
        assert decimal.Decimal(cost) == decimal.Decimal(expected)
        if expected not in ("0",):
            assert cost == expected


# ====================================================================== A6 run_one (real SDK, MockTransport)

def sdk_client(handler):
    import perplexity
    return perplexity.Perplexity(api_key="k", base_url="http://127.0.0.1:9",
                                 http_client=httpx.Client(transport=httpx.MockTransport(handler)),
                                 max_retries=0)


def correct_reply(request):
    body = json.loads(request.content)
    return httpx.Response(200, json=fakes.advisor_answer(fakes.CASES_BY_QUESTION[body["input"]]))


REQUEST_KEYS = {"model", "instructions", "input", "tools", "response_format", "max_steps", "max_output_tokens"}
ROW_KEYS = {"case_id", "model", "error", "error_status", "cost_usd", "response", "answer_text",
            "reasons", "seconds", "passed"}


@pytest.mark.parametrize("case_id", CASE_IDS)
@pytest.mark.parametrize("model", DEFAULT_MODELS)
def test_run_one_sends_exactly_the_request(case_id, model):
    sent = []

    def handler(request):
        sent.append((request.method, request.url.path, json.loads(request.content)))
        return correct_reply(request)

    case = CASE[case_id]
    with sdk_client(handler) as client:
        row = regression.run_one(client, case, model)
    assert len(sent) == 1
    method, path, body = sent[0]
    assert method == "POST" and path.endswith("/responses")
    assert set(body) == REQUEST_KEYS
    assert body["model"] == model
    assert body["instructions"] == regression.INSTRUCTIONS
    assert body["input"] == case["question"] == QUESTIONS[case_id]
    assert body["tools"] == [regression.TOOL]
    assert body["response_format"] == regression.FORMAT
    assert body["max_steps"] == 5
    assert body["max_output_tokens"] == 4096
    for hidden in ("expected", "rfc", "action", "id", "question", case["expected"], case["rfc"],
                   case["action"], case["id"]):
        assert hidden not in body
    assert row["passed"] is True and row["reasons"] == []


def test_run_one_row_keys_and_values():
    case = CASE["ambiguous-payment"]
    reply = fakes.advisor_answer(case)
    with sdk_client(lambda request: httpx.Response(200, json=reply)) as client:
        row = regression.run_one(client, case, "m/x")
    assert ROW_KEYS <= set(row)
    assert row["case_id"] == "ambiguous-payment" and row["model"] == "m/x"
    assert row["error"] is None and row["error_status"] is None
    assert row["cost_usd"] == "0.0012"
    assert row["answer_text"] == reply["output"][-1]["content"][0]["text"]
    assert row["response"]["status"] == "completed"
    assert row["response"]["output"][0]["results"][0]["url"] == rfc_url("rfc9110")
    assert row["response"]["usage"]["cost"]["currency"] == "USD"
    assert json.loads(json.dumps(row)) == row  # JSON-able
    assert isinstance(row["seconds"], float) and row["seconds"] >= 0
    assert round(row["seconds"], 3) == row["seconds"]
    assert row["reasons"] == [] and row["passed"] is True


def test_run_one_response_excludes_none():
    case = CASE["rate-limit"]
    reply = fakes.advisor_answer(case)
    reply["error"] = None
    reply["output"][0]["results"][0]["date"] = None
    with sdk_client(lambda request: httpx.Response(200, json=reply)) as client:
        row = regression.run_one(client, case, "m")
    assert "error" not in row["response"]
    assert "date" not in row["response"]["output"][0]["results"][0]


def test_run_one_failed_answer_and_missing_cost():
    case = CASE["ambiguous-payment"]
    reply = fakes.advisor_answer(case, "503", "wait_then_retry", cost=None)
    with sdk_client(lambda request: httpx.Response(200, json=reply)) as client:
        row = regression.run_one(client, case, "m")
    assert row["error"] is None
    assert row["reasons"] == ["wrong_code", "wrong_next_action"]
    assert row["passed"] is False
    assert row["cost_usd"] is None


class CheckerCrash(Exception):
    pass


def test_run_one_keeps_evidence_when_checker_crashes():
    case = CASE["temporary-overload"]
    reply = fakes.advisor_answer(case)
    with sdk_client(lambda request: httpx.Response(200, json=reply)) as client, \
            mock.patch("regression.check", side_effect=CheckerCrash("boom")) as crashed:
        row = regression.run_one(client, case, "m")
    assert crashed.call_count == 1
    assert row["error"] == "CheckerCrash"
    assert row["error_status"] is None
    assert row["reasons"] == ["execution_error"]
    assert row["passed"] is False
    assert row["response"]["id"] == "resp_fake"
    assert row["response"]["output"][-1]["content"][0]["text"] == reply["output"][-1]["content"][0]["text"]
    assert row["answer_text"] == reply["output"][-1]["content"][0]["text"]
    assert row["cost_usd"] == "0.0012"
    assert ROW_KEYS <= set(row)


def test_run_one_grades_through_module_level_check():
    case = CASE["rate-limit"]
    with sdk_client(correct_reply) as client, \
            mock.patch("regression.check", return_value=["patched_reason"]) as patched:
        row = regression.run_one(client, case, "m")
    assert row["reasons"] == ["patched_reason"] and row["passed"] is False
    args = patched.call_args.args
    assert args[0] == case
    assert isinstance(args[1], dict) and args[1]["status"] == "completed"
    assert args[2] == row["answer_text"]


@pytest.mark.parametrize("status, error", [
    (400, "BadRequestError"),
    (401, "AuthenticationError"),
    (404, "NotFoundError"),
    (429, "RateLimitError"),
    (500, "InternalServerError"),
    (503, "InternalServerError"),
])
def test_run_one_http_errors(status, error):
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(status, json={"error": {"message": "no", "type": "x"}},
                              headers={"Retry-After": "0"})

    with sdk_client(handler) as client:
        row = regression.run_one(client, CASE["rate-limit"], "m")
    assert len(calls) == 1
    assert row["error"] == error
    assert row["error_status"] == status
    assert row["reasons"] == ["execution_error"]
    assert row["passed"] is False
    assert row["response"] is None and row["cost_usd"] is None


@pytest.mark.parametrize("exc", [httpx.ReadTimeout, httpx.ConnectError])
def test_run_one_transport_errors(exc):
    def handler(request):
        raise exc("fake", request=request)

    with sdk_client(handler) as client:
        row = regression.run_one(client, CASE["ambiguous-payment"], "m")
    assert isinstance(row["error"], str) and row["error"]
    assert row["error"] in ("APITimeoutError", "APIConnectionError")
    assert row["error_status"] is None
    assert row["reasons"] == ["execution_error"]
    assert row["passed"] is False


def test_run_one_non_json_body_is_an_execution_error():
    with sdk_client(lambda request: httpx.Response(200, content=b"<html>oops</html>",
                                                   headers={"Content-Type": "application/json"})) as client:
        row = regression.run_one(client, CASE["rate-limit"], "m")
    assert row["error"] is not None
    assert row["reasons"] == ["execution_error"]
    assert row["passed"] is False


# ====================================================================== A7 summary

MODELS2 = ["model-a", "model-b"]


def srow(model, case_id, repeat=0, passed=True, cost="0.0012", error=None):
    reasons = ["execution_error"] if error else ([] if passed else ["wrong_code"])
    return {"case_id": case_id, "model": model, "repeat": repeat, "error": error,
            "error_status": None, "cost_usd": cost, "reasons": reasons, "passed": not reasons,
            "seconds": 0.1}


def full_rows(models=MODELS2, repeats=1, **kw):
    return [srow(m, c, r, **kw) for r in range(repeats) for c in CASE_IDS for m in models]


def test_summary_all_pass():
    result = regression.summary(full_rows(), MODELS2, 1)
    assert result["complete"] is True
    assert result["exit_code"] == 0
    for model in MODELS2:
        stats = result["models"][model]
        assert (stats["passed"], stats["total"], stats["qualified"]) == (4, 4, True)
        assert isinstance(stats["reported_cost_usd"], str)
        assert decimal.Decimal(stats["reported_cost_usd"]) == decimal.Decimal("0.0048")
        assert stats["reported_cost_usd"] == "0.0048"


def test_summary_repeats():
    rows = full_rows(repeats=3)
    result = regression.summary(rows, MODELS2, 3)
    assert result["complete"] is True and result["exit_code"] == 0
    assert result["models"]["model-a"]["total"] == 12
    assert regression.summary(rows, MODELS2, 2)["complete"] is False
    assert regression.summary(rows, MODELS2, 4)["complete"] is False


def test_summary_one_failure():
    rows = full_rows()
    rows[3] = srow(rows[3]["model"], rows[3]["case_id"], passed=False)
    result = regression.summary(rows, MODELS2, 1)
    failed_model = rows[3]["model"]
    other = [m for m in MODELS2 if m != failed_model][0]
    assert result["complete"] is True
    assert result["exit_code"] == 1
    assert result["models"][failed_model]["passed"] == 3
    assert result["models"][failed_model]["total"] == 4
    assert result["models"][failed_model]["qualified"] is False
    assert result["models"][other]["qualified"] is True


def test_summary_error_row_is_exit_2_even_if_complete():
    rows = full_rows()
    rows[0] = srow(rows[0]["model"], rows[0]["case_id"], error="InternalServerError", cost=None)
    result = regression.summary(rows, MODELS2, 1)
    assert result["complete"] is True
    assert result["exit_code"] == 2
    assert result["models"][rows[0]["model"]]["qualified"] is False


def _drop_last(rows):
    return rows[:-1]


def _duplicate(rows):
    return rows + [dict(rows[0])]


def _extra_model(rows):
    return rows + [srow("model-c", "rate-limit")]


def _wrong_repeat(rows):
    rows = list(rows)
    rows[0] = dict(rows[0], repeat=1)
    return rows


def _extra_repeat(rows):
    return rows + [srow("model-a", "rate-limit", repeat=1)]


def _unknown_case(rows):
    return rows + [srow("model-a", "no-such-case")]


def _swap_for_duplicate(rows):
    rows = list(rows)
    rows[-1] = dict(rows[0])  # right count, wrong set
    return rows


@pytest.mark.parametrize("mutate", [_drop_last, _duplicate, _extra_model, _wrong_repeat, _extra_repeat,
                                    _unknown_case, _swap_for_duplicate, lambda rows: []])
def test_summary_incomplete(mutate):
    result = regression.summary(mutate(full_rows()), MODELS2, 1)
    assert result["complete"] is False
    assert result["exit_code"] == 2
    for model in MODELS2:
        assert result["models"][model]["qualified"] is False


def test_summary_cost_none_when_a_row_lacks_cost():
    rows = full_rows()
    rows[0] = dict(rows[0], cost_usd=None)
    result = regression.summary(rows, MODELS2, 1)
    assert result["models"][rows[0]["model"]]["reported_cost_usd"] is None
    other = [m for m in MODELS2 if m != rows[0]["model"]][0]
    assert result["models"][other]["reported_cost_usd"] == "0.0048"


def test_summary_cost_is_exact_decimal_sum():
    costs = ["0.1", "0.2", "0.00001", "3"]
    rows = [srow("model-a", c, cost=cost) for c, cost in zip(CASE_IDS, costs)]
    result = regression.summary(rows, ["model-a"], 1)
    assert result["models"]["model-a"]["reported_cost_usd"] == "3.30001"
    assert result["exit_code"] == 0


def test_summary_custom_cases():
    rows = [srow(m, "rate-limit") for m in MODELS2]
    result = regression.summary(rows, MODELS2, 1, cases=[CASE["rate-limit"]])
    assert result["complete"] is True and result["exit_code"] == 0
    assert regression.summary(rows, MODELS2, 1)["complete"] is False


# ====================================================================== A8 main (real SDK, MockTransport)

@pytest.fixture
def live(monkeypatch, tmp_path):
    """main() with regression.Perplexity building the real SDK over a swappable MockTransport."""
    import perplexity
    monkeypatch.setenv("PERPLEXITY_API_KEY", "test-key")
    monkeypatch.delenv("PERPLEXITY_BASE_URL", raising=False)
    state = SimpleNamespace(handler=correct_reply, kwargs=[], requests=[], clients=[],
                            out=tmp_path / "r.json", sdk=perplexity)

    def transport_handler(request):
        state.requests.append(json.loads(request.content))
        return state.handler(request)

    def factory(**kwargs):
        state.kwargs.append(kwargs)
        client = perplexity.Perplexity(
            http_client=httpx.Client(transport=httpx.MockTransport(transport_handler)),
            base_url="http://127.0.0.1:9", **kwargs)
        state.clients.append(client)
        return client

    with mock.patch("regression.Perplexity", side_effect=factory) as patched:
        state.patched = patched
        yield state
    for client in state.clients:
        client.close()


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def expected_order(models, repeats):
    order = []
    for repeat in range(repeats):
        ordered = models if repeat % 2 == 0 else models[::-1]
        order += [(m, c, repeat) for c in CASE_IDS for m in ordered]
    return order


def test_main_builds_client_with_limits(live):
    assert regression.main(["--out", str(live.out)]) == 0
    assert live.patched.call_count == 1
    kwargs = live.kwargs[0]
    assert kwargs["timeout"] == 180
    assert kwargs["max_retries"] == 0
    assert kwargs["api_key"] == "test-key"


def test_main_record_shape(live, capsys):
    assert regression.main(["--out", str(live.out)]) == 0
    code_hash = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()
    record = read_json(live.out)
    assert {"created_at", "config", "sdk_version", "code_sha256", "runs", "summary"} <= set(record)
    created = datetime.datetime.fromisoformat(record["created_at"])
    assert created.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - created).total_seconds()) < 120
    config = record["config"]
    assert {"models", "cases", "instructions", "tool", "response_format", "repeats", "max_steps",
            "max_output_tokens", "timeout_seconds"} <= set(config)
    assert not {"out", "output", "concurrency", "progress"} & set(config)
    assert config["models"] == DEFAULT_MODELS
    assert config["cases"] == regression.CASES
    assert config["instructions"] == regression.INSTRUCTIONS
    assert config["tool"] == regression.TOOL
    assert config["response_format"] == regression.FORMAT
    assert config["repeats"] == 1
    assert config["max_steps"] == 5
    assert config["max_output_tokens"] == 4096
    assert config["timeout_seconds"] == 180
    assert record["sdk_version"] == live.sdk.__version__
    assert record["code_sha256"] == code_hash
    assert os.stat(live.out).st_mode & 0o777 == 0o600
    assert len(record["runs"]) == 8 and all(row["passed"] for row in record["runs"])
    assert record["summary"]["complete"] is True
    assert record["summary"]["exit_code"] == 0
    assert b"test-key" not in live.out.read_bytes()
    for row in record["runs"]:
        assert ROW_KEYS | {"repeat"} <= set(row)
        assert row["cost_usd"] == "0.0012"


@pytest.mark.parametrize("repeats", [1, 2, 3])
def test_main_row_order_and_repeat(live, repeats):
    models = ["m/one", "m/two"]
    assert regression.main(["--models", *models, "--repeats", str(repeats), "--out", str(live.out)]) == 0
    record = read_json(live.out)
    order = expected_order(models, repeats)
    assert [(row["model"], row["case_id"], row["repeat"]) for row in record["runs"]] == order
    assert [(body["model"], body["input"]) for body in live.requests] == \
        [(m, CASE[c]["question"]) for m, c, _ in order]
    assert record["config"]["repeats"] == repeats
    assert record["config"]["models"] == models


def test_main_checkpoints_after_every_row(live):
    snapshots = []

    def handler(request):
        snapshots.append(read_json(live.out))  # the file must be valid JSON while a request is in flight
        return correct_reply(request)

    live.handler = handler
    assert regression.main(["--models", "a", "b", "--out", str(live.out)]) == 0
    final = read_json(live.out)
    assert len(snapshots) == 8
    for done, snapshot in enumerate(snapshots):
        assert snapshot["runs"] == final["runs"][:done]
        assert snapshot["config"] == final["config"]
        assert snapshot["summary"]["complete"] is False
        assert snapshot["summary"]["exit_code"] == 2
        assert sum(m["total"] for m in snapshot["summary"]["models"].values()) == done
    assert final["summary"]["exit_code"] == 0


def test_main_console_one_line_per_row(live, capsys):
    assert regression.main(["--models", "a", "b", "--out", str(live.out)]) == 0
    out = capsys.readouterr().out.splitlines()
    record = read_json(live.out)
    rows = record["runs"]
    for line, row in zip(out, rows):
        assert row["model"] in line and row["case_id"] in line and "PASS" in line
        assert "0.0012" in line
    assert json.loads("\n".join(out[len(rows):])) == record["summary"]


def test_main_console_line_names_failure_reasons(live, capsys):
    def handler(request):
        case = fakes.CASES_BY_QUESTION[json.loads(request.content)["input"]]
        if case["id"] == "ambiguous-payment":
            return httpx.Response(200, json=fakes.advisor_answer(case, "503", "wait_then_retry"))
        return correct_reply(request)

    live.handler = handler
    assert regression.main(["--models", "a", "--out", str(live.out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    payment = [line for line in lines[:4] if "ambiguous-payment" in line]
    assert len(payment) == 1
    assert "wrong_code" in payment[0] and "wrong_next_action" in payment[0]
    assert "PASS" not in payment[0]
    record = read_json(live.out)
    assert record["summary"]["exit_code"] == 1


def test_main_refuses_existing_out(live, capsys):
    live.out.write_bytes(b"precious bytes\n")
    with pytest.raises(SystemExit) as exc:
        regression.main(["--out", str(live.out)])
    assert exc.value.code == 2
    assert live.out.read_bytes() == b"precious bytes\n"
    assert live.requests == []
    assert capsys.readouterr().err.strip()


def test_main_unwritable_out_is_exit_2(live, tmp_path):
    with pytest.raises(SystemExit) as exc:
        regression.main(["--out", str(tmp_path / "no-such-dir" / "r.json")])
    assert exc.value.code == 2
    assert live.requests == []


def test_main_missing_key(live, monkeypatch, capsys):
    monkeypatch.delenv("PERPLEXITY_API_KEY")
    with pytest.raises(SystemExit) as exc:
        regression.main(["--out", str(live.out)])
    assert exc.value.code == 2
    assert not live.out.exists()
    assert live.requests == []
    assert "PERPLEXITY_API_KEY" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--repeats", "0"], ["--repeats", "101"], ["--repeats", "-1"], ["--repeats", "x"],
    ["--models", "a", "a"], ["--models", "a", "b", "a"], ["--models"], ["--no-such-flag"],
])
def test_main_usage_errors(live, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        regression.main([*argv, "--out", str(live.out)])
    assert exc.value.code == 2
    assert not live.out.exists()
    assert live.requests == []
    assert capsys.readouterr().err.strip()


@pytest.mark.parametrize("repeats", ["1", "10"])
def test_main_repeats_bounds_accepted(live, repeats):
    assert regression.main(["--models", "a", "--repeats", repeats, "--out", str(live.out)]) == 0
    assert len(read_json(live.out)["runs"]) == 4 * int(repeats)


def test_main_client_construction_failure_leaves_no_file(monkeypatch, tmp_path):
    monkeypatch.setenv("PERPLEXITY_API_KEY", "test-key")
    out = tmp_path / "r.json"
    with mock.patch("regression.Perplexity", side_effect=RuntimeError("cannot build")):
        with pytest.raises(SystemExit) as exc:
            regression.main(["--out", str(out)])
    assert exc.value.code == 2
    assert not out.exists()


@pytest.mark.parametrize("status", [401, 429, 500])
def test_main_first_error_stops_the_run(live, status):
    def handler(request):
        if len(live.requests) == 2:
            return httpx.Response(status, json={"error": {"message": "fake"}})
        return correct_reply(request)

    live.handler = handler
    assert regression.main(["--out", str(live.out)]) == 2
    assert len(live.requests) == 2
    record = read_json(live.out)
    assert len(record["runs"]) == 2
    assert record["runs"][0]["passed"] is True
    assert record["runs"][1]["error_status"] == status
    assert record["runs"][1]["reasons"] == ["execution_error"]
    assert record["summary"]["exit_code"] == 2
    assert record["summary"]["complete"] is False


def test_main_keyboard_interrupt_propagates_after_saving(live):
    def handler(request):
        if len(live.requests) == 3:
            raise KeyboardInterrupt
        return correct_reply(request)

    live.handler = handler
    with pytest.raises(KeyboardInterrupt):
        regression.main(["--out", str(live.out)])
    record = read_json(live.out)
    assert len(live.requests) == 3
    assert len(record["runs"]) == 2
    assert all(row["passed"] for row in record["runs"])
    assert record["summary"]["exit_code"] == 2
    assert record["summary"]["complete"] is False


def test_import_is_light_and_does_not_run(tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith("PERPLEXITY_")}
    env["PYTHONPATH"] = str(HERE)
    code = ("import sys, regression; "
            "print('perplexity' in sys.modules, any(m.startswith('perplexity') for m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False False"
    assert proc.stderr == ""
    assert list(tmp_path.iterdir()) == []


# ====================================================================== end to end (loopback fake server)

def run_env(server):
    env = {key: value for key, value in os.environ.items()
           if not key.lower().endswith("_proxy") and not key.startswith("PERPLEXITY_")}
    env.update(PERPLEXITY_BASE_URL=server.url, PERPLEXITY_API_KEY="test-key", PYTHONUNBUFFERED="1")
    return env


def run_script(server, out, *args):
    """`python regression.py --out OUT ARGS` in a process of its own, forked from a zygote that
    has paid the SDK import once (fakes.run_script)."""
    return fakes.run_script(["--out", out, *args], HERE, run_env(server), timeout=60)


def test_e2e_all_correct(tmp_path):
    out = tmp_path / "r.json"
    with fakes.FakeServer(fakes.advisor()) as server:
        proc = run_script(server, out)
    assert proc.returncode == 0, proc.stderr
    record = read_json(out)
    assert len(record["runs"]) == 8
    assert all(row["passed"] and row["reasons"] == [] for row in record["runs"])
    assert server.count == 8
    assert record["summary"]["exit_code"] == 0 and record["summary"]["complete"] is True
    assert all(r.json["instructions"] == regression.INSTRUCTIONS for r in server.requests)
    assert all(r.headers.get("Authorization") == "Bearer test-key" for r in server.requests)
    assert b"test-key" not in out.read_bytes()
    assert os.stat(out).st_mode & 0o777 == 0o600
    assert "Traceback" not in proc.stderr


def test_e2e_unsafe_payment_fails(tmp_path):
    out = tmp_path / "r.json"
    with fakes.FakeServer(fakes.advisor(unsafe_payment=True)) as server:
        proc = run_script(server, out)
    assert proc.returncode == 1, proc.stderr
    record = read_json(out)
    failed = [row for row in record["runs"] if not row["passed"]]
    assert sorted(row["model"] for row in failed) == sorted(DEFAULT_MODELS)
    assert all(row["case_id"] == "ambiguous-payment" for row in failed)
    assert all(row["reasons"] == ["wrong_code", "wrong_next_action"] for row in failed)
    assert all(row["error"] is None for row in failed)
    assert sum(row["passed"] for row in record["runs"]) == 6
    assert record["summary"]["exit_code"] == 1
    assert all(not m["qualified"] for m in record["summary"]["models"].values())


@pytest.mark.parametrize("status, error", [(401, "AuthenticationError"), (429, "RateLimitError"),
                                           (500, "InternalServerError")])
def test_e2e_endpoint_errors(tmp_path, status, error):
    out = tmp_path / "r.json"
    with fakes.FakeServer(fakes.failing(status, headers={"Retry-After": "0"})) as server:
        proc = run_script(server, out)
    assert proc.returncode == 2, proc.stderr
    assert server.count == 1
    record = read_json(out)
    assert len(record["runs"]) == 1
    row = record["runs"][0]
    assert row["error"] == error
    assert row["error_status"] == status
    assert row["reasons"] == ["execution_error"]
    assert record["summary"]["exit_code"] == 2
    assert "Traceback" not in proc.stderr


def test_e2e_sigint_saves_finished_rows(tmp_path):
    out = tmp_path / "r.json"
    with fakes.FakeServer(fakes.advisor(delay=0.3)) as server:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(out)], cwd=HERE,
                                env=run_env(server), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        watchdog = threading.Timer(30, proc.kill)
        watchdog.start()
        try:
            lines = [proc.stdout.readline(), proc.stdout.readline()]
            proc.send_signal(signal.SIGINT)
            rest, err = proc.communicate(timeout=30)
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert all(line.strip() for line in lines), lines
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    record = read_json(out)
    printed = lines + [line for line in rest.splitlines() if line.strip()]
    assert len(record["runs"]) >= 2
    assert len(record["runs"]) == len(printed)
    assert all(row["passed"] for row in record["runs"])
    assert record["summary"]["exit_code"] == 2
    assert str(len(record["runs"])) in err


# ====================================================================== load_record

def tiny_config():
    return {"models": ["m"], "cases": [{"id": f"c{n}"} for n in range(4)], "repeats": 1}


def build_record(path, texts):
    header = {"created_at": "2024-01-01T00:00:00+00:00", "config": tiny_config(),
              "sdk_version": "0", "code_sha256": "0", "evidence": "live"}
    rows = [{"case_id": f"c{n}", "model": "m", "repeat": 0, "error": None, "cost_usd": "0.5",
             "answer_text": text, "reasons": [], "passed": True} for n, text in enumerate(texts)]
    models, repeats = ["m"], 1
    writer = regression.create_record(str(path), header, [], regression.summary([], models, repeats, tiny_config()["cases"]))
    try:
        for n, row in enumerate(rows):
            writer.append(row, regression.summary(rows[:n + 1], models, repeats, tiny_config()["cases"]))
    finally:
        writer.close()
    data = path.read_bytes()
    ends, pos = [], 0
    for row in rows:
        encoded = regression.dumps(row).encode("utf-8")
        pos = data.index(encoded, pos) + len(encoded)
        ends.append(pos)
    header_end = data.index(b'"runs": [') + len(b'"runs": [')
    return data, rows, ends, header_end


def torn_failures(tmp_path, data, rows, ends, cuts):
    """Cuts whose recovery is wrong: (cut, what happened)."""
    torn = tmp_path / "torn.json"
    failures = []
    for cut in cuts:
        torn.write_bytes(data[:cut])
        try:
            record = regression.load_record(str(torn))
        except regression.RecordError as exc:
            failures.append((cut, data[max(0, cut - 12):cut], f"RecordError: {exc}"[:120]))
            continue
        want = [row for row, end in zip(rows, ends) if end <= cut]
        if record.get("runs") != want:
            failures.append((cut, data[max(0, cut - 12):cut], f"{len(record.get('runs', []))} rows, want {len(want)}"))
    return failures


ASCII_TEXTS = ['{"code": "429"}', "a", "b" * 40, "tail"]
UNICODE_TEXTS = ["caf\u00e9 \u2014 r\u00e9ponse", "\u4e2d\u6587", "ok", "\U0001F600 emoji"]


def test_load_record_clean_file_unchanged(tmp_path):
    path = tmp_path / "r.json"
    data, rows, _, _ = build_record(path, ASCII_TEXTS)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert regression.load_record(str(path)) == json.loads(data)
    assert "recovered" not in regression.load_record(str(path))
    assert json.loads(data)["runs"] == rows


def test_load_record_cut_inside_rows(tmp_path):
    """Every cut between the header and the end of the last row keeps exactly the complete rows."""
    data, rows, ends, header_end = build_record(tmp_path / "r.json", ASCII_TEXTS)
    assert torn_failures(tmp_path, data, rows, ends, range(header_end, ends[-1] + 1)) == []
    torn = tmp_path / "one.json"
    torn.write_bytes(data[:ends[1] + 5])
    record = regression.load_record(str(torn))
    assert record["recovered"] is True
    assert record["runs"] == rows[:2]
    assert record["config"] == tiny_config()


@pytest.mark.parametrize("texts", [ASCII_TEXTS, UNICODE_TEXTS], ids=["ascii", "unicode"])
def test_load_record_every_byte_offset(tmp_path, texts):
    """A crash can cut the file at any byte after the header; every finished row must come back."""
    data, rows, ends, header_end = build_record(tmp_path / "r.json", texts)
    failures = torn_failures(tmp_path, data, rows, ends, range(header_end, len(data) + 1))
    assert failures == [], f"{len(failures)} bad cut(s), first: {failures[:3]}"


@pytest.mark.parametrize("tail", [b"\n],", b"\n], ", b'\n], "sum', b'\n], "summary"', b'\n], "summary": {"comp'])
def test_load_record_torn_summary_keeps_all_rows(tmp_path, tail):
    data, rows, ends, _ = build_record(tmp_path / "r.json", ASCII_TEXTS)
    torn = tmp_path / "torn.json"
    torn.write_bytes(data[:ends[-1]] + tail)
    record = regression.load_record(str(torn))
    assert record["runs"] == rows
    assert record["recovered"] is True


def test_load_record_of_a_torn_shard_record_counts_only_the_shards_rows(tmp_path):
    """A torn shard record's summary is recomputed for the shard's plan: it read the other
    shards' rows as missing (4 of 4 planned, 2 run: incomplete) where its own 2 of 2 all ran."""
    suite = tmp_path / "s.json"
    suite.write_text(json.dumps({"name": "s", "instructions": "x", "cases": [
        {"id": f"c{n}", "input": "q", "contains": ["q"]} for n in range(4)]}), encoding="utf-8")
    out = tmp_path / "shard.json"
    assert regression.main(["--suite", str(suite), "--provider", "echo", "--models", "m",
                            "--shard", "1/2", "--out", str(out)]) == 0
    data = out.read_bytes()
    torn = tmp_path / "torn.json"
    torn.write_bytes(data[:data.index(b'"summary"')])  # the rows whole, the summary torn away
    record = regression.load_record(str(torn))
    assert record["recovered"] is True and len(record["runs"]) == 2
    assert record["summary"] == {**regression.recount(json.loads(data))["summary"],
                                 "stopped": "recovered from a torn record"}
    assert record["summary"]["complete"] is True and record["summary"]["exit_code"] == 0


def test_load_record_torn_inside_multibyte_character(tmp_path):
    data, rows, ends, _ = build_record(tmp_path / "r.json", ["ok", "caf\u00e9"] + ["x", "y"])
    cut = data.index("\u00e9".encode("utf-8"), ends[0]) + 1  # between the two bytes of "é" in row 2
    torn = tmp_path / "torn.json"
    torn.write_bytes(data[:cut])
    record = regression.load_record(str(torn))
    assert record["runs"] == rows[:1]


def test_load_record_of_a_real_run_torn(live, tmp_path):
    assert regression.main(["--models", "a", "--out", str(live.out)]) == 0
    data = live.out.read_bytes()
    full = json.loads(data)
    cut = data.index(b'"case_id": "ambiguous-payment"')
    torn = tmp_path / "torn.json"
    torn.write_bytes(data[:cut])
    record = regression.load_record(str(torn))
    assert record["runs"] == full["runs"][:3]
    assert record["recovered"] is True
    assert record["summary"]["complete"] is False


@pytest.mark.parametrize("content", [None, b"", b"not json", b"[1, 2]x", b"\xff\xfe", b'{"config": {}',
                                     b'{"created_at": "x", "runs": "nope"'])
def test_load_record_unreadable(tmp_path, content):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(regression.RecordError):
        regression.load_record(str(path))


# ====================================================================== O(row) checkpoint

def test_append_writes_only_the_new_row_and_the_tail(tmp_path, monkeypatch):
    """A checkpoint costs O(row): each append writes the row plus the short tail, at the end
    of the file, whatever the file's size; earlier bytes are never rewritten."""
    path = tmp_path / "record.json"
    models, cases = ["m"], [{"id": f"c{n}"} for n in range(300)]
    tally = regression.Tally(models, 1, cases)
    writer = regression.create_record(str(path), {"created_at": "t", "config": {"models": models}},
                                      [], tally.summary())
    writes = []
    real_pwrite = os.pwrite

    def spy(fd, data, offset):
        writes.append((len(data), offset))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", spy)
    per_append = []
    for n, case in enumerate(cases):
        row = {"case_id": case["id"], "model": "m", "repeat": 0, "error": None, "reasons": [],
               "passed": True, "cost_usd": "0.001", "answer_text": "x" * 30_000, "seconds": 0.0}
        size_before = path.stat().st_size
        writes.clear()
        tally.add(row)
        writer.append(row, tally.summary())
        written = sum(length for length, _ in writes)
        assert min(offset for _, offset in writes) >= size_before - 400  # only the old tail is overwritten
        per_append.append(written)
        if n in (0, 150, 299):
            assert len(json.loads(path.read_text())["runs"]) == n + 1  # valid JSON after every row
    writer.close()
    assert max(per_append) - min(per_append) < 200  # the same bytes at row 1 and row 300
    assert max(per_append) < 30_000 + 1_000
