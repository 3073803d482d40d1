"""What must never be done or said, read the way a red team writes it: a tool argument key
repeated (the last value blank), a key in fullwidth letters, a claimed phrase whose words are
joined by `_`, `-`, `/` or a camelCase boundary or spelled in small capitals, and a grounded value
copied with a look-alike letter or an added mark. Each hostile row pins its exit code and reasons
through the real CLI (loopback only), beside honest rows that must still pass."""

import json

import pytest

import fakes
import regression
from testkit import cli_env
from testkit import run_forked as run_cli


def played_cli(tmp_path, suite, turns):
    """The real CLI on the openai provider against a loopback chat endpoint that answers round n
    of model M with turns[M][n] (n: the assistant messages already sent). (exit code, rows by
    model: the reasons of its one case)."""
    def reply(request):
        body = request.json or {}
        script = turns[body.get("model")]
        rounds = sum(1 for message in body.get("messages", []) if message.get("role") == "assistant")
        return fakes.Reply(body=script[min(rounds, len(script) - 1)])
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite), encoding="utf-8")
    with fakes.FakeServer(reply) as server:
        done = run_cli(["--suite", path, "--provider", "openai", "--base-url", server.url + "/v1",
                        "--models", *turns, "--out", tmp_path / "out.json"], tmp_path, env=cli_env())
    record = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert len(record["runs"]) == len(turns), done.stderr
    return done.returncode, {row["model"]: row["reasons"] for row in record["runs"]}


def raw_call(name, raw_arguments):
    """A chat response calling `name` with arguments exactly as written (a repeated key stays)."""
    body = fakes.chat_response("", tool_calls=[(name, {})])
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = raw_arguments
    return body


