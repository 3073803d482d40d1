"""Conversations and grounding: a case's `turns` (each reply, with its played tool rounds, joins
the conversation before the next user turn; a turn's own checks judge its reply; the case's checks
judge the last reply and every turn's tools), prior history (`messages`, never a system or
developer message), and the behaviour `grounded` (ungrounded_value).

Fixed hostile inputs pin their exit code through the real CLI (fakes.cli_table runs a whole table
in one child process); the logic is tested in-process with parameter tables and hypothesis."""

import datetime
import json

import pytest
from hypothesis import given, settings, strategies as st

import compare_runs
import fakes
import regression
from fakes import FakeServer, Reply
from testkit import ROOT, clean_env, cli_env, read_record, write_suite  # noqa: F401


def tool(name):
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }


ORDER = {"order_id": "ord_21", "status": "shipped", "shipped_on": "2026-11-20", "total": "49.90"}
HISTORY = [
    {"role": "user", "content": "Hello, I bought a lamp."},
    {"role": "assistant", "content": "Hi! How can I help with your order?"},
]
TURNS = [
    {
        "user": "I'd like a refund for my last order.",
        "behaviors": ["require_clarification:order_id", "forbid_tool:refund_order"],
    },
    {"user": "It's ord_21.", "behaviors": ["require_tool:lookup_order"], "contains": ["shipped"]},
    {
        "user": "Actually, don't refund it.",
        "behaviors": ["forbid_tool:refund_order"],
        "contains": ["no refund"],
    },
]
CASE = {
    "id": "refund",
    "messages": HISTORY,
    "turns": TURNS,
    "behaviors": ["grounded"],
    "tool_results": {"lookup_order": ORDER, "refund_order": {"status": "refunded"}},
}


def suite(*cases, **keys):
    return {
        "name": "talk",
        "instructions": "You are a support agent.",
        "tools": [tool("lookup_order"), tool("refund_order")],
        "cases": list(cases or [CASE]),
        **keys,
    }


def careful(user, history):
    """A support agent: asks for the id, looks it up, keeps its word when told not to refund."""
    called = [name for name, _, _ in history]
    if "don't refund" in user:
        return ("text", "Understood: no refund.")
    if "ord_21" in user:
        return (
            ("text", "Order ord_21 shipped on 2026-11-20. Shall I refund it?")
            if "lookup_order" in called
            else ("call", "lookup_order", {"order_id": "ord_21"})
        )
    return ("text", "I can help. What is your order id?")


def eager(user, history):
    """The same agent, but it refunds after the customer withdrew and invents a delivery date."""
    if "don't refund" in user:
        if "refund_order" not in [name for name, _, _ in history]:
            return ("call", "refund_order", {"order_id": "ord_21"})
        return ("text", "<script>x</script> Refund issued | it arrives by 2026-12-01.")
    return careful(user, history)


AGENTS = {"careful": careful, "eager": eager}
EAGER_REASONS = {"ungrounded_value", "missing_required_text", "forbidden_tool_called"}


def users_of(body, api):
    """The user texts of a request, in order, in any of the three wire formats."""
    if api == "agent":
        value = body["input"]
        return (
            [value]
            if isinstance(value, str)
            else [item["content"] for item in value if item.get("role") == "user"]
        )
    said = [
        (
            m["content"]
            if isinstance(m["content"], str)
            else "".join(
                block.get("text", "") for block in m["content"] if block.get("type") == "text"
            )
        )
        for m in body["messages"]
        if m["role"] == "user"
    ]
    return [text for text in said if text]  # a user message of tool results only says nothing


# ======================================================================== through the real CLI
# Every CLI pin of this file runs in three fakes.cli_table calls (one child process each): the runs,
# then what reads their records (resume, reports, replays), then compare_runs.py.


def failing_in_turn_3(state):
    """A chat server whose agent looks the order up again in turn 3, then fails with a 500."""

    def policy(user, history):
        if "don't refund" in user and len(history) < 2:
            return ("call", "lookup_order", {"order_id": "ord_21"})
        return careful(user, history)

    reply = fakes.scripted_chat({"careful": policy})

    def serve(request):
        state["count"] += 1
        return (
            Reply(500, {"error": {"message": "boom"}})
            if state["fail"] == state["count"]
            else reply(request)
        )

    return serve


def issue_agent(user, history):
    """Looks the order up, then announces a ship date and a tracking number."""
    if not history:
        return ("call", "lookup_order", {"order_id": "ord_21"})
    return ("text", "Order ord_21 shipped on 2026-11-20, tracking JD0142.")


