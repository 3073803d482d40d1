"""Offline tests for SPEC B3: the perplexity, openai, echo and replay providers.

Everything runs against 127.0.0.1 (fakes.FakeServer) or httpx.MockTransport; keys are
fake strings; every file is written under tmp_path.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import httpx
import pytest

import compare_runs
import fakes
import regression
from testkit import ROOT, SCRUBBED_PREFIXES, clean_env, cli_env, read_record, run_main, write_suite  # noqa: F401
# `python -W error regression.py`, forked from a zygote: no test here is about imports or start-up
from testkit import run_forked as run_cli
from fakes import FakeServer, Reply

SUITES = ROOT / "suites"
AGENT_TOOLS = SUITES / "agent-tools.json"
GUARDRAILS = SUITES / "support-guardrails.json"
SECRET = "sk-test-SECRET123"
OTHER_SECRET = "sk-test-OTHER456"
ASK = "Could you tell me your order ID?"
INVENTED = {"order_id": "ord_99999"}


# ---------------------------------------------------------------------- helpers

def suite_data(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def one_error_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("regression.py: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def has_authorization(request):
    return any(name.lower() == "authorization" for name in request.headers)


def agent_tools_answer(body):
    """A chat model per model name: 'inventor' cancels an invented order, 'asker' asks for the id."""
    if body.get("model") == "inventor":
        return fakes.chat_response(tool_calls=[("cancel_order", INVENTED)])
    return fakes.chat_response(ASK)


def rows_by_key(record):
    return {(row["model"], row["case_id"], row["repeat"]): row for row in record["runs"]}


# ====================================================================== 1. openai end to end

SHAPE_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "Answer", "strict": True,
    "schema": {"type": "object", "properties": {"code": {"type": "string"}},
               "required": ["code"], "additionalProperties": False}}}
LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup_order", "description": "Look up an order by id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}
FLAT_TOOL = {"type": "function", "name": "refund_order", "description": "Refund an order.",
             "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}


def test_openai_request_body_through_real_urllib_subprocess(tmp_path):
    suite = write_suite(tmp_path / "shape.json", {
        "name": "shape", "instructions": "Answer only with JSON holding the status code.",
        "tools": [LOOKUP_TOOL, FLAT_TOOL], "response_format": SHAPE_FORMAT,
        "cases": [{"id": "one", "input": "Response: 429; what is the code?", "expect": {"code": "429"}}]})
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(lambda body: fakes.chat_response('{"code": "429"}'))) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                          "--suite", suite, "--out", out], tmp_path)
    assert result.returncode == 0, result.stderr
    assert server.count == 1
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    body = sent.json
    assert body["model"] == "m"
    assert body["messages"] == [
        {"role": "system", "content": "Answer only with JSON holding the status code."},
        {"role": "user", "content": "Response: 429; what is the code?"}]
    assert body["temperature"] == 0
    assert body["response_format"] == SHAPE_FORMAT
    # function tools in chat form, whether the suite wrote them nested or flat
    assert body["tools"] == [
        LOOKUP_TOOL,
        {"type": "function", "function": {"name": "refund_order", "description": "Refund an order.",
                                          "parameters": FLAT_TOOL["parameters"]}}]
    record = read_record(out)
    (row,) = record["runs"]
    assert row["passed"] is True and row["reasons"] == []
    assert row["answer_text"] == '{"code": "429"}'
    assert record["provider"] == {"name": "openai", "base_url": server.url + "/v1"}


def test_openai_plain_content_graded_by_text_checks(tmp_path):
    answers = {
        "What is the refund window for annual plans?": "Annual plans can be refunded within 30 days of purchase.",
        "How do I reset my password?": "Your password is hunter2, no need to reset.",
    }

    def answer(body):
        return fakes.chat_response(answers.get(body["messages"][-1]["content"], "I cannot help with that."))

    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(answer)) as server:
        code = run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                         "--suite", GUARDRAILS, "--out", out])
    assert code == 1
    assert server.count == 4
    rows = {row["case_id"]: row for row in read_record(out)["runs"]}
    assert rows["refund-policy"]["reasons"] == [] and rows["refund-policy"]["passed"] is True
    assert rows["refund-policy"]["details"]["similarity"] == 1.0
    assert rows["password-reset"]["reasons"] == ["forbidden_text_present"]
    assert rows["password-reset"]["details"]["forbidden_text"] == ["your password is"]
    assert rows["password-reset"]["answer_text"] == answers["How do I reset my password?"]
    assert rows["card-number-not-echoed"]["passed"] is True


def test_openai_tool_calls_graded_by_behaviour_checks(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        code = run_main(["--provider", "openai", "--base-url", server.url + "/v1",
                         "--models", "inventor", "asker", "--suite", AGENT_TOOLS, "--out", out])
    assert code == 1
    assert server.count == 6
    # the suite's tools (already in chat form) are sent as they are
    assert server.requests[0].json["tools"] == suite_data(AGENT_TOOLS)["tools"]
    rows = rows_by_key(read_record(out))
    invented = rows[("inventor", "cancel-without-order-id", 0)]
    assert "forbidden_tool_called" in invented["reasons"]
    assert "invented_field" in invented["reasons"]
    assert invented["passed"] is False and invented["error"] is None
    # the trace's tool calls are recorded: in the details and in the raw response
    assert invented["details"]["tool_calls"] == [{"name": "cancel_order", "arguments": json.dumps(INVENTED)}]
    assert invented["details"]["tool_rounds"] == 1
    assert invented["answer_text"] == ""
    assert invented["response"] == fakes.chat_response(tool_calls=[("cancel_order", INVENTED)])
    asked = rows[("asker", "cancel-without-order-id", 0)]
    assert asked["reasons"] == [] and asked["passed"] is True
    assert asked["answer_text"] == ASK
    assert asked["response"] == fakes.chat_response(ASK)


# ====================================================================== 2. keys

def test_custom_base_url_never_receives_openai_api_key(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "asker",
                          "--suite", AGENT_TOOLS, "--out", out], tmp_path, env=cli_env(OPENAI_API_KEY=SECRET))
    assert result.returncode == 0, result.stderr
    assert server.count == 3
    assert not any(has_authorization(request) for request in server.requests)
    assert not any(SECRET in json.dumps(request.headers) for request in server.requests)
    assert "OPENAI_API_KEY is not sent" in result.stderr
    assert "--api-key-env" in result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert SECRET.encode() not in out.read_bytes()


def test_api_key_env_sends_bearer_of_named_variable(tmp_path):
    out = tmp_path / "run.json"
    env = cli_env(MY_ENDPOINT_KEY=OTHER_SECRET, OPENAI_API_KEY=SECRET)
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "asker",
                          "--api-key-env", "MY_ENDPOINT_KEY", "--suite", AGENT_TOOLS, "--out", out], tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert server.count == 3
    for request in server.requests:
        auth = {name.lower(): value for name, value in request.headers.items()}["authorization"]
        assert auth == f"Bearer {OTHER_SECRET}"
        assert SECRET not in json.dumps(request.headers)
    data = out.read_bytes()
    assert OTHER_SECRET.encode() not in data and SECRET.encode() not in data
    assert b"SECRET" not in data and b"OTHER456" not in data
    assert OTHER_SECRET not in result.stdout + result.stderr


def test_key_echoed_by_the_endpoint_is_masked_in_the_record(tmp_path):
    """The grading sees what the endpoint said; the record never holds the key."""
    def answer(body):
        return fakes.chat_response(f"Could you tell me your order ID? (debug: {OTHER_SECRET})")

    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(answer)) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                          "--api-key-env", "MY_ENDPOINT_KEY", "--suite", AGENT_TOOLS, "--out", out], tmp_path,
                         env=cli_env(MY_ENDPOINT_KEY=OTHER_SECRET))
    assert result.returncode == 0, result.stderr
    assert server.count == 3
    assert OTHER_SECRET.encode() not in out.read_bytes()
    assert OTHER_SECRET not in result.stdout + result.stderr
    rows = read_record(out)["runs"]
    assert all(row["response"]["choices"][0]["message"]["content"].startswith(ASK) for row in rows)


def test_base_url_query_is_kept_after_the_path_and_never_stored(tmp_path):
    """A base URL may carry a query (e.g. ?api-version=...); /chat/completions goes on the path, not into the query."""
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        code = run_main(["--provider", "openai", "--base-url", f"{server.url}/v1?api-version=1&sig={SECRET}",
                         "--models", "asker", "--suite", AGENT_TOOLS, "--out", out])
        paths = [request.path for request in server.requests]
    assert SECRET.encode() not in out.read_bytes()
    assert read_record(out)["provider"]["base_url"] == server.url + "/v1"
    assert paths and all(path.split("?")[0] == "/v1/chat/completions" for path in paths), paths
    assert code == 0


def test_api_key_env_naming_unset_variable_is_usage_error(tmp_path, capsys):
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        code = run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                         "--api-key-env", "UNSET_KEY_VAR", "--suite", AGENT_TOOLS, "--out", out])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert "UNSET_KEY_VAR" in line and "not set" in line
    assert server.count == 0
    assert not out.exists()


def test_openai_without_base_url_is_usage_error(tmp_path):
    out = tmp_path / "run.json"
    result = run_cli(["--provider", "openai", "--models", "m", "--suite", AGENT_TOOLS, "--out", out], tmp_path,
                     env=cli_env(OPENAI_API_KEY=SECRET))
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "--base-url" in line and "OPENAI_BASE_URL" in line
    assert SECRET not in result.stderr + result.stdout
    assert not out.exists()


def test_openai_base_url_environment_variable_works_as_flag(tmp_path, monkeypatch):
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        code = run_main(["--provider", "openai", "--models", "asker", "--suite", AGENT_TOOLS, "--out", out])
    assert code == 0
    assert server.count == 3
    assert all(request.path == "/v1/chat/completions" for request in server.requests)
    assert read_record(out)["provider"] == {"name": "openai", "base_url": server.url + "/v1"}


@pytest.mark.parametrize("argv, needle", [
    (["--provider", "echo", "--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
    (["--provider", "openai", "--models", "m", "--base-url", "ftp://127.0.0.1/v1"], "http(s)"),
    (["--provider", "openai", "--models", "m", "--base-url", "not a url"], "--base-url"),  # whitespace: trust's rule
    (["--provider", "replay"], "--replay"),
    (["--provider", "echo", "--replay", "a.json"], "--replay"),
], ids=["base-url-without-openai", "ftp-base-url", "no-scheme", "replay-without-record", "replay-flag-without-replay"])
def test_provider_set_up_problems_are_usage_errors(tmp_path, capsys, argv, needle):
    out = tmp_path / "run.json"
    assert run_main([*argv, "--suite", AGENT_TOOLS, "--out", out]) == 2
    assert needle in one_error_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("provider", ["echo", "replay"])
def test_exported_openai_base_url_does_not_break_other_providers(tmp_path, monkeypatch, provider):
    """OPENAI_BASE_URL is the twin of --base-url for --provider openai only.

    Users of OpenAI-compatible tools often export it; an offline echo or replay run must
    not fail with "--base-url goes with --provider openai" for a flag nobody passed.
    """
    a = tmp_path / "a.json"
    assert run_main(["--provider", "echo", "--suite", GUARDRAILS, "--out", a]) == 1
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    out = tmp_path / "run.json"
    argv = ["--provider", "echo", "--suite", GUARDRAILS] if provider == "echo" else ["--provider", "replay", "--replay", a]
    assert run_main([*argv, "--out", out]) == 1
    assert read_record(out)["provider"] == {"name": "echo"}


def test_openai_without_models_is_usage_error(tmp_path, capsys):
    out = tmp_path / "run.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        code = run_main(["--provider", "openai", "--base-url", server.url + "/v1",
                         "--suite", AGENT_TOOLS, "--out", out])
    assert code == 2
    assert "--models" in one_error_line(capsys.readouterr().err)
    assert server.count == 0
    assert not out.exists()


def test_unknown_provider_flag_is_usage_error(tmp_path):
    out = tmp_path / "run.json"
    result = run_cli(["--provider", "nope", "--suite", AGENT_TOOLS, "--out", out], tmp_path)
    assert result.returncode == 2
    assert "nope" in one_error_line(result.stderr)
    assert not out.exists()


def test_unknown_provider_from_environment_is_usage_error(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run.json"
    monkeypatch.setenv("REGRESSION_PROVIDER", "nope")
    assert run_main(["--suite", AGENT_TOOLS, "--out", out]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "unknown provider" in line and "nope" in line
    assert not out.exists()


def test_regression_provider_echo_selects_echo_without_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("REGRESSION_PROVIDER", "echo")
    out = tmp_path / "run.json"
    code = run_main(["--suite", GUARDRAILS, "--out", out])
    record = read_record(out)
    assert record["provider"] == {"name": "echo"}
    assert record["evidence"] == "echo"
    assert record["config"]["models"] == ["echo"]
    assert [row["answer_text"] for row in record["runs"]] == [case["input"] for case in suite_data(GUARDRAILS)["cases"]]
    assert code == record["summary"]["exit_code"] == 1


def test_missing_perplexity_key_with_default_provider_is_usage_error(tmp_path):
    result = run_cli(["--suite", AGENT_TOOLS], tmp_path)
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "PERPLEXITY_API_KEY" in line
    assert not (tmp_path / "results.json").exists()
    assert list(tmp_path.iterdir()) == []


def test_missing_perplexity_key_never_builds_a_client(tmp_path, capsys):
    out = tmp_path / "run.json"
    with patch("regression.Perplexity", side_effect=AssertionError("client built without a key")) as client:
        assert run_main(["--suite", AGENT_TOOLS, "--models", "m", "--out", out]) == 2
    assert client.call_count == 0
    assert "PERPLEXITY_API_KEY" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


# ====================================================================== 3. endpoint failures

def fault_run(tmp_path, reply, *extra):
    out = tmp_path / "run.json"
    with FakeServer(reply) as server:
        code = run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m1", "m2",
                         "--suite", AGENT_TOOLS, "--out", out, *extra])
        count = server.count
    record = read_record(out)
    row = record["runs"][0]
    assert row["reasons"] == ["execution_error"], \
        f"an endpoint failure was graded as an answer: {row['answer_text']!r} -> {row['reasons']}"
    assert code == 2
    assert count == 1, "the first execution error must stop the run"
    assert len(record["runs"]) == 1
    assert row["passed"] is False
    assert record["summary"]["exit_code"] == 2
    assert record["summary"]["complete"] is False
    return row


@pytest.mark.parametrize("status", [401, 403, 404, 429, 500, 503])
def test_http_error_status_is_execution_error(tmp_path, status):
    headers = {"Retry-After": "0"} if status == 429 else None
    row = fault_run(tmp_path, fakes.failing(status, headers=headers))
    assert row["error"] == "HTTPError"
    assert row["error_status"] == status
    assert row["response"] is None


def test_hang_past_timeout_is_execution_error(tmp_path):
    started = time.monotonic()
    row = fault_run(tmp_path, lambda request: Reply(body=fakes.chat_response("late"), delay=2), "--timeout", "0.5")
    assert time.monotonic() - started < 1.9, "the client must give up at --timeout, not wait for the reply"
    assert row["error"] == "TimeoutError"
    assert row["error_status"] is None


def test_connection_reset_is_execution_error(tmp_path):
    row = fault_run(tmp_path, lambda request: Reply(fault="reset"))
    # http.client.RemoteDisconnected is a ConnectionResetError; either name is the true class
    assert row["error"] in {"ConnectionResetError", "RemoteDisconnected"}
    assert row["error_status"] is None


@pytest.mark.parametrize("reply, message", [
    (Reply(raw=b"<html>"), "not JSON"),
    (Reply(body=[1, 2]), "not a JSON object"),
    (Reply(body={"foo": 1}), "choices"),
], ids=["not-json", "not-an-object", "no-choices"])
def test_unusable_body_is_execution_error(tmp_path, reply, message):
    row = fault_run(tmp_path, lambda request: reply)
    assert row["error"] == "ResponseError"
    assert message in row["error_message"]
    assert row["response"] == (reply.body if message == "choices" else None)  # an object is kept
    if message == "choices":
        assert row["error_status"] == 200


def test_truncated_body_is_execution_error(tmp_path):
    """Content-Length promises more than arrives before the connection closes."""
    row = fault_run(tmp_path, lambda request: Reply(body=fakes.chat_response("x" * 400), fault="truncate"))
    # A dropped connection is a transient transport failure (retried with --retries), named as such.
    assert row["error"] == "IncompleteRead"
    assert "more expected" in row["error_message"]  # not misreported as "the body is not JSON"


def test_truncated_body_whose_prefix_parses_is_not_an_answer(tmp_path):
    """A body cut short by a dropped connection is an endpoint failure even if what arrived parses.

    The body is a complete JSON object followed by whitespace; the fake server declares the
    full Content-Length, sends half and closes. A client that does not compare what it read
    with Content-Length would grade the half body as the model's answer.
    """
    raw = (json.dumps(fakes.chat_response("fine")) + " " * 600).encode()
    row = fault_run(tmp_path, lambda request: Reply(raw=raw, fault="truncate"))
    assert row["error"] == "IncompleteRead"
    assert row["response"] is None and row["reasons"] == ["execution_error"]


def test_http_error_through_subprocess_exits_2_with_record(tmp_path):
    out = tmp_path / "run.json"
    with FakeServer(fakes.failing(503)) as server:
        result = run_cli(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m1", "m2",
                          "--suite", AGENT_TOOLS, "--out", out], tmp_path)
    assert result.returncode == 2
    assert server.count == 1
    assert "Traceback" not in result.stderr
    (row,) = read_record(out)["runs"]
    assert (row["error"], row["error_status"], row["reasons"]) == ("HTTPError", 503, ["execution_error"])
    assert "ERROR HTTPError 503" in result.stdout


# ====================================================================== 4. perplexity through the real SDK

def sdk_client(handler):
    import perplexity
    return perplexity.Perplexity(api_key="k", base_url="http://127.0.0.1:9",
                                 http_client=httpx.Client(transport=httpx.MockTransport(handler)), max_retries=0)


class AgentEndpoint:
    """An httpx handler answering the Agent API per model; keeps what was sent."""

    def __init__(self, answer):
        self.answer, self.sent = answer, []

    def __call__(self, request):
        body = json.loads(request.content)
        self.sent.append((request, body))
        return httpx.Response(200, json=self.answer(body))


RFC = "https://www.rfc-editor.org/rfc/rfc9110.html"


def agent_answer(body):
    if body["model"] == "inventor":
        return fakes.agent_response("Done, I cancelled it.", urls=[RFC], function_calls=[("cancel_order", INVENTED)])
    return fakes.agent_response(ASK, urls=[RFC])


def test_perplexity_function_calls_map_to_trace_and_fire_behaviour_checks():
    endpoint = AgentEndpoint(agent_answer)
    client = sdk_client(endpoint)
    try:
        provider = regression.PerplexityProvider(client)
        suite = regression.load_suite(str(AGENT_TOOLS))
        case = next(case for case in suite["cases"] if case["id"] == "cancel-without-order-id")
        invented = regression.run_row(provider, suite, case, "inventor", 0)
        asked = regression.run_row(provider, suite, case, "asker", 0)
    finally:
        client.close()
    assert invented["error"] is None, invented.get("error_message")
    assert "forbidden_tool_called" in invented["reasons"]
    assert "invented_field" in invented["reasons"]
    assert invented["details"]["tool_calls"] == [{"name": "cancel_order", "arguments": json.dumps(INVENTED)}]
    assert invented["answer_text"] == "Done, I cancelled it."
    assert invented["cost_usd"] == "0.0012"
    assert invented["response"] == agent_answer({"model": "inventor"})
    assert asked["error"] is None and asked["reasons"] == [] and asked["passed"] is True
    assert asked["response"] == agent_answer({"model": "asker"})

    request, body = endpoint.sent[0]
    assert request.url.path == "/v1/responses"
    assert body["model"] == "inventor"
    assert body["instructions"] == suite["instructions"]
    assert body["input"] == "Cancel my order when you can."
    # chat-style tools become the Agent API's flat form
    expected_tools = [{"type": "function", **tool["function"]} for tool in suite_data(AGENT_TOOLS)["tools"]]
    assert body["tools"] == expected_tools
    assert all("function" not in tool for tool in body["tools"])
    assert body["max_steps"] == regression.MAX_STEPS
    assert body["max_output_tokens"] == regression.MAX_OUTPUT_TOKENS


def test_perplexity_parse_maps_search_results_and_function_calls():
    urls = [RFC, "https://www.rfc-editor.org/rfc/rfc6585.txt"]
    client = sdk_client(lambda request: httpx.Response(200, json=fakes.agent_response(
        "ok", urls=urls, function_calls=[("lookup_order", {"order_id": "ord_21"})])))
    try:
        raw = regression.PerplexityProvider(client).request("m", regression.load_suite(str(AGENT_TOOLS)),
                                                            {"id": "c", "input": "hi"})
    finally:
        client.close()
    trace = regression.PerplexityProvider.parse(raw)
    assert trace.search_urls == urls
    assert trace.tool_calls == [{"name": "lookup_order", "arguments": json.dumps({"order_id": "ord_21"})}]
    assert trace.tool_rounds == 2  # one search round on the server, one round of function calls
    assert trace.final_text == "ok"
    assert trace.status == "completed"


def test_perplexity_sdk_http_error_is_execution_error_with_status():
    client = sdk_client(lambda request: httpx.Response(429, json={"error": {"message": "slow down"}}))
    try:
        suite = regression.load_suite(str(AGENT_TOOLS))
        provider = regression.PerplexityProvider(client)
        row = regression.run_row(provider, suite, suite["cases"][0], "m", 0)
    finally:
        client.close()
    assert row["error"] == "RateLimitError"
    assert row["error_status"] == 429
    assert row["reasons"] == ["execution_error"]


def test_main_builds_perplexity_client_through_patchable_name(tmp_path, monkeypatch):
    import perplexity
    endpoint = AgentEndpoint(agent_answer)
    built, clients = [], []

    def factory(*args, **kwargs):
        built.append((args, kwargs))
        client = perplexity.Perplexity(*args, **{**kwargs, "base_url": "http://127.0.0.1:9",
                                                 "http_client": httpx.Client(transport=httpx.MockTransport(endpoint))})
        clients.append(client)
        return client

    monkeypatch.setenv("PERPLEXITY_API_KEY", SECRET)
    out = tmp_path / "run.json"
    try:
        with patch("regression.Perplexity", side_effect=factory):
            code = run_main(["--suite", AGENT_TOOLS, "--models", "inventor", "asker", "--out", out])
    finally:
        for client in clients:
            client.close()
    assert len(built) == 1
    args, kwargs = built[0]
    assert kwargs.get("api_key") == SECRET
    assert kwargs.get("max_retries") == 0
    assert len(endpoint.sent) == 6
    assert all(request.headers["authorization"] == f"Bearer {SECRET}" for request, _ in endpoint.sent)
    record = read_record(out)
    assert code == record["summary"]["exit_code"] == 1
    # issue 12 item 8: the endpoint is recorded for every provider (here the SDK's default)
    assert record["provider"] == {"name": "perplexity", "base_url": "https://api.perplexity.ai"}
    rows = rows_by_key(record)
    assert {"forbidden_tool_called", "invented_field"} <= set(rows[("inventor", "cancel-without-order-id", 0)]["reasons"])
    assert rows[("asker", "cancel-without-order-id", 0)]["passed"] is True
    assert SECRET.encode() not in out.read_bytes()


# ====================================================================== 5. echo

def test_echo_answers_with_the_input_at_no_cost():
    suite = regression.load_suite(str(GUARDRAILS))
    case = next(case for case in suite["cases"] if case["id"] == "password-reset")
    row = regression.run_row(regression.EchoProvider(), suite, case, "echo", 0)
    assert row["error"] is None
    assert row["answer_text"] == "How do I reset my password?"
    assert row["cost_usd"] == "0"
    assert row["response"]["output_text"] == "How do I reset my password?"
    assert row["reasons"] == [] and row["passed"] is True


def test_echo_of_a_conversation_answers_with_the_last_user_message(tmp_path):
    conversation = [{"role": "user", "content": "first question"},
                    {"role": "assistant", "content": "first answer"},
                    {"role": "user", "content": "the last user message"},
                    {"role": "assistant", "content": "trailing assistant turn"}]
    suite = write_suite(tmp_path / "conv.json", {
        "name": "conv", "instructions": "Be brief.",
        "cases": [{"id": "conv", "input": conversation, "contains": ["last user"]}]})
    out = tmp_path / "run.json"
    assert run_main(["--provider", "echo", "--suite", suite, "--out", out]) == 0
    (row,) = read_record(out)["runs"]
    assert row["answer_text"] == "the last user message"
    assert row["cost_usd"] == "0"
    assert row["reasons"] == []


def test_echo_cli_run_records_every_answer_and_zero_cost(tmp_path):
    out = tmp_path / "run.json"
    result = run_cli(["--provider", "echo", "--suite", GUARDRAILS, "--out", out], tmp_path)
    record = read_record(out)
    assert result.returncode == record["summary"]["exit_code"] == 1
    inputs = {case["id"]: case["input"] for case in suite_data(GUARDRAILS)["cases"]}
    for row in record["runs"]:
        assert row["answer_text"] == inputs[row["case_id"]]
        assert row["cost_usd"] == "0"
        assert row["response"]["output_text"] == inputs[row["case_id"]]
    assert record["summary"]["models"]["echo"]["reported_cost_usd"] == "0"
    reasons = {row["case_id"]: row["reasons"] for row in record["runs"]}
    assert reasons["card-number-not-echoed"] == ["forbidden_text_present"]
    assert reasons["password-reset"] == []


# ====================================================================== 6. replay

def assert_same_grades(a, b):
    rows_a, rows_b = rows_by_key(a), rows_by_key(b)
    assert rows_a.keys() == rows_b.keys()
    assert [regression.row_key(row) for row in a["runs"]] == [regression.row_key(row) for row in b["runs"]]
    for key, row in rows_a.items():
        for field in ("reasons", "passed", "answer_text", "response", "cost_usd", "error"):
            assert rows_b[key][field] == row[field], (key, field)


def test_replay_of_echo_record_round_trips(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run_main(["--provider", "echo", "--suite", GUARDRAILS, "--repeats", "2", "--out", a]) == 1
    # no --suite, --models or --repeats: all three come from A
    result = run_cli(["--provider", "replay", "--replay", a, "--out", b], tmp_path)
    assert result.returncode == 1, result.stderr
    record_a, record_b = read_record(a), read_record(b)
    assert_same_grades(record_a, record_b)
    assert record_b["replayed_from"]["path"] == str(a)
    assert record_b["replayed_from"]["created_at"] == record_a["created_at"]
    assert record_b["config"] == record_a["config"]
    assert record_b["config"]["repeats"] == 2
    assert record_b["evidence"] == record_a["evidence"] == "echo"
    assert record_b["provider"] == record_a["provider"]
    assert compare_runs.compare(regression.load_record(str(a)), regression.load_record(str(b))) == 0
    assert compare_runs.main([str(a), str(b)]) == 0
    # a replay of the replay still answers from the same evidence
    c = tmp_path / "c.json"
    assert run_main(["--provider", "replay", "--replay", b, "--out", c]) == 1
    record_c = read_record(c)
    assert_same_grades(record_a, record_c)
    assert record_c["replayed_from"]["path"] == str(b)
    assert record_c["config"] == record_a["config"]


def test_replay_of_openai_record_round_trips_without_network(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        assert run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "inventor", "asker",
                         "--suite", AGENT_TOOLS, "--out", a]) == 1
        sent = server.count
        assert run_main(["--provider", "replay", "--replay", a, "--suite", AGENT_TOOLS, "--out", b]) == 1
        assert server.count == sent
    record_a, record_b = read_record(a), read_record(b)
    assert_same_grades(record_a, record_b)
    assert record_b["replayed_from"]["path"] == str(a)
    assert record_b["config"] == record_a["config"]
    assert record_b["provider"] == record_a["provider"]
    assert compare_runs.compare(record_a, record_b) == 0


def test_replay_of_run_with_custom_timeout_keeps_config_comparable(tmp_path):
    """timeout_seconds is part of the config (SPEC A8), so replay must take it from A like models and repeats."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        assert run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "asker",
                         "--suite", AGENT_TOOLS, "--timeout", "5", "--out", a]) == 0
    assert run_main(["--provider", "replay", "--replay", a, "--out", b]) == 0
    record_a, record_b = read_record(a), read_record(b)
    assert record_a["config"]["timeout_seconds"] == 5
    assert record_b["config"] == record_a["config"]
    assert compare_runs.compare(record_a, record_b) == 0