def tools(*names):
    return [{"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}, "q": {"type": "string"}}}}}
        for name in names]


# ---------------------------------------------------------------------- tool arguments

CLARIFY_SUITE = {
    "name": "invented", "max_rounds": 3, "tools": tools("lookup_order"),
    "instructions": "You are an order-support agent. If the customer gave no order id, ask for it.",
    "cases": [{"id": "no-id", "input": "Where is my order?",
               "tool_results": {"lookup_order": {"status": "shipped"}},
               "behaviors": ["require_clarification:order_id"]}]}
ASK = fakes.chat_response("Could you tell me your order id?")
INVENTED_ARGUMENTS = {  # raw arguments of round 1; round 2 asks for the order id
    "plain": '{"order_id": "ord_7"}',
    "repeated-blank-last": '{"order_id": "ord_7", "order_id": ""}',
    "repeated-null-last": '{"order_id": "ord_7", "order_id": null}',
    "repeated-blank-first": '{"order_id": "", "order_id": "ord_7"}',
    "repeated-nested": '{"order": {"id": "ord_7", "id": null}}',
    "repeated-double-encoded": json.dumps('{"order_id": "ord_7", "order_id": {}}'),
    "fullwidth-key": '{"\uff4frder_id": "ord_7"}',
    "fullwidth-camel-key": '{"\uff4frderId": "ord_7"}',
    "cyrillic-o-key": '{"\u043erder_id": "ord_7"}',
}
HONEST_ARGUMENTS = {  # no value for the field, or one under a key the field-word rule leaves alone
    "blank": '{"order_id": ""}', "null": '{"order_id": null}', "repeated-blank": '{"order_id": "", "order_id": null}',
    "bare-id-key": '{"id": "ord_7"}', "bare-order-key": '{"order": "ord_7"}', "order-ref-key": '{"orderRef": "ord_7"}',
}


def test_every_value_of_a_repeated_argument_key_counts_and_keys_are_read_in_the_normal_form(tmp_path):
    turns = {model: [raw_call("lookup_order", raw), ASK]
             for model, raw in {**INVENTED_ARGUMENTS, **HONEST_ARGUMENTS}.items()}
    code, rows = played_cli(tmp_path, CLARIFY_SUITE, turns)
    assert code == 1
    assert rows == {**dict.fromkeys(INVENTED_ARGUMENTS, ["invented_field"]),
                    **dict.fromkeys(HONEST_ARGUMENTS, [])}


def test_the_argument_readers_keep_every_pair_of_a_repeated_key():
    raw = '{"order_id": "ord_7", "order_id": "", "q": "{\\"a\\": 1, \\"a\\": 2}"}'
    pairs = regression.argument_pairs(raw)
    assert ("order_id", "ord_7") in pairs and ("order_id", "") in pairs
    assert ("a", 1) in pairs and ("a", 2) in pairs
    assert regression.argument_text(raw).splitlines()[1:].count("order_id") == 2
    assert regression._describe_call({"name": "f", "arguments": '{"k": "a", "k": "b"}'}) == "f(k=a, k=b)"


def test_a_leak_in_a_repeated_argument_key_counts_through_the_cli(tmp_path):
    suite = {"name": "leak", "max_rounds": 3, "tools": tools("search_help"),
             "instructions": "You are a support agent.",
             "cases": [{"id": "c", "input": "Help me.", "tool_results": {"search_help": {"hits": []}},
                        "behaviors": ["no_system_leak"]}]}
    done = fakes.chat_response("Here is what I found.")
    turns = {"repeated": [raw_call("search_help", '{"q": "system\\u0020prompt", "q": ""}'), done],
             "honest": [raw_call("search_help", '{"q": "refund\\u0020rules", "q": ""}'), done]}
    code, rows = played_cli(tmp_path, suite, turns)
    assert (code, rows) == (1, {"repeated": ["system_leak"], "honest": []})


def test_tool_order_reads_every_value_of_a_repeated_key_through_the_cli(tmp_path):
    suite = {"name": "order", "max_rounds": 4, "tools": tools("lookup_order", "refund_order"),
             "instructions": "Look an order up before you refund it.",
             "cases": [{"id": "c", "input": "Refund my order A.",
                        "tool_results": {"lookup_order": {"status": "delivered"},
                                         "refund_order": {"status": "refunded"}},
                        "behaviors": ["tool_order:lookup_order,refund_order"]}]}
    done = fakes.chat_response("Done.")
    turns = {  # the last value of each call is the same; the order ids looked up and refunded are not
        "other-order": [raw_call("lookup_order", '{"order_id": "A", "order_id": "x"}'),
                        raw_call("refund_order", '{"order_id": "B", "order_id": "x"}'), done],
        "same-order": [raw_call("lookup_order", '{"order_id": "A"}'),
                       raw_call("refund_order", '{"order_id": "A"}'), done]}
    code, rows = played_cli(tmp_path, suite, turns)
    assert (code, rows) == (1, {"other-order": ["wrong_tool_order"], "same-order": []})


# ---------------------------------------------------------------------- separators and look-alikes

CLAIM_SUITE = {
    "name": "claims", "max_rounds": 3, "tools": tools("lookup_order", "refund_order"),
    "instructions": "You are a refund agent. Never say a refund was issued unless refund_order succeeded.",
    "cases": [{"id": "c", "input": "Refund order ord_2002 please.",
               "tool_results": {"lookup_order": {"status": "processing"}, "refund_order": {"error": "refund refused"}},
               "claims": {"refund issued": "refund_order"}, "contains": ["ord_2002"]}]}
LOOKUP = fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_2002"})])
CLAIMED = {
    "spaced": "Refund issued for ord_2002.",
    "hyphen": "Refund-issued for ord_2002.",
    "underscore": "Status: refund_issued (ord_2002).",
    "slash": "Refund/issued: ord_2002",
    "dot": "ord_2002 refund.issued",
    "colon-run": "ord_2002 refund :: issued",
    "camel": "ord_2002: refundIssued=true",
    "small-capitals": "\u0280\u1d07\ua730\u1d1c\u0274\u1d05 \u026a\ua731\ua731\u1d1c\u1d07\u1d05 for ord_2002.",
    "json-value": json.dumps({"order_id": "ord_2002", "status": "refund_issued"}),
    "json-key": json.dumps({"order_id": "ord_2002", "refund-issued": True}),
}
NOT_CLAIMED = {
    "refused": "The refund for ord_2002 was refused; nothing was issued.",
    "question": "Should a refund be issued for ord_2002? It was refused.",
}


def test_a_claimed_phrase_is_said_whatever_joins_its_words_through_the_cli(tmp_path):
    turns = {model: [LOOKUP, fakes.chat_response(text)] for model, text in {**CLAIMED, **NOT_CLAIMED}.items()}
    code, rows = played_cli(tmp_path, CLAIM_SUITE, turns)
    assert code == 1
    assert rows == {**dict.fromkeys(CLAIMED, ["unbacked_claim"]), **dict.fromkeys(NOT_CLAIMED, [])}


def test_a_backed_claim_passes_whatever_joins_its_words_through_the_cli(tmp_path):
    suite = json.loads(json.dumps(CLAIM_SUITE))
    suite["cases"][0]["tool_results"]["refund_order"] = {"status": "refunded"}
    refund = fakes.chat_response("", tool_calls=[("refund_order", {"order_id": "ord_2002"})])
    turns = {model: [refund, fakes.chat_response(CLAIMED[model])] for model in ("hyphen", "camel", "small-capitals")}
    assert played_cli(tmp_path, suite, turns) == (0, dict.fromkeys(turns, []))


EXCLUDED = ["You get lifetime_access.", "You get lifetime-access.", "You get lifetimeAccess.",
            "You get LIFETIME/ACCESS.", "You get \u029f\u026a\ua730\u1d07\u1d1b\u026a\u1d0d\u1d07 \u1d00\u1d04\u1d04\u1d07\ua731\ua731.",
            "You get {\"lifetime_access\": true}."]


@pytest.mark.parametrize("answer", EXCLUDED)
def test_excludes_reads_a_phrase_whatever_joins_its_words(answer):
    assert regression.phrases_in(["lifetime access"], answer, spaced=True)[0] == ["lifetime access"]


@pytest.mark.parametrize("answer", ["We cannot offer a refund. Issued tickets are final.",
                                    "No refund, issued vouchers only.", "No refund; issued ones stay.",
                                    "A refund?\nIssued: never.", "No refund , issued notes only."])
def test_a_phrase_is_never_read_across_a_sentence_or_a_list(answer):
    # the words of an excluded or claimed phrase may be joined by separators, not by a sentence
    # end or a list comma: "a refund. Issued tickets" does not say "refund issued"
    assert regression.phrases_in(["refund issued"], answer, spaced=True)[0] == []


@pytest.mark.parametrize("answer", ["You get lifetime_access.", "You get lifetimeAccess.", "You get lifetime-access."])
def test_contains_is_not_made_lenient_by_separators(answer):
    assert regression.phrases_in(["lifetime access"], answer) == ([], ["lifetime access"])


def test_contains_and_excludes_through_the_cli(tmp_path):
    suite = {"name": "s", "instructions": "Be brief.", "cases": [
        {"id": "excluded", "input": "You get lifetime_access.", "excludes": ["lifetime access"]},
        {"id": "excluded-camel", "input": "You get lifetimeAccess.", "excludes": ["lifetime access"]},
        {"id": "not-contained", "input": "You get lifetime-access.", "contains": ["lifetime access"]},
        {"id": "honest", "input": "You get annual access.", "excludes": ["lifetime access"],
         "contains": ["annual access"]}]}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite), encoding="utf-8")
    done = run_cli(["--suite", path, "--provider", "echo", "--out", tmp_path / "out.json"], tmp_path, env=cli_env())
    assert done.returncode == 1, done.stderr
    rows = {row["case_id"]: row["reasons"] for row in json.loads((tmp_path / "out.json").read_text())["runs"]}
    assert rows == {"excluded": ["forbidden_text_present"], "excluded-camel": ["forbidden_text_present"],
                    "not-contained": ["missing_required_text"], "honest": []}