def the_runs(folder, path, servers):
    """Table 1: what runs a suite (named runs, in table order)."""

    def openai(name):
        return ["--provider", "openai", "--base-url", servers[name].url + "/v1"]

    models = ["--models", "careful", "eager", "--suite", path]
    issue = {"id": "status", "input": "Where is ord_21?", "behaviors": ["grounded"]}
    masked = {
        "name": "t",
        "instructions": "x",
        "cases": [
            {
                "id": "c",
                "turns": ["mail me at jane.doe@example.com", "thanks"],
                "contains": ["thanks"],
            }
        ],
    }
    runs = {
        "chat": [*models, *openai("chat"), "--out", "chat.json"],
        "messages": [
            *models,
            "--provider",
            "anthropic",
            "--base-url",
            servers["messages"].url,
            "--out",
            "messages.json",
        ],
        "agent": [*models, "--out", "agent.json"],
        "budget": [
            "--suite",
            path,
            "--models",
            "careful",
            *openai("priced"),
            "--max-cost-usd",
            "0.001",
            "--out",
            "budget.json",
        ],
        "failing": [
            "--suite",
            path,
            "--models",
            "careful",
            *openai("failing"),
            "--out",
            "failing.json",
        ],
        "dry": ["--suite", path, "--provider", "echo", "--dry-run"],
        "made_up": [
            "--suite",
            write_suite(
                folder / "bare.json",
                suite({**issue, "tool_results": {"lookup_order": {"status": "shipped"}}}),
            ),
            *openai("issue"),
            "--models",
            "m",
            "--out",
            "made_up.json",
        ],
        "backed": [
            "--suite",
            write_suite(
                folder / "full.json",
                suite({**issue, "tool_results": {"lookup_order": {**ORDER, "tracking": "JD0142"}}}),
            ),
            *openai("issue"),
            "--models",
            "m",
            "--out",
            "backed.json",
        ],
        "masked": [
            "--suite",
            write_suite(folder / "masked.json", masked),
            "--provider",
            "echo",
            "--redact-pii",
            "--out",
            "masked.json.out",
        ],
        **{
            f"bad{n}": [
                "--suite",
                write_suite(folder / f"bad{n}.json", suite({"id": "c", **keys})),
                "--provider",
                "echo",
                "--out",
                f"bad{n}.out",
            ]
            for n, (keys, _) in enumerate(BAD)
        },
    }
    return runs


def the_readers(folder, servers):
    """Table 2: what reads the records of table 1."""
    data = suite()
    changed_turn, changed_history, regraded = (json.loads(json.dumps(data)) for _ in range(3))
    changed_turn["cases"][0]["turns"][1]["user"] = "It is ord_21."
    changed_history["cases"][0]["messages"][1]["content"] = "Hi! What can I do?"
    results = json.loads(json.dumps(data))  # the lookup now answers another ship date
    results["cases"][0]["tool_results"]["lookup_order"]["shipped_on"] = "2026-11-21"
    del regraded["cases"][0]["turns"][2]["contains"]  # a check only: a regrade
    crafted = {
        "config": {"models": ["m"], "cases": [{"id": "c", "turns": [5]}], "repeats": 1},
        "runs": [
            {
                "model": "m",
                "case_id": "c",
                "repeat": 0,
                "passed": False,
                "reasons": ["x"],
                "turns": [5],
            }
        ],
    }
    for name in ("crafted.json", "crafted2.json"):
        (folder / name).write_text(json.dumps(crafted))
    replay = ["--provider", "replay", "--replay", "chat.json", "--suite"]
    tampered = read_record(folder / "masked.json.out")  # a masked row's turn edited afterwards
    tampered["runs"][0]["turns"][0]["reply"] = "thanks"
    (folder / "tampered.json").write_text(json.dumps(tampered))
    return {
        "resume": [
            "--provider",
            "openai",
            "--base-url",
            servers["failing"].url + "/v1",
            "--resume",
            "failing.json",
        ],
        "report": [
            "--report",
            "chat.json",
            "--markdown",
            "r.md",
            "--html",
            "r.html",
            "--junit",
            "r.xml",
        ],
        **{
            name: [
                *replay,
                write_suite(folder / f"{name}.json", value),
                "--out",
                f"{name}.out.json",
            ]
            for name, value in (
                ("turn", changed_turn),
                ("history", changed_history),
                ("regraded", regraded),
                ("results", results),
            )
        },
        "allowed": [*replay, str(folder / "results.json"), "--allow-changed-tool-results",
                    "--out", "allowed.out.json"],
        "crafted": ["--report", "crafted.json", "--markdown", "c.md"],
        "tampered": ["--report", "tampered.json", "--markdown", "t.md"],
    }


COMPARES = {
    "swap": ["--models", "careful", "eager", "chat.json"],
    "matrix": ["--matrix", "--models", "careful", "eager", "chat.json"],
    "regrade": ["chat.json", "regraded.out.json"],
    "crafted_compare": ["crafted.json", "crafted2.json"],
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """{name: (exit code, stdout, stderr)} of every CLI run, the folder they ran in, the servers."""
    folder = tmp_path_factory.mktemp("talk")
    path = write_suite(folder / "talk.json", suite())
    state = {"count": 0, "fail": 5}
    servers = {
        "chat": fakes.scripted_chat(AGENTS),
        "agent": fakes.scripted_agent(AGENTS),
        "messages": fakes.scripted_messages(AGENTS),
        "priced": fakes.scripted_chat(AGENTS, cost=0.001),
        "failing": failing_in_turn_3(state),
        "issue": fakes.scripted_chat({"m": issue_agent}),
    }
    servers = {name: FakeServer(reply).__enter__() for name, reply in servers.items()}
    env = cli_env(
        PERPLEXITY_BASE_URL=servers["agent"].url, PERPLEXITY_API_KEY="pplx-test-0123456789"
    )
    results = {}

    def run(table, script="regression.py"):
        results.update(
            zip(
                table,
                fakes.cli_table(
                    [(argv, folder) for argv in table.values()],
                    env=env,
                    script=script,
                    preload=("regression",),
                ),
            )
        )

    try:
        run(the_runs(folder, path, servers))
        state.update(
            count=0, fail=0, before=len(servers["failing"].requests)
        )  # healthy for the resume
        run(the_readers(folder, servers))
        run(COMPARES, "compare_runs.py")
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)
    return {"results": results, "folder": folder, "servers": servers, "state": state}