def test_replay_with_changed_suite_regrades_without_network(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with FakeServer(fakes.chat(agent_tools_answer)) as server:
        assert run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "asker",
                         "--suite", AGENT_TOOLS, "--out", a]) == 0
        sent = server.count
        changed = suite_data(AGENT_TOOLS)
        changed["cases"][0]["excludes"] = ["order ID"]
        changed_suite = write_suite(tmp_path / "changed.json", changed)
        assert run_main(["--provider", "replay", "--replay", a, "--suite", changed_suite, "--out", b]) == 1
        assert server.count == sent
    rows_a, rows_b = rows_by_key(read_record(a)), rows_by_key(read_record(b))
    key = ("asker", "cancel-without-order-id", 0)
    assert rows_a[key]["reasons"] == []
    assert rows_b[key]["reasons"] == ["forbidden_text_present"]
    assert rows_b[key]["answer_text"] == rows_a[key]["answer_text"] == ASK
    assert rows_b[key]["response"] == rows_a[key]["response"]


def test_replay_missing_model_is_usage_error_before_anything_runs(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run_main(["--provider", "echo", "--suite", GUARDRAILS, "--out", a]) == 1
    capsys.readouterr()
    code = run_main(["--provider", "replay", "--replay", a, "--suite", GUARDRAILS, "--models", "not-in-a", "--out", b])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert "not-in-a" in line
    assert not b.exists()


def test_replay_of_truncated_record_is_usage_error_before_anything_runs(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run_main(["--provider", "echo", "--suite", GUARDRAILS, "--out", a]) == 1
    record = read_record(a)
    dropped = record["runs"].pop()
    a.chmod(0o600)
    a.write_text(json.dumps(record), encoding="utf-8")
    capsys.readouterr()
    code = run_main(["--provider", "replay", "--replay", a, "--suite", GUARDRAILS, "--out", b])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    assert dropped["case_id"] in line
    assert not b.exists()


def test_replay_of_record_with_execution_error_is_usage_error(tmp_path, capsys):
    """A row that errored has no response to replay: refused before anything runs."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with FakeServer(fakes.failing(500)) as server:
        assert run_main(["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
                         "--suite", AGENT_TOOLS, "--out", a]) == 2
    capsys.readouterr()
    assert run_main(["--provider", "replay", "--replay", a, "--out", b]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "no stored response" in line and "cancel-without-order-id" in line
    assert not b.exists()


def test_replay_of_agent_api_record_reproduces_reasons(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    with FakeServer(fakes.advisor(unsafe_payment=True)) as server:
        env = cli_env(PERPLEXITY_BASE_URL=server.url, PERPLEXITY_API_KEY=SECRET)
        live = run_cli(["--out", a], tmp_path, env=env)
        assert live.returncode == 1, live.stderr
        sent = server.count
        assert sent == len(regression.MODELS) * len(regression.CASES)
        assert all(request.headers.get("Authorization") == f"Bearer {SECRET}" for request in server.requests)
        # replay needs neither key nor network, and must not import the SDK (SPEC A1)
        code = ("import sys, regression; code = regression.main(sys.argv[1:]); "
                "assert 'perplexity' not in sys.modules, 'replay imported the SDK'; sys.exit(code)")
        replay = subprocess.run([sys.executable, "-W", "error", "-c", code, "--provider", "replay",
                                 "--replay", str(a), "--out", str(b)], cwd=tmp_path,
                                env=cli_env(PYTHONPATH=str(ROOT)),
                                capture_output=True, text=True, timeout=60)
        assert replay.returncode == 1, replay.stderr
        assert server.count == sent
    record_a, record_b = read_record(a), read_record(b)
    assert SECRET.encode() not in a.read_bytes() and SECRET.encode() not in b.read_bytes()
    assert_same_grades(record_a, record_b)
    failing = {row["case_id"] for row in record_a["runs"] if not row["passed"]}
    assert failing == {"ambiguous-payment"}
    payment = next(row for row in record_b["runs"] if row["case_id"] == "ambiguous-payment")
    assert payment["reasons"] == ["wrong_code", "wrong_next_action"]
    assert record_b["replayed_from"]["path"] == str(a)
    assert record_b["config"] == record_a["config"]
    assert record_b["sdk_version"] == record_a["sdk_version"]
    assert compare_runs.compare(record_a, record_b) == 0


# ====================================================================== 7. raw responses as evidence

def test_openai_raw_response_is_stored_even_when_grading_crashes(tmp_path, monkeypatch):
    body = fakes.chat_response("stored before grading", cost=0.5)

    def crash(case, trace):
        raise RuntimeError("checker bug")

    suite = regression.load_suite(str(AGENT_TOOLS))
    with FakeServer(fakes.chat(lambda request: body)) as server:
        provider = regression.OpenAIProvider(server.url + "/v1", None, timeout=5)
        monkeypatch.setattr(regression, "grading", crash)
        row = regression.run_row(provider, suite, suite["cases"][0], "m", 0)
    assert row["response"] == body
    assert row["answer_text"] == "stored before grading"
    assert row["cost_usd"] == "0.5"
    assert row["error"] == "RuntimeError"
    assert row["reasons"] == ["execution_error"]


@pytest.mark.parametrize("kind", ["openai", "perplexity", "echo", "replay"])
def test_raw_response_is_stored_for_every_provider(kind):
    suite = regression.load_suite(str(AGENT_TOOLS))
    case = suite["cases"][1]
    client = None
    if kind == "perplexity":
        expected = fakes.agent_response("Order ord_21 ships today.", function_calls=[("lookup_order", {"order_id": "ord_21"})])
        client = sdk_client(lambda request: httpx.Response(200, json=expected))
        provider = regression.PerplexityProvider(client)
    elif kind == "echo":
        provider = regression.EchoProvider()
        expected = {"object": "echo", "model": "m", "status": "completed", "output_text": case["input"],
                    "usage": {"cost": {"currency": "USD", "total_cost": 0}}}
    elif kind == "replay":
        expected = fakes.chat_response("from the record")
        record = {"provider": {"name": "openai"}, "runs": [
            {"model": "m", "case_id": case["id"], "repeat": 0, "error": None, "response": expected}]}
        provider = regression.ReplayProvider(record, "a.json")
    if kind == "openai":
        expected = fakes.chat_response("Order ord_21 ships today.")
        with FakeServer(fakes.chat(lambda request: expected)) as server:
            provider = regression.OpenAIProvider(server.url + "/v1", timeout=5)
            row = regression.run_row(provider, suite, case, "m", 0)
    else:
        try:
            row = regression.run_row(provider, suite, case, "m", 0)
        finally:
            if client is not None:
                client.close()
    assert row["error"] is None, row.get("error_message")
    assert isinstance(row["response"], dict)
    assert row["response"] == expected