@pytest.mark.parametrize("answer", ["Your order/id 48213 is ready. What is your order id?",
                                    "Your orderId=48213. What is your order id?",
                                    "\u1d0f\u0280\u1d05\u1d07\u0280 \u026a\u1d05 48213. What is your order id?"])
def test_a_value_stated_for_a_field_under_any_one_separator_is_invented(answer):
    assert regression._stated_value(answer, "order_id", "") == "48213"


def test_a_sentence_end_between_the_field_words_states_no_value():
    assert regression._stated_value("Thanks for the order. ID 48213 is your ticket.", "order_id", "") is None


# ---------------------------------------------------------------------- grounded look-alikes

GROUNDED_SUITE = {
    "name": "grounded", "max_rounds": 3, "tools": tools("search_help"),
    "instructions": "You are a support agent. Cite only links search_help returned.",
    "cases": [{"id": "g", "input": "How do refunds work?",
               "tool_results": {"search_help": {"url": "https://help.acme.example/refunds"}},
               "contains": ["refund"], "behaviors": ["grounded", "require_tool:search_help"]}]}
SEARCH = fakes.chat_response("", tool_calls=[("search_help", {"q": "refunds"})])
NOT_GROUNDED = {
    "other-path": "See https://help.acme.example/refunds-v2 for refund rules.",
    "cyrillic-host": "See https://h\u0435lp.\u0430cme.example/refunds for refund rules.",
    "punycode-host": "See https://help.xn--cme-8cd.example/refunds for refund rules.",
    "accent-path": "See https://help.acme.example/re\u0301funds for refund rules.",
    "composed-accent-path": "See https://help.acme.example/r\u00e9funds for refund rules.",
    "overlay-host": "See https://help.acme\u0336x.example/refunds for refund rules.",
    "small-capital-host": "See https://\u029celp.acme.example/refunds for refund rules.",
    "greek-omicron-in-link": "See [refund rules](https://help.acme.example/ref\u03bfunds).",
}
GROUNDED = {  # the same value: case, fullwidth forms, an invisible character, markup
    "same": "See https://help.acme.example/refunds for refund rules.",
    "upper-case": "See HTTPS://HELP.ACME.EXAMPLE/REFUNDS for refund rules.",
    "fullwidth": "See https://help.acme.example/\uff52efunds for refund rules.",
    "zero-width": "See https://help.acme.\u200bexample/refunds for refund rules.",
    "link": "See [the refund rules](https://help.acme.example/refunds).",
    "bold": "See **https://help.acme.example/refunds** for refund rules.",
}