@pytest.mark.parametrize("api", ["chat", "messages", "agent"])
def test_a_conversation_runs_turn_by_turn_on_every_wire_format(cli, api):
    code, out, err = cli["results"][api]
    assert code == 1, out + err
    assert "Traceback" not in err
    careful_row, eager_row = read_record(cli["folder"] / f"{api}.json")["runs"]
    assert careful_row["passed"] is True, careful_row["reasons"]
    assert [turn["user"] for turn in careful_row["turns"]] == [turn["user"] for turn in TURNS]
    assert [turn["reply"] for turn in careful_row["turns"]] == [
        "I can help. What is your order id?",
        "Order ord_21 shipped on 2026-11-20. Shall I refund it?",
        "Understood: no refund.",
    ]
    assert [len(turn["rounds"]) for turn in careful_row["turns"]] == [1, 2, 1]
    assert careful_row["turns"][1]["rounds"][0]["tool_results"][0]["result"] == ORDER
    assert careful_row["response"] == careful_row["turns"][2]["rounds"][0]["response"]
    assert careful_row["answer_text"] == "Understood: no refund."
    # the eager agent fails turn 3's own checks, named by turn, and the case's grounding
    assert set(eager_row["reasons"]) == EAGER_REASONS
    assert set(eager_row["verdicts"]) == {
        "grounded",
        "turn 3: contains",
        "turn 3: forbid_tool:refund_order",
    }
    evidence = eager_row["details"]["evidence"]
    assert evidence["forbidden_tool_called"]["note"].startswith("turn 3: called refund_order")
    assert evidence["missing_required_text"]["note"] == 'turn 3: missing "no refund"'
    assert evidence["ungrounded_value"]["values"] == ["2026-12-01"]
    # every request carried the history, then each earlier turn with its reply, in order
    last = [
        request.json
        for request in cli["servers"][api].requests
        if request.json["model"] == "careful"
    ][-1]
    assert users_of(last, api) == [HISTORY[0]["content"], *(turn["user"] for turn in TURNS)]


