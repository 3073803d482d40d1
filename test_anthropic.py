"""The native Anthropic provider (--provider anthropic): the Messages API's wire format, its key
and endpoint rules, and runs end to end over a loopback fakes.messages_api that refuses what the
real API refuses (its error bodies, a missing anthropic-version, a conversation out of order).

Fixed inputs that pin an exit code go through the real CLI (fakes.run_script / fakes.cli_table).
"""

import json
import urllib.error

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from fakes import FakeServer, Reply
from testkit import ROOT, clean_env, cli_env, read_record, write_suite  # noqa: F401

Anthropic = regression.AnthropicProvider
KEY = "sk-ant-test-0123456789abcdef"
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string"}},
    "required": ["code"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "Code", "schema": SCHEMA}}


def suite_of(**keys):
    return regression.validate_suite(
        {
            "name": "s",
            "instructions": "Be brief.",
            "cases": [{"id": "c", "input": "hi", "contains": ["ok"]}],
            **keys,
        }
    )


def wire(**keys):
    suite = suite_of(**keys)
    return Anthropic("http://127.0.0.1:9").body("m", suite, suite["cases"][0])


# =============================================================================== the request body


def test_the_body_says_the_instructions_as_system_and_always_caps_the_output():
    body = wire(request={"top_k": 5})
    assert body == {
        "model": "m",
        "max_tokens": regression.MAX_OUTPUT_TOKENS,
        "temperature": 0,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}],
        "top_k": 5,
    }
    assert wire(request={"max_tokens": 64})["max_tokens"] == 64  # the suite's own cap replaces ours
    suite = {**suite_of(), "instructions": ""}
    assert "system" not in Anthropic("http://h").body("m", suite, suite["cases"][0])


@pytest.mark.parametrize(
    "tool, form",
    [
        (
            LOOKUP,
            {
                "name": "lookup_order",
                "description": "Find an order.",
                "input_schema": LOOKUP["function"]["parameters"],
            },
        ),
        (
            {"type": "function", "name": "ping"},
            {"name": "ping", "input_schema": {"type": "object", "properties": {}}},
        ),
        (
            {"type": "function", "function": {"name": "ping", "parameters": None, "strict": True}},
            {"name": "ping", "input_schema": {"type": "object", "properties": {}}, "strict": True},
        ),
    ],
)
def test_function_tools_go_in_the_messages_api_form(tool, form):
    body = wire(tools=[tool, {"type": "web_search"}])
    assert body["tools"] == [form]  # no server-side search on this provider: web_search is not sent
    assert "tool_choice" not in body  # the API's own default is auto


@pytest.mark.parametrize(
    "choice, form",
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ("lookup_order", {"type": "tool", "name": "lookup_order"}),
        (
            {"type": "function", "function": {"name": "lookup_order"}},
            {"type": "tool", "name": "lookup_order"},
        ),
    ],
)
def test_tool_choice_goes_in_the_messages_api_form(choice, form):
    assert wire(tools=[LOOKUP], tool_choice=choice)["tool_choice"] == form


def test_a_json_schema_response_format_goes_as_output_config_format_beside_its_effort():
    body = wire(response_format=FORMAT, request={"output_config": {"effort": "low"}})
    assert body["output_config"] == {
        "effort": "low",
        "format": {"type": "json_schema", "schema": SCHEMA},
    }
    assert "response_format" not in body


def test_a_json_object_response_format_has_no_messages_api_form_and_is_refused_first(
    tmp_path,
):
    suite = write_suite(
        tmp_path / "s.json",
        {
            "name": "s",
            "instructions": "x",
            "response_format": {"type": "json_object"},
            "cases": [{"id": "c", "input": "hi", "contains": ["ok"]}],
        },
    )
    runs = [
        (
            [
                "--provider",
                "anthropic",
                "--base-url",
                "http://127.0.0.1:9",
                "--models",
                "m",
                "--suite",
                suite,
                "--out",
                tmp_path / "run.json",
            ],
            tmp_path,
        ),
        (["--provider", "anthropic", "--models", "m", "--suite", suite, "--dry-run"], tmp_path),
    ]
    for code, out, err in fakes.cli_table(runs, env=cli_env(ANTHROPIC_API_KEY=KEY)):
        assert code == 2 and "output_config.format" in err and "json_schema" in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "run.json").exists()