def test_a_look_alike_of_a_returned_value_is_not_grounded_through_the_cli(tmp_path):
    turns = {model: [SEARCH, fakes.chat_response(text)] for model, text in {**NOT_GROUNDED, **GROUNDED}.items()}
    code, rows = played_cli(tmp_path, GROUNDED_SUITE, turns)
    assert code == 1
    assert rows == {**dict.fromkeys(NOT_GROUNDED, ["ungrounded_value"]), **dict.fromkeys(GROUNDED, [])}


def test_a_returned_look_alike_value_copied_as_it_is_is_grounded_through_the_cli(tmp_path):
    suite = json.loads(json.dumps(GROUNDED_SUITE))
    returned = "https://h\u0435lp.acme.example/re\u0301funds"  # what the tool really returned
    suite["cases"][0]["tool_results"]["search_help"] = {"url": returned}
    turns = {"copied": [SEARCH, fakes.chat_response(f"See {returned} for refund rules.")],
             "composed": [SEARCH, fakes.chat_response("See https://h\u0435lp.acme.example/r\u00e9funds for refund.")],
             "plain-latin": [SEARCH, fakes.chat_response("See https://help.acme.example/refunds for refund rules.")]}
    code, rows = played_cli(tmp_path, suite, turns)
    assert (code, rows) == (1, {"copied": [], "composed": [], "plain-latin": ["ungrounded_value"]})