def test_the_conversation_goes_out_in_each_apis_own_items(cli):
    def last(api):
        return [r.json for r in cli["servers"][api].requests if r.json["model"] == "careful"][-1]

    chat = last("chat")["messages"]
    assert [(m["role"], bool(m.get("tool_calls"))) for m in chat] == [
        ("system", False),
        ("user", False),
        ("assistant", False),
        ("user", False),
        ("assistant", False),
        ("user", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
        ("user", False),
    ]
    assert chat[4]["content"] == "I can help. What is your order id?"
    assert [item.get("role") or item["type"] for item in last("agent")["input"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
    ]
    messages = last("messages")["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant"] * (len(roles) // 2) + [
        "user"
    ]  # alternating, as the API requires
    assert fakes.messages_problem({"model": "m", "max_tokens": 5, "messages": messages}) is None


def test_every_request_of_a_conversation_is_priced_and_counted(cli):
    careful_row = read_record(cli["folder"] / "agent.json")["runs"][0]
    assert careful_row["cost_usd"] == "0.0004"  # four responses at 0.0001
    assert regression.usage_tokens(careful_row) == (40, 80)
    assert regression.row_line(careful_row).count("PASS") == 1


def test_a_dry_run_prints_the_turns_and_what_each_checks(cli):
    code, out, err = cli["results"]["dry"]
    assert code == 0, err
    assert (
        "refund: a conversation of 3 turns after 2 history messages  [checks: completed, grounded]"
        in out
    )
    assert (
        "turn 2: It's ord_21.  [checks: completed, contains, require_tool:lookup_order, "
        "no_final_answer]" in out
    )
    assert (
        "turn 3: Actually, don't refund it.  [checks: completed, contains, forbid_tool:refund_order"
        in out
    )


def test_compare_and_reports_name_the_turn_and_show_the_conversation_escaped(cli):
    swap, matrix = cli["results"]["swap"], cli["results"]["matrix"]
    assert (
        swap[0] == 1 and "forbidden_tool_called[turn 3: forbid_tool:refund_order]" in swap[1]
    ), swap
    assert matrix[0] == 1
    assert any(
        line.split()[:6] == ["refund", "turn", "3:", "forbid_tool:refund_order", "PASS", "FAIL"]
        for line in matrix[1].splitlines()
    ), matrix[1]
    code, out, err = cli["results"]["report"]
    assert code == 0, err
    folder = cli["folder"]
    markdown, page = (folder / "r.md").read_text(), (folder / "r.html").read_text()
    assert (
        "### Conversations of failing rows" in markdown and "turn 3 user: Actually, don" in markdown
    )
    assert "<script>" not in markdown and "<script>" not in page and "&lt;script&gt;" in page
    assert "Refund issued \\| it arrives" in markdown  # a cell's | escaped
    assert "turn 2 reply: Order ord_21 shipped" in (folder / "r.xml").read_text()


def test_replay_regrades_every_turn_without_a_request_and_refuses_a_changed_conversation(cli):
    turn, history, again = (cli["results"][name] for name in ("turn", "history", "regraded"))
    assert (
        turn[0] == 2
        and "careful / refund / repeat 0 is not reproducible" in turn[2]
        and 'turn 2 said "It\'s ord_21."' in turn[2]
        and "restore the suite's turns, messages," in turn[2]
        and "--allow-changed-tool-results" not in turn[2]  # the flag would not help here
    ), turn
    assert history[0] == 2 and "prior history (messages) differs" in history[2], history
    assert len(turn[2].strip().splitlines()) == 1 and "Traceback" not in turn[2] + history[2]
    assert again[0] == 1, again
    careful_row, eager_row = read_record(cli["folder"] / "regraded.out.json")["runs"]
    assert careful_row["passed"] and set(eager_row["reasons"]) == EAGER_REASONS - {
        "missing_required_text"
    }
    assert eager_row["turns"] == read_record(cli["folder"] / "chat.json")["runs"][1]["turns"]
    compared = cli["results"]["regrade"]
    assert compared[0] == 0 and "REGRADE" in compared[1], compared


def test_replay_refuses_a_turns_changed_tool_result_unless_allowed_and_then_grades_the_stored(cli):
    refused, allowed = cli["results"]["results"], cli["results"]["allowed"]
    assert refused[0] == 2 and len(refused[2].strip().splitlines()) == 1, refused
    assert "careful / refund / repeat 0 is not reproducible" in refused[2]
    assert "turn 2: round 1 call lookup_order(" in refused[2] and "2026-11-21" in refused[2]
    assert "or pass --allow-changed-tool-results" in refused[2]
    assert allowed[0] == 1, allowed  # the eager agent still fails; the careful one passes
    careful_row, eager_row = read_record(cli["folder"] / "allowed.out.json")["runs"]
    stored = read_record(cli["folder"] / "chat.json")["runs"]
    assert careful_row["passed"] is True, careful_row["reasons"]  # graded on the stored result
    assert careful_row["turns"] == stored[0]["turns"] and eager_row["turns"] == stored[1]["turns"]


def test_a_failure_in_turn_3_keeps_turns_1_and_2_and_the_partial_turn_3_and_resume_starts_over(cli):
    assert cli["results"]["failing"][0] == 2, cli["results"]["failing"]
    record = read_record(cli["folder"] / "failing.json")
    assert record["resumed"] and record["runs"][0]["passed"] is True  # resumed: the row ran again
    (abandoned,) = record["superseded"]  # the failed attempt stays, with what it spent
    assert abandoned["error"] == "HTTPError" and len(abandoned["turns"]) == 3
    assert cli["results"]["resume"][0] == 0, cli["results"]["resume"]
    sent = [
        request.json for request in cli["servers"]["failing"].requests[cli["state"]["before"] :]
    ]
    assert users_of(sent[0], "chat") == [
        HISTORY[0]["content"],
        TURNS[0]["user"],
    ]  # from its first turn


def test_the_failed_rows_evidence_was_stored_turn_by_turn(tmp_path):
    """The row the failing run stored before its resume, rebuilt in-process on the same server."""
    state = {"count": 0, "fail": 5}
    data = regression.validate_suite(suite())
    with FakeServer(failing_in_turn_3(state)) as server:
        provider = regression.OpenAIProvider(server.url + "/v1")
        row = regression.run_row(provider, data, data["cases"][0], "careful", 0, retries=0)
    assert (row["error"], row["error_status"], row["reasons"]) == (
        "HTTPError",
        500,
        ["execution_error"],
    )
    assert [turn.get("reply") for turn in row["turns"]] == [
        "I can help. What is your order id?",
        "Order ord_21 shipped on 2026-11-20. Shall I refund it?",
        None,
    ]
    assert len(row["turns"][2]["rounds"]) == 1 and row["turns"][2]["rounds"][0]["tool_results"]
    assert row["response"] == row["turns"][2]["rounds"][0]["response"] and row["attempts"] == 5
    assert (
        regression.record_problem(
            {"config": {"models": ["careful"], "cases": [CASE], "repeats": 1}, "runs": [row]}
        )
        is None
    )


def test_the_spending_cap_holds_before_a_later_turn(cli):
    assert cli["results"]["budget"][0] == 2, cli["results"]["budget"]
    (row,) = read_record(cli["folder"] / "budget.json")["runs"]
    assert (
        cli["servers"]["priced"].count == 1
        and len(row["turns"]) == 1
        and row["error"] == "BudgetReached"
    )
    assert row["cost_usd"] == "0.001" and row["error_message"].endswith("round 1 of turn 2")


def test_a_conversations_evidence_is_masked_when_stored(cli):
    assert cli["results"]["masked"][0] == 0, cli["results"]["masked"]
    (row,) = read_record(cli["folder"] / "masked.json.out")["runs"]
    assert "jane.doe@example.com" not in json.dumps(row) and "[REDACTED" in row["turns"][0]["user"]
    code, _, err = cli["results"]["tampered"]  # the digest of a masked row covers its turns
    assert code == 2 and "its verdict_sha256 does not match" in err, err
    assert len(err.strip().splitlines()) == 1 and not (cli["folder"] / "t.md").exists()


def test_a_crafted_conversation_record_is_one_line_and_exit_2(cli):
    code, out, err = cli["results"]["crafted"]
    assert code == 2 and "turns[0] is not an object" in err and "Traceback" not in err, err
    code, out, err = cli["results"]["crafted_compare"]
    assert code == 2 and "NOT_COMPARABLE" in out + err and "turns[0] is not an object" in out + err


# ======================================================================== validation

BAD = [
    (
        {"turns": ["hi", {"user": "x", "contians": ["a"]}]},
        "case 'c' turn 2: unknown key 'contians' (did you mean 'contains'?)",
    ),
    ({"turns": ["hi", {"user": " \u200b"}]}, "case 'c' turn 2: is empty"),
    ({"turns": ["hi", ""]}, "case 'c' turn 2: is empty"),
    (
        {"turns": ["hi", {"user": "x", "rubric": "is polite"}]},
        "case 'c' turn 2: a turn holds no rubric; give it on the case, where the judge grades the "
        "last reply",
    ),
    ({"turns": ["hi", {"user": 7, "contains": ["a"]}]}, "case 'c' turn 2: has no words"),
    ({"turns": ["hi", {"contains": ["a"]}]}, "case 'c' turn 2: has no words"),
    ({"turns": []}, "case 'c': turns must be a non-empty list"),
    ({"turns": "hi"}, "case 'c': turns must be a non-empty list"),
    ({"turns": ["hi"], "input": "x"}, "case 'c': give input or turns, not both"),
    (
        {"input": "x", "messages": [{"role": "system", "content": "Obey me."}]},
        "case 'c': messages message 1 has role 'system', which is refused",
    ),
    (
        {"input": [{"role": "developer", "content": "Obey me."}, {"role": "user", "content": "x"}]},
        "case 'c': input message 1 has role 'developer', which is refused",
    ),
    (
        {
            "input": "x",
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "lookup_order", "arguments": "{}"},
                        }
                    ],
                }
            ],
        },
        "case 'c': messages: tool call c1 has no tool message answering it",
    ),
    (
        {"input": "x", "messages": [{"role": "tool", "tool_call_id": "c9", "content": "{}"}]},
        "case 'c': messages message 1: tool_call_id 'c9' answers no open tool call",
    ),
    (
        {
            "input": "x",
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "cancel_order"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "{}"},
            ],
        },
        "names 'cancel_order', which is not a function tool of this suite",
    ),
    (
        {"input": "x", "messages": [{"role": "user", "content": "hi", "nmae": "x"}]},
        "case 'c': messages message 1: unknown key 'nmae'",
    ),
    (
        {"input": "x", "messages": []},
        "case 'c': messages must be a non-empty list of message objects",
    ),
    (
        {"turns": [{"user": "a", "behaviors": ["forbid_tool:nope"]}]},
        "case 'c' turn 1: behavior 'forbid_tool:nope' names no function tool",
    ),
    ({"turns": [{"user": "a", "tool_results": {}}]}, "case 'c' turn 1: unknown key 'tool_results'"),
    (
        {"turns": [{"user": "a", "min_similarity": 0.5}]},
        "case 'c' turn 1: min_similarity needs an expected_text",
    ),
]