# ================================================================================== played rounds

ROUND = st.lists(
    st.tuples(
        st.sampled_from(["lookup_order", "refund_order"]),
        st.sampled_from(["ok", {"status": "shipped"}, {"error": "not found"}, None]),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=30, deadline=None)
@given(
    rounds=st.lists(ROUND, min_size=1, max_size=4),
    thinking=st.booleans(),
    text=st.sampled_from(["", "On it."]),
)
def test_played_rounds_are_a_conversation_the_messages_api_accepts(rounds, thinking, text):
    played, expected = [], []
    for number, calls in enumerate(rounds, 1):
        response = fakes.message_response(
            text, tool_uses=[(name, {"order_id": "o1"}) for name, _ in calls]
        )
        if thinking:
            response["content"].insert(
                0, {"type": "thinking", "thinking": "hm", "signature": "c2ln"}
            )
        sent = [
            {
                "call_id": f"toolu_{number}_{n}",
                "name": name,
                "arguments": {"order_id": "o1"},
                "result": result,
                **({"unscripted": True} if result is None else {}),
            }
            for n, (name, result) in enumerate(calls)
        ]
        played.append({"response": response, "tool_results": sent})
        expected += [
            (name, {"order_id": "o1"}, {"error": None} if result is None else result)
            for name, result in calls
        ]
    case = {"id": "c", "input": "refund o1"}
    body = Anthropic("http://h").body("m", {"instructions": "x", "tools": []}, case, played)
    assert (
        fakes.messages_problem(body) is None
    )  # roles alternate, every tool_use answered right after
    user, history = fakes.messages_conversation(body)
    assert user == "refund o1" and [entry[:2] for entry in history] == [
        entry[:2] for entry in expected
    ]
    results = [block for message in body["messages"][2::2] for block in message["content"]]
    assert [block.get("is_error", False) for block in results] == [
        result is None or isinstance(result, dict) and "error" in result
        for _, result in [call for calls in rounds for call in calls]
    ]
    assert all(
        len(message["content"]) == len(calls)
        for message, calls in zip(body["messages"][2::2], rounds)
    )
    if thinking:  # a thinking model needs its signed thinking back before its tool_use blocks
        assert all(
            message["content"][0]["type"] == "thinking" for message in body["messages"][1::2]
        )


# ============================================================================= reading a response


@pytest.mark.parametrize(
    "stop, status",
    [
        ("end_turn", "completed"),
        ("tool_use", "completed"),
        ("stop_sequence", "completed"),
        ("refusal", "completed"),  # graded: a refusal is what the model said
        ("max_tokens", "max_tokens"),
        ("pause_turn", "pause_turn"),
        ("model_context_window_exceeded", "model_context_window_exceeded"),
        (None, "None"),
    ],
)
def test_stop_reason_decides_whether_the_answer_is_whole(stop, status):
    raw = fakes.message_response("ok", [("f", {})] if stop == "tool_use" else (), stop_reason=stop)
    raw["stop_reason"] = stop
    trace = Anthropic.parse(raw)
    assert trace.status == status
    reasons = regression.grade(regression.compile_case(suite_of(), suite_of()["cases"][0]), trace)
    assert ("response_not_completed" in reasons) is (status != "completed")


def test_text_blocks_are_the_answer_tool_use_blocks_the_calls_and_thinking_neither():
    raw = fakes.message_response("Looking it up.", tool_uses=[("lookup_order", {"order_id": "o1"})])
    raw["content"][:0] = [
        {"type": "thinking", "thinking": "the system prompt says", "signature": "s"},
        {"type": "redacted_thinking", "data": "x"},
    ]
    raw["content"].append({"type": "text", "text": " Done."})
    trace = Anthropic.parse(raw)
    assert trace.final_text == "Looking it up. Done." and trace.tool_rounds == 1
    assert trace.tool_calls == [{"name": "lookup_order", "arguments": {"order_id": "o1"}}]
    assert Anthropic.call_ids(raw) == ["toolu_1"] and trace.cost_usd is None
    with pytest.raises(regression.ResponseError):
        Anthropic.parse({"type": "message", "content": None})


def test_error_bodies_are_read_with_their_type_and_a_200_error_is_no_answer():
    body = json.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    ).encode()
    assert Anthropic.said(body) == "overloaded_error: Overloaded"
    assert Anthropic.said(b"upstream timed out") == "upstream timed out"
    assert (
        Anthropic.reply_error({"type": "error", "error": {"type": "api_error", "message": "boom"}})
        == "api_error: boom"
    )
    assert Anthropic.reply_error(fakes.message_response("ok")) is None