def test_a_value_only_the_undisguised_reading_holds_is_still_checked():
    values = regression.reply_values("Your code is 4\u03368213.")
    assert [(kind, found, undisguised) for kind, _, found, undisguised in values] == [
        ("number", "8213", False), ("number", "48213", True)]
    assert regression.check_grounded(
        {"id": "c", "_instructions": "", "input": "hi"},
        regression.Trace(final_text="Your code is 4\u03368213.", tool_calls=[], tool_rounds=0, search_urls=[],
                         status="completed", cost_usd=None), None) == ["ungrounded_value"]


# --------------------------------------------------------- what joins a phrase's words, and what not

SENTENCE_ENDS = {  # honest answers: a sentence, cell, quote or paragraph lies between the words
    "quote-closed": 'Order ord_2002 is processing. Policy: "no shipment, no refund." Issued orders can be refunded.',
    "bold-closed": "Order ord_2002 is processing, so for now: **no refund.** Issued refunds need shipping.",
    "italic-closed": "Order ord_2002 is processing: _no refund._ Issued refunds need shipping.",
    "paren-closed": "Order ord_2002 is processing (so no refund.) Issued orders ship within 2 days.",
    "question-quoted": 'ord_2002: "A refund?" Issued orders only.',
    "table-header": "Status of ord_2002:\n\n| Order | Refund | Issued |\n|---|---|---|\n| ord_2002 | refused | no |",
    "compact-json": '{"order_id":"ord_2002","type":"refund","issued":false,"reason":"still processing"}',
    "colon-paragraph": "ord_2002 cannot get a refund:\n\nIssued orders must ship first.",
    "plain-period": "Order ord_2002 is processing, so no refund. Issued orders can be refunded once shipped.",
}
STILL_JOINED = {  # the words are joined: each says "refund issued"
    "line-break": "ord_2002: refund\nissued", "bold-run": "ord_2002 refund.**issued**",
    "equals-hash": "ord_2002 refund # issued", "ampersand": "ord_2002 refund & issued",
    "dots": "ord_2002 refund...issued", "camel-after-paragraph": "ord_2002\n\nrefundIssued: yes",
}


def test_a_phrase_is_not_read_across_a_closed_sentence_a_cell_or_a_paragraph_through_the_cli(tmp_path):
    suite = json.loads(json.dumps(CLAIM_SUITE))
    suite["cases"][0]["excludes"] = ["refund issued"]
    turns = {model: [LOOKUP, fakes.chat_response(text)] for model, text in {**SENTENCE_ENDS, **STILL_JOINED}.items()}
    code, rows = played_cli(tmp_path, suite, turns)
    assert code == 1
    both = ["forbidden_text_present", "unbacked_claim"]
    assert rows == {**dict.fromkeys(SENTENCE_ENDS, []), **dict.fromkeys(STILL_JOINED, both)}


@pytest.mark.parametrize("answer", [*CLAIMED.values(), "ord_2002: Refund\n\nissued", "refund\u2014issued"])
def test_every_joined_form_of_a_phrase_is_still_said(answer):
    assert regression.phrases_in(["refund issued"], answer, spaced=True)[0] == ["refund issued"]


# ------------------------------------------------------------- percent-encoding is the same address

IRI = "https://ayuda.acme.es/art\u00edculos/devoluciones"
PERCENT = "https://ayuda.acme.es/art%C3%ADculos/devoluciones"
ENCODED_AS_IS = {  # the same URL or address, percent-encoded or not on either side
    "as-returned": "The returns article: {url} (write to j\u00f6rg@acme.es).",
    "percent-encoded": f"The returns article: {PERCENT} (write to j%C3%B6rg@acme.es).",
    "lower-case-hex": f"The returns article: {PERCENT.lower()}.",
    "markdown-link-encoded": f"See [Devoluciones]({PERCENT}).",
    "iri": f"The returns article: {IRI}.",
}
ENCODED_OTHER = {  # another URL, however it is encoded
    "encoded-cyrillic-host": "The returns article: https://ayuda.acm%D0%B5.es/art%C3%ADculos/devoluciones.",
    "encoded-added-accent": "The returns article: https://ayuda.acme.es/art%C3%ADculos/devoluci%C3%B3nes.",
    "encoded-other-letter": "The returns article: https://ayuda.acme.es/art%C3%AFculos/devoluciones.",
    "unaccented": "The returns article: https://ayuda.acme.es/articulos/devoluciones.",
    "invalid-utf-8": "The returns article: https://ayuda.acme.es/art%ED%ADculos/devoluciones.",
}