@pytest.mark.parametrize("keys, said", BAD)
def test_each_problem_of_a_conversation_or_history_is_one_line(keys, said):
    with pytest.raises(regression.SuiteError) as raised:
        regression.validate_suite(suite({"id": "c", **keys}))
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_the_validation_lines_reach_the_cli_as_exit_2(cli):
    for n, (_, said) in enumerate(BAD):
        code, out, err = cli["results"][f"bad{n}"]
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (
            cli["folder"] / f"bad{n}.out"
        ).exists()  # nothing was sent, no record left behind


MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "developer", 5, ["user"]])},
    optional={
        "content": st.sampled_from(["hi", "", None, 3, ["x"]]),
        "tool_call_id": st.sampled_from(["c1", "c2", 7]),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.sampled_from(["c1", "c2", ""]),
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": st.sampled_from(["lookup_order", "nope"])}
                    ),
                }
            ),
            max_size=2,
        ),
    },
)


@settings(max_examples=80, deadline=None)
@given(st.lists(MESSAGE, max_size=5))
def test_history_is_accepted_only_without_system_messages_and_with_every_call_answered(messages):
    try:
        regression.validate_suite(suite({"id": "c", "input": "x", "messages": messages}))
    except regression.SuiteError as exc:
        assert "\n" not in str(exc)
        return
    assert messages and all(m["role"] in ("user", "assistant", "tool") for m in messages)
    asked = [call["id"] for m in messages for call in m.get("tool_calls") or ()]
    assert sorted(asked) == sorted(m["tool_call_id"] for m in messages if m["role"] == "tool")


def test_history_goes_out_in_each_apis_own_items():
    data = regression.validate_suite(
        suite(
            {
                "id": "c",
                "input": "And now?",
                "messages": [
                    *HISTORY,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "h1",
                                "type": "function",
                                "function": {
                                    "name": "lookup_order",
                                    "arguments": {"order_id": "o"},
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "h1", "content": '{"status": "late"}'},
                ],
            }
        )
    )
    case = data["cases"][0]
    chat = regression.OpenAIProvider("http://127.0.0.1:9/v1").body("m", data, case)["messages"]
    assert chat[3] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "h1",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": '{"order_id": "o"}'},
            }
        ],
    }
    assert chat[4:] == [
        {"role": "tool", "tool_call_id": "h1", "content": '{"status": "late"}'},
        {"role": "user", "content": "And now?"},
    ]
    agent = regression.PerplexityProvider().body("m", data, case)["input"]
    assert agent[2:] == [
        {
            "type": "function_call",
            "call_id": "h1",
            "name": "lookup_order",
            "arguments": '{"order_id": "o"}',
        },
        {
            "type": "function_call_output",
            "call_id": "h1",
            "name": "lookup_order",
            "output": '{"status": "late"}',
        },
        {"type": "message", "role": "user", "content": "And now?"},
    ]
    messages = regression.AnthropicProvider("http://127.0.0.1:9").body("m", data, case)["messages"]
    assert messages == [  # one role after another: neighbours of one role are one message
        HISTORY[0],
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": HISTORY[1]["content"]},
                {
                    "type": "tool_use",
                    "id": "h1",
                    "name": "lookup_order",
                    "input": {"order_id": "o"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "h1", "content": '{"status": "late"}'},
                {"type": "text", "text": "And now?"},
            ],
        },
    ]
    assert fakes.messages_problem({"model": "m", "max_tokens": 5, "messages": messages}) is None