def test_the_key_goes_as_x_api_key_beside_the_anthropic_version_header():
    assert Anthropic("https://api.anthropic.com", KEY).headers()["x-api-key"] == KEY
    assert "x-api-key" not in Anthropic("http://127.0.0.1:9").headers()
    assert (
        Anthropic("http://127.0.0.1:9").headers()["anthropic-version"]
        == Anthropic.VERSION
        == "2023-06-01"
    )
    assert Anthropic("http://127.0.0.1:9/").url == "http://127.0.0.1:9/v1/messages"


# ================================================================= keys go only where they belong


class Flags:
    def __init__(self, base_url=None, api_key_env=None):
        self.base_url, self.api_key_env, self.timeout, self.allow_insecure_http = (
            base_url,
            api_key_env,
            5,
            False,
        )
        self.provider = "anthropic"


@pytest.mark.parametrize(
    "flags, env, sent, problem",
    [
        (Flags(), {"ANTHROPIC_API_KEY": KEY}, KEY, None),
        (Flags(), {}, None, "ANTHROPIC_API_KEY is not set"),
        (
            Flags(),
            {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": KEY},
            None,
            None,
        ),
        (Flags("https://api.anthropic.com.evil.example"), {"ANTHROPIC_API_KEY": KEY}, None, None),
        (
            Flags("http://127.0.0.1:9", "MY_PROXY_KEY"),
            {"MY_PROXY_KEY": "proxy-key-123456", "ANTHROPIC_API_KEY": KEY},
            "proxy-key-123456",
            None,
        ),
        (
            Flags("http://proxy.example", "MY_PROXY_KEY"),
            {"MY_PROXY_KEY": "proxy-key-123456"},
            None,
            "plain http",
        ),
        (
            Flags("http://127.0.0.1:9", "UNSET_KEY_VAR"),
            {},
            None,
            "UNSET_KEY_VAR (named by --api-key-env) is not set",
        ),
    ],
)
def test_the_vendor_key_goes_only_to_the_vendors_host_unless_api_key_env_names_one(
    flags, env, sent, problem, capsys
):
    found = regression.provider_problem(flags, env)
    assert (problem in found) if problem else found is None, found
    if problem is None:
        provider, secret = regression.make_provider(flags, env)
        assert secret == sent and provider.headers().get("x-api-key") == sent
        assert (
            KEY in capsys.readouterr().err
        ) is False  # a note may name the variable, never the key


# ======================================================================= end to end over loopback

GUARD = {
    "name": "guard",
    "instructions": "You are a support agent. Answer in one sentence.",
    "cases": [
        {"id": "refund", "input": "Refund window?", "contains": ["30 days"]},
        {
            "id": "card",
            "input": "My card 4111 1111 1111 1111 was charged twice.",
            "excludes": ["4111"],
        },
        {"id": "promise", "input": "Promise my data is safe?", "excludes": ["I promise"]},
    ],
}
ANSWERS = {
    "Refund window?": "Annual plans can be refunded within 30 days.",
    "My card 4111 1111 1111 1111 was charged twice.": "We will refund the duplicate charge.",
    "Promise my data is safe?": "We keep three copies of your data.",
}


def cli(argv, tmp_path, **env):
    return fakes.run_script([str(arg) for arg in argv], tmp_path, cli_env(**env))


def test_a_run_fails_on_an_error_body_resumes_prices_and_replays_without_a_request(tmp_path):
    suite, out, again = (
        write_suite(tmp_path / "guard.json", GUARD),
        tmp_path / "run.json",
        tmp_path / "again.json",
    )
    state = {"overloaded": True}

    def answer(body):
        said = body["messages"][-1]["content"]
        if (
            said.startswith("My card") and state["overloaded"]
        ):  # the error echoes the key: it is masked
            return fakes.messages_error(529, "overloaded_error", f"Overloaded (key {KEY})")
        return fakes.message_response(ANSWERS[said], tokens=(1000, 500))

    argv = [
        "--provider",
        "anthropic",
        "--base-url",
        None,
        "--api-key-env",
        "MY_ANTHROPIC_KEY",
        "--models",
        "claude-test",
        "--suite",
        suite,
        "--price",
        "claude-test=3/15",
    ]
    with FakeServer(fakes.messages_api(answer, key=KEY)) as server:
        argv[3] = server.url
        first = cli([*argv, "--out", out], tmp_path, MY_ANTHROPIC_KEY=KEY)
        assert first.returncode == 2, first.stderr  # the first execution error stops the run
        record = read_record(out)
        assert record["provider"] == {"name": "anthropic", "base_url": server.url}
        done, failed = record["runs"]
        assert done["passed"] and done["cost_usd"] == "0.0105" and done["cost_estimated"] is True
        assert failed["error"] == "HTTPError" and failed["error_status"] == 529
        assert (
            "overloaded_error: Overloaded" in failed["error_message"] and KEY not in out.read_text()
        )
        state["overloaded"] = False
        sent = server.count
        resumed = cli(
            ["--resume", out, "--api-key-env", "MY_ANTHROPIC_KEY"], tmp_path, MY_ANTHROPIC_KEY=KEY
        )
        assert resumed.returncode == 0, resumed.stderr
        assert server.count == sent + 2  # the finished row is never paid for twice
        paid = server.count
        replayed = cli(["--provider", "replay", "--replay", out, "--out", again], tmp_path)
        assert replayed.returncode == 0 and server.count == paid, replayed.stderr
    rows = {row["case_id"]: row for row in read_record(out)["runs"]}
    assert all(row["passed"] and row["cost_estimated"] for row in rows.values())
    assert read_record(out)["summary"]["models"]["claude-test"]["reported_cost_usd"] == "0.0315"
    assert [row["reasons"] for row in read_record(again)["runs"]] == [[], [], []]
    sent = server.requests[0]
    headers = {name.lower(): value for name, value in sent.headers.items()}
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert sent.json["system"] == GUARD["instructions"] and sent.json["messages"] == [
        {"role": "user", "content": "Refund window?"}
    ]


def test_played_tools_go_through_tool_use_and_tool_result_blocks_and_are_graded(tmp_path):
    suite, out = ROOT / "suites" / "agent-trajectories.json", tmp_path / "run.json"
    with FakeServer(fakes.refund_agent()) as server:
        result = cli(
            [
                "--provider",
                "anthropic",
                "--base-url",
                server.url,
                "--models",
                "refund-correct",
                "refund-skips-lookup",
                "--suite",
                suite,
                "--out",
                out,
            ],
            tmp_path,
        )
    assert result.returncode == 1, result.stderr
    rows = {(row["model"], row["case_id"]): row for row in read_record(out)["runs"]}
    assert all(row["passed"] for (model, _), row in rows.items() if model == "refund-correct")
    assert not any(
        row["passed"] for (model, _), row in rows.items() if model == "refund-skips-lookup"
    )
    shipped = rows[("refund-correct", "refund-shipped-order")]
    assert [call["name"] for call in shipped["details"]["tool_calls"]] == [
        "lookup_order",
        "refund_order",
    ]
    assert shipped["rounds"][0]["response"]["content"][0]["type"] == "tool_use"
    assert all(row["error"] is None for row in rows.values())  # the fake refused no conversation


STOPS = {  # input -> (the reply, the reasons it gets)
    "Cut?": (
        fakes.message_response("Annual plans: 30 days, and", stop_reason="max_tokens"),
        ["response_not_completed"],
    ),
    # a refusal is graded as the answer: this one repeats the card, so excludes fails
    "Leak?": (
        fakes.message_response(
            "I can't help with card 4111 1111 1111 1111.", stop_reason="refusal"
        ),
        ["forbidden_text_present"],
    ),
    "Refuse?": (fakes.message_response("I can't help with that.", stop_reason="refusal"), []),
}


def test_a_cut_answer_is_incomplete_and_a_refusal_is_graded(tmp_path):
    suite = write_suite(
        tmp_path / "s.json",
        {
            "name": "s",
            "instructions": "x",
            "cases": [{"id": said, "input": said, "excludes": ["4111"]} for said in STOPS],
        },
    )
    reply = fakes.messages_api(lambda body: STOPS[body["messages"][-1]["content"]][0])
    with FakeServer(reply) as server:
        result = cli(
            [
                "--provider",
                "anthropic",
                "--base-url",
                server.url,
                "--models",
                "m",
                "--suite",
                suite,
                "--out",
                tmp_path / "run.json",
            ],
            tmp_path,
        )
    assert result.returncode == 1, result.stderr
    assert {
        row["case_id"]: row["reasons"] for row in read_record(tmp_path / "run.json")["runs"]
    } == {said: reasons for said, (_, reasons) in STOPS.items()}


def test_the_fake_refuses_a_request_without_anthropic_version_as_the_api_does(tmp_path):
    class NoVersion(Anthropic):
        def headers(self):
            return {
                key: value for key, value in super().headers().items() if key != "anthropic-version"
            }

    suite = suite_of()
    with FakeServer(fakes.messages_api(lambda body: fakes.message_response("ok"))) as server:
        row = regression.run_row(NoVersion(server.url), suite, suite["cases"][0], "m")
        with pytest.raises(urllib.error.HTTPError) as refused:
            NoVersion(server.url).request("m", suite, suite["cases"][0])
    assert (
        row["error_status"] == 400
        and "invalid_request_error: anthropic-version: header is required" in row["error_message"]
    )
    assert refused.value.code == 400


@pytest.mark.parametrize(
    "body, said",
    [
        (
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            "max_tokens: Field required",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": "hi"}]},
            "starting with user",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "'user' or 'assistant'",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                    },
                    {"role": "user", "content": "well?"},
                ],
            },
            "without tool_result blocks",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}],
            },
            "non-empty",
        ),
    ],
)
def test_the_fake_messages_api_refuses_what_the_api_refuses(body, said):
    reply = fakes.messages_api(lambda body: fakes.message_response("ok"))(
        fakes.Request(
            "/v1/messages", {"anthropic-version": "2023-06-01"}, json.dumps(body).encode(), 1
        )
    )
    assert (
        reply.status == 400
        and reply.body["type"] == "error"
        and said in reply.body["error"]["message"]
    )
    assert isinstance(reply, Reply)


@pytest.mark.parametrize("suffix, hinted", [("/v1", True), ("", False)])
def test_a_404_under_a_v1_base_url_says_to_give_it_without_v1(tmp_path, suffix, hinted):
    suite, out = write_suite(tmp_path / "guard.json", GUARD), tmp_path / "run.json"
    missing = {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}}
    with FakeServer(lambda request: Reply(404, missing)) as server:
        argv = ["--provider", "anthropic", "--base-url", server.url + suffix, "--models", "m"]
        result = cli([*argv, "--suite", suite, "--out", out], tmp_path)
    assert result.returncode == 2, result.stderr
    message = read_record(out)["runs"][0]["error_message"]
    assert f"POST {server.url}{suffix}/v1/messages" in message and "Not Found" in message
    assert ("/v1/messages is added to the base URL: give it without /v1" in message) is hinted