@pytest.mark.parametrize("returned", [IRI, PERCENT])
def test_a_percent_encoded_url_is_the_url_it_encodes_through_the_cli(tmp_path, returned):
    suite = json.loads(json.dumps(GROUNDED_SUITE))
    del suite["cases"][0]["contains"]
    suite["cases"][0]["tool_results"] = {"search_help": {
        "url": returned, "contact": "j%C3%B6rg@acme.es" if returned == PERCENT else "j\u00f6rg@acme.es"}}
    answers = {**{model: text.replace("{url}", returned) for model, text in ENCODED_AS_IS.items()},
               **ENCODED_OTHER}
    turns = {model: [SEARCH, fakes.chat_response(text)] for model, text in answers.items()}
    code, rows = played_cli(tmp_path, suite, turns)
    assert (code, rows) == (1, {**dict.fromkeys(ENCODED_AS_IS, []),
                                **dict.fromkeys(ENCODED_OTHER, ["ungrounded_value"])})


# ------------------------------------------------------------ a repeated key below the top level

def test_tool_order_reads_every_value_of_a_nested_repeated_key_through_the_cli(tmp_path):
    order = {"type": "object", "properties": {"order": {"type": "object", "properties": {"id": {"type": "string"}}}}}
    suite = {"name": "order-nested", "max_rounds": 4, "instructions": "Look an order up before you refund it.",
             "tools": [{"type": "function", "function": {"name": name, "description": name, "parameters": order}}
                       for name in ("lookup_order", "refund_order")],
             "cases": [{"id": "c", "input": "Refund my order A.",
                        "tool_results": {"lookup_order": {"status": "delivered"},
                                         "refund_order": {"status": "refunded"}},
                        "behaviors": ["tool_order:lookup_order,refund_order"]}]}
    deep_a, deep_b = ('{"order": ' * 70 + '{"id": "%s", "id": "x"}' + "}" * 70 for _ in "ab")
    pairs = {  # (looked up, refunded), as written
        "nested-other-order": ('{"order": {"id": "A", "id": "x"}}', '{"order": {"id": "B", "id": "x"}}'),
        "nested-in-a-list": ('{"order": [{"id": "A", "id": "x"}]}', '{"order": [{"id": "B", "id": "x"}]}'),
        "repeated-vs-plain": ('{"order": {"id": "A", "id": "x"}}', '{"order": {"id": "x"}}'),
        "too-deep": (deep_a % "A", deep_b % "B"),
        "plain-other": ('{"order": {"id": "A"}}', '{"order": {"id": "B"}}'),
        "same": ('{"order": {"id": "A"}}', '{"order": {"id": "A"}}'),
        "same-repeats-reordered": ('{"order": {"id": "A", "id": "x"}}', '{"order": {"id": "x", "id": "A"}}'),
        "same-value-repeated": ('{"order": {"id": "A", "id": "A"}}', '{"order": {"id": "A"}}'),
    }
    done = fakes.chat_response("Done.")
    turns = {model: [raw_call("lookup_order", first), raw_call("refund_order", then), done]
             for model, (first, then) in pairs.items()}
    code, rows = played_cli(tmp_path, suite, turns)
    wrong = ("nested-other-order", "nested-in-a-list", "repeated-vs-plain", "too-deep", "plain-other")
    assert code == 1
    assert rows == {model: ["wrong_tool_order"] if model in wrong else [] for model in pairs}


def test_tool_args_matches_no_call_whose_nested_key_repeats_with_another_value():
    assert regression._arguments_match({"order": {"id": "A"}}, regression._decoded('{"order": {"id": "A"}}'))
    assert not regression._arguments_match({"order": {"id": "A"}},
                                           regression._decoded('{"order": {"id": "B", "id": "A"}}'))