# ======================================================================== grading a conversation


def echo_row(case, **keys):
    data = regression.validate_suite(suite(case, **keys))
    return regression.run_row(regression.EchoProvider(), data, data["cases"][0], "echo", 0)


def test_each_turns_verdicts_stay_apart_and_every_note_names_its_turn():
    row = echo_row(
        {
            "id": "c",
            "turns": [
                {"user": "one", "contains": ["zzz"]},
                "two",
                {"user": "three", "contains": ["yyy"]},
            ],
            "contains": ["three"],
        }
    )
    assert row["reasons"] == ["missing_required_text"]
    assert row["verdicts"] == {
        "turn 1: contains": ["missing_required_text"],
        "turn 3: contains": ["missing_required_text"],
    }
    assert (
        row["details"]["evidence"]["missing_required_text"]["note"]
        == 'turn 1: missing "zzz"; turn 3: missing "yyy"'
    )
    assert row["answer_text"] == "three" and [turn["reply"] for turn in row["turns"]] == [
        "one",
        "two",
        "three",
    ]


def test_the_cases_own_checks_judge_the_last_reply_and_what_must_not_be_said_in_any_turn():
    row = echo_row(
        {
            "id": "c",
            "turns": ["my card is secret-77", "bye"],
            "contains": ["bye"],
            "excludes": ["secret-77"],
        }
    )
    assert row["reasons"] == ["forbidden_text_present"]  # said in turn 1: a leak is a leak
    passing = echo_row({"id": "c", "turns": ["hello", "bye"], "contains": ["bye"]})
    assert passing["passed"] is True
    last_only = echo_row({"id": "c", "turns": ["hello", "bye"], "contains": ["hello"]})
    assert last_only["reasons"] == ["missing_required_text"]


def test_a_call_written_as_text_in_a_turn_fails_that_turn_and_counts_against_the_case():
    class Writer(regression.OpenAIProvider):
        def request(self, model, suite, case, repeat=0, rounds=()):
            said = '{"name": "refund_order", "arguments": {"order_id": "ord_21"}}'
            return fakes.chat_response(said if case["input"] == "b" else "ok")

    data = regression.validate_suite(
        suite({"id": "c", "turns": ["a", "b", "c"], "behaviors": ["forbid_tool:refund_order"]})
    )
    row = regression.run_row(Writer("http://127.0.0.1:9/v1"), data, data["cases"][0], "m", 0)
    assert set(row["reasons"]) == {"tool_call_as_text", "forbidden_tool_called"}
    assert "turn 2: tool_call_as_text" in row["verdicts"] and len(row["turns"]) == 3


def test_a_turn_still_calling_tools_ends_the_conversation_and_fails_there():
    class Looping(regression.OpenAIProvider):
        def request(self, model, suite, case, repeat=0, rounds=()):
            return fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_21"})])

    data = regression.validate_suite(
        suite(
            {
                "id": "c",
                "turns": ["a", "b"],
                "max_rounds": 2,
                "tool_results": {"lookup_order": ORDER},
            }
        )
    )
    row = regression.run_row(Looping("http://127.0.0.1:9/v1"), data, data["cases"][0], "m", 0)
    assert row["reasons"] == ["no_final_answer"] and len(row["turns"]) == 1
    assert row["verdicts"] == {"turn 1: no_final_answer": ["no_final_answer"]}
    assert row["details"]["evidence"]["no_final_answer"]["note"].startswith(
        "turn 1: still calling tools"
    )


def test_one_deadline_covers_every_turn():
    clock = {"now": 0.0}

    class Slow(regression.EchoProvider):
        deadline = 1.0

        def request(self, model, suite, case, repeat=0, rounds=()):
            clock["now"] += 3.5  # each request takes longer than one turn's share
            return super().request(model, suite, case, repeat, rounds)

    data = regression.validate_suite(suite({"id": "c", "turns": ["a", "b", "c"], "max_rounds": 2}))
    row, provider = {"response": None}, Slow()
    steps = regression.converse_steps(
        provider, data, data["cases"][0], "m", 0, 0, row, clock=lambda: clock["now"]
    )
    with pytest.raises(regression.RowDeadline):
        regression.drive_steps(steps)
    assert clock["now"] == 7.0  # two requests made; each turn alone would have had time left
    assert [turn["user"] for turn in row["turns"]] == ["a", "b", "c"] and row["turns"][2][
        "rounds"
    ] == []


CRAFTED = [
    ([5], "runs[0].turns[0] is not an object"),
    ([{"rounds": []}], "runs[0].turns[0].user is not a string"),
    ([{"user": "x", "rounds": [3]}], "runs[0].turns[0].rounds holds a round that is not an object"),
    ([{"user": "x", "reply": 7}], "runs[0].turns[0].reply is not a string"),
    ({"a": 1}, "runs[0].turns is not a list"),
]


@pytest.mark.parametrize("turns, said", CRAFTED)
def test_a_record_whose_turns_are_not_evidence_is_refused(turns, said):
    record = {
        "config": {"models": ["m"], "cases": [{"id": "c"}], "repeats": 1},
        "runs": [
            {
                "model": "m",
                "case_id": "c",
                "repeat": 0,
                "passed": False,
                "reasons": ["x"],
                "turns": turns,
            }
        ],
    }
    assert regression.record_problem(record) == said


# ======================================================================== grounding


def grounded(given, reply, transcript=True):
    """The reasons of behaviour grounded for a reply after a tool returned `given`."""
    case = {
        "id": "c",
        "behaviors": ["grounded"],
        "_instructions": "Be brief.",
        "input": "Where is my order?",
    }
    events = (("tool", given), ("said", reply)) if transcript else ()
    trace = regression.Trace(
        final_text=reply,
        tool_calls=[],
        tool_rounds=0,
        search_urls=[],
        status="completed",
        cost_usd=None,
        transcript=events,
    )
    return regression.check_grounded(case, trace, None)


SPELLINGS = [  # (what a tool returned, the reply, grounded?)
    ("total 1000", "It costs 1,000.00.", True),
    ("total 1,000", "It costs 1000", True),
    ("total 1000", "It costs 1,001", False),
    ('{"refund": 12.5}', "Your $12.50 refund is on its way.", True),
    ("refund 12.50 USD", "a refund of US$12.5", True),
    ("refund €12.50", "Your $12.50 refund", False),
    ("refund $5", "refund of $6", False),
    ("ships 2026-11-20", "It ships on November 20th, 2026.", True),
    ("ships 2026-11-20", "It ships 20/11/2026.", True),
    ("ships 2026-11-20", "It ships 11/20/26.", True),
    ("ships 2026-11-20", "It ships 20 Nov.", True),
    ("ships 2026-11-20", "It ships Nov 21.", False),
    ("ships Nov 20", "It ships 2026-11-20.", False),  # the year was never given
    ("at 14:30", "pick it up at 2:30 pm", True),
    ("at 14:30", "pick it up at 3:30 pm", False),
    ('{"order_id": "ORD_21"}', "Order ord_21.", True),
    ("tracking TRK9F2", "Tracking: trk9f2!", True),
    ("tracking TRK9F2", "Tracking: TRK9F3.", False),
    ("see https://Track.example:443/TRK1", "See https://track.example/TRK1/.", True),
    ("see https://track.example/TRK1", "See http://track.example/TRK1?x=1", False),
    ("mail Help@Shop.example", "Write to help@shop.example.", True),
    ("mail help@shop.example", "Write to sales@shop.example", False),
    ("phone 5551234567", "Call 555-123-4567.", True),
    ("phone 555-123-4567", "Call 5551234567.", True),
    ('{"id": "ord_21"}', "Your order #21 is late.", True),  # digits inside a given id
    ('{"id": "ord_21"}', "A refund of $21.", False),  # ... never an amount
    ("ships 2026-11-20", "A refund of $20.", False),
    ("ships 2026-11-20", "Shipped in 2026.", True),
    ("", "Please wait 5 minutes.", True),  # one digit is no value
    ("", "Refund within 30 days.", False),
    ("version 1.2.3", "Use 1.2.3", True),
    ("version 1.2.3", "Use 1.2.4", False),
    ("code 007", "code 7", True),
    ("code 007", "code 0007", False),
]


@pytest.mark.parametrize("given_text, reply, ok", SPELLINGS)
def test_the_normal_forms_of_values(given_text, reply, ok):
    assert (grounded(given_text, reply) == []) is ok


DISGUISES = [  # an invented value in a disguise stays a value; copied, it is grounded
    ("48213", "code \u0664\u0668\u0662\u0661\u0663"),  # Arabic-Indic digits
    ("48213", "code \uff14\uff18\uff12\uff11\uff13"),  # fullwidth digits
    ("48213", "code 48\u200b213"),  # a zero-width space inside
    ("48213", "code **48**213"),  # split by markup
    ("48213", "code 48<b></b>213"),  # split by a tag
    ("48213", "code 4 8 2 1 3"),  # spaced digits
    ("TRK9F2", "[track it](https://track.example/TRK9F2)"),  # a link's target
    ("TRK9F2", '{"tracking": "TRK\\u0039F2"}'),  # a JSON answer's escape
]
LOOK_ALIKES = [  # another value drawn like a given one: invented or copied, it is not grounded
    ("A17", "order \u0410\u0031\u0037"),  # a Cyrillic A
    ("TRK9F2", "tracking T\u0336RK9F2"),  # a combining overlay
    ("TRK9F2", "tracking TRK9\u0493\u0032"),  # a Cyrillic f with stroke
    ("ord_21", "order \u1d0f\u0280\u1d05_21"),  # small capitals
]


@pytest.mark.parametrize("value, reply", DISGUISES)
def test_a_disguised_value_is_still_a_value(value, reply):
    (fail,) = grounded("nothing useful here", reply)
    assert fail == "ungrounded_value" and fail.evidence["values"]
    given_text = "https://track.example/TRK9F2" if "https" in reply else value
    assert grounded(given_text, reply) == []


@pytest.mark.parametrize("value, reply", LOOK_ALIKES)
def test_a_look_alike_of_a_given_value_is_not_that_value(value, reply):
    for given_text in ("nothing useful here", value):
        (fail,) = grounded(given_text, reply)
        assert fail == "ungrounded_value" and fail.evidence["values"]
    assert grounded(reply, reply) == []  # given as it is written, it is grounded


def test_the_evidence_lists_each_ungrounded_value_and_what_came_later_never_grounds():
    (fail,) = grounded(
        '{"status": "shipped"}', "Shipped 2026-11-20, tracking TRK1, $12.50, TRK1 again."
    )
    assert fail.evidence["values"] == ["2026-11-20", "$12.50", "trk1"]  # each once, by kind
    assert fail.evidence["note"] == 'not given: "2026-11-20", "$12.50", "trk1"'
    case = {"id": "c", "_instructions": "", "input": "hi"}
    later = regression.Trace(
        final_text="",
        tool_calls=[],
        tool_rounds=0,
        search_urls=[],
        status="completed",
        cost_usd=None,
        transcript=(("said", "Tracking TRK1."), ("tool", "TRK1")),
    )
    assert regression.check_grounded(case, later, None) == ["ungrounded_value"]
    told = regression.Trace(
        final_text="Order ord_21 for jane@x.example",
        tool_calls=[],
        tool_rounds=0,
        search_urls=[],
        status="completed",
        cost_usd=None,
    )
    assert (
        regression.check_grounded(
            {**case, "input": "I am jane@x.example, order ord_21"}, told, None
        )
        == []
    )


def test_a_made_up_value_of_an_earlier_turn_grounds_no_later_reply():
    row = echo_row(
        {"id": "c", "turns": [{"user": "hello"}, {"user": "bye", "behaviors": ["grounded"]}]}
    )
    assert row["passed"] is True
    data = regression.validate_suite(
        suite({"id": "c", "turns": ["hello", {"user": "bye", "behaviors": ["grounded"]}]})
    )
    case = data["cases"][0]
    first = regression.Trace(
        final_text="Your code is X77.",
        tool_calls=[],
        tool_rounds=0,
        search_urls=[],
        status="completed",
        cost_usd=None,
        rounds=1,
        final=True,
        transcript=(("said", "Your code is X77."),),
    )
    second = first._replace(final_text="Again: X77.", transcript=(("said", "Again: X77."),))
    graded = [
        regression.grading(compiled, trace)
        for _, compiled, trace in regression.turn_gradings(data, case, [first, second])
    ]
    assert graded[1].reasons == ["ungrounded_value"]  # its own earlier reply is no ground


NAMES = st.from_regex(r"[A-Z]{2,4}[0-9]{2,5}", fullmatch=True)


def spelled_date(day, form):
    month = day.strftime("%B")
    return [
        f"{month} {day.day}, {day.year}",
        f"{day.day} {month} {day.year}",
        day.strftime("%Y/%m/%d"),
        f"{month[:3]} {day.day}th {day.year}" if day.day in (4, 5, 6, 7, 8, 9) else day.isoformat(),
    ][form]


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["number", "id", "date", "amount"]),
    st.integers(10, 10**9),
    NAMES,
    st.dates(datetime.date(2000, 1, 1), datetime.date(2099, 12, 31)),
    st.integers(0, 3),
    st.sampled_from(["", ".", "!", ")", "**"]),
)
def test_a_value_copied_from_a_tool_result_in_any_spelling_is_grounded_and_a_fresh_one_is_not(
    kind, number, name, day, form, after
):
    result, copied, fresh = {
        "number": (
            json.dumps({"n": number}),
            [f"{number:,}", f"{number}.00", str(number), f"{number:,}.0"][form],
            f"{number + 1:,}",
        ),
        "id": (
            json.dumps({"tracking": name}),
            [name.lower(), name, f"**{name}**", name.title()][form],
            name[:-1] + str((int(name[-1]) + 1) % 10),
        ),
        "date": (
            json.dumps({"on": day.isoformat()}),
            spelled_date(day, form),
            (day + datetime.timedelta(days=1)).isoformat(),
        ),
        "amount": (
            json.dumps({"total": f"{number / 100:.2f}"}),
            [
                f"${number / 100:,.2f}",
                f"{number / 100:.2f} USD",
                f"USD {number / 100:.2f}",
                f"{number / 100:.2f} dollars",
            ][form],
            f"${(number + 1) / 100:,.2f}",
        ),
    }[kind]
    assert grounded(result, f"Here it is: {copied}{after} Thanks.") == []
    assert grounded(result, f"Here it is: {fresh}{after} Thanks.") == ["ungrounded_value"]


def test_the_issue_example_through_the_cli(cli):
    """An agent that looked an order up and announced a ship date and a tracking number no tool
    returned fails; the same reply after the tool returned them passes."""
    made_up, backed = cli["results"]["made_up"], cli["results"]["backed"]
    assert made_up[0] == 1 and "ungrounded_value" in made_up[1], made_up
    row = read_record(cli["folder"] / "made_up.json")["runs"][0]
    assert row["details"]["evidence"]["ungrounded_value"]["values"] == ["2026-11-20", "jd0142"]
    assert backed[0] == 0, backed


def test_the_grounding_rules_are_in_the_check_list():
    text = regression.catalogue()
    assert "grounded" in text and "1,000.00 is 1000" in text and "$12.50 is 12.5 USD" in text
    assert "ungrounded_value" in dict((row[0], row) for row in regression.reason_table())
