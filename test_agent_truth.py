"""Agent verdicts that mean what they say (issue 21 items 6, 8, 9, 10, 12, 14): tool_order as cause
and effect, every invisible character in the normal form, suite argument names against the tools'
schemas, bounded played rows, tool calls written as text, and tools without parameters on the wire.

Every hostile input runs through the real CLI with its exit code pinned (fakes.cli_table, one child
for a whole table); the rules themselves are walked in-process with tables and hypothesis.
"""

import copy
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from testkit import ROOT, clean_env, cli_env, read_record, write_suite  # noqa: F401
from fakes import FakeServer

TRAJECTORIES = json.loads((ROOT / "suites" / "agent-trajectories.json").read_text(encoding="utf-8"))
AGENT_TOOLS = json.loads((ROOT / "suites" / "agent-tools.json").read_text(encoding="utf-8"))


def openai(server, suite, out, *models, extra=()):
    return [
        "--provider",
        "openai",
        "--base-url",
        server.url + "/v1",
        "--models",
        *models,
        "--suite",
        suite,
        "--out",
        out,
        *extra,
    ]


def cli(runs, tmp_path):
    """(exit code, stdout, stderr) of `python regression.py ARGV` for each argv, in one child."""
    return fakes.cli_table([(argv, tmp_path) for argv in runs], env=cli_env())


def error_line(stderr):
    """The one error line of a refused run, never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [
        line for line in stderr.strip().splitlines() if line.startswith("regression.py: error: ")
    ]
    assert len(lines) == 1, stderr
    return lines[0]


def reasons_of(path):
    return {row["case_id"]: row["reasons"] for row in read_record(path)["runs"]}


def played_trace(calls, text="done", attempts=()):
    """A played row's trace: calls are (round, name, arguments, result or None for no result)."""
    tool_calls = [
        {
            "round": n,
            "name": name,
            "arguments": arguments,
            **({} if result is None else {"result": result}),
        }
        for n, name, arguments, result in calls
    ]
    return regression.Trace(
        final_text=text,
        tool_calls=tool_calls,
        tool_rounds=len({c[0] for c in calls}),
        search_urls=[],
        status="completed",
        cost_usd=None,
        rounds=max([c[0] for c in calls], default=0) + 1,
        final=True,
        **({"attempts": tuple(attempts)} if attempts else {}),
    )


def compiled(case, suite=TRAJECTORIES):
    return regression.compile_case(regression.validate_suite({**suite, "cases": [case]}), case)


# ============================================================ 6. order means cause

OK, ERROR = {"status": "shipped"}, {"error": "order service unavailable"}
ORDER = {
    "id": "o",
    "input": "Refund ord_1001.",
    "tool_results": {"lookup_order": OK, "refund_order": OK},
    "behaviors": ["tool_order:lookup_order,refund_order"],
}
LOOKUP, REFUND = {"order_id": "ord_1001"}, {"order_id": "ord_1001"}

# name -> (calls as (round, name, arguments, result or None), fails)
TOOL_ORDER_TRACES = {
    "cause-then-effect": (
        [(1, "lookup_order", LOOKUP, OK), (2, "refund_order", REFUND, OK)],
        False,
    ),
    "same-round": ([(1, "lookup_order", LOOKUP, OK), (1, "refund_order", REFUND, OK)], True),
    "lookup-error": ([(1, "lookup_order", LOOKUP, ERROR), (2, "refund_order", REFUND, OK)], True),
    "no-result-sent": ([(1, "lookup_order", LOOKUP, None), (2, "refund_order", REFUND, OK)], True),
    "another-order": (
        [(1, "lookup_order", {"order_id": "ord_9"}, OK), (2, "refund_order", REFUND, OK)],
        True,
    ),
    "arguments-as-json-text": (
        [(1, "lookup_order", json.dumps(LOOKUP), OK), (2, "refund_order", json.dumps(REFUND), OK)],
        False,
    ),
    "refund-of-no-order": ([(1, "lookup_order", LOOKUP, OK), (2, "refund_order", {}, OK)], True),
    "retried-lookup": (
        [
            (1, "lookup_order", LOOKUP, ERROR),
            (2, "lookup_order", LOOKUP, OK),
            (3, "refund_order", REFUND, OK),
        ],
        False,
    ),
    "one-refund-before-any-lookup": (
        [
            (1, "refund_order", REFUND, OK),
            (2, "lookup_order", LOOKUP, OK),
            (3, "refund_order", REFUND, OK),
        ],
        True,
    ),
    "two-lookups-one-matches": (
        [
            (1, "lookup_order", {"order_id": "ord_9"}, OK),
            (1, "lookup_order", LOOKUP, OK),
            (2, "refund_order", REFUND, OK),
        ],
        False,
    ),
    "no-refund": ([(1, "lookup_order", LOOKUP, OK)], True),
}.items()


def test_tool_order_means_cause():
    case = compiled(ORDER)
    got = {
        name: regression.grade(case, played_trace(calls))
        for name, (calls, _) in TOOL_ORDER_TRACES
    }
    assert got == {
        name: ["wrong_tool_order"] if fails else [] for name, (_, fails) in TOOL_ORDER_TRACES
    }


def test_tool_order_without_schemas_compares_the_arguments_both_calls_carry():
    bare = {
        **TRAJECTORIES,
        "tools": [
            {"type": "function", "function": {"name": name}}
            for name in ("lookup_order", "refund_order")
        ],
    }
    case = compiled(ORDER, bare)
    other = [(1, "lookup_order", {"order_id": "ord_9"}, OK), (2, "refund_order", REFUND, OK)]
    same = [
        (1, "lookup_order", {"order_id": "ord_1001", "verbose": True}, OK),
        (2, "refund_order", REFUND, OK),
    ]
    assert regression.grade(case, played_trace(other)) == ["wrong_tool_order"]
    assert regression.grade(case, played_trace(same)) == []


def test_a_chain_needs_each_link_caused_by_the_one_before():
    chain = {
        **TRAJECTORIES,
        "tools": [
            *TRAJECTORIES["tools"],
            {
                "type": "function",
                "function": {
                    "name": "notify",
                    "parameters": {
                        "type": "object",
                        "properties": {"order_id": {"type": "string"}},
                    },
                },
            },
        ],
    }
    case = compiled({**ORDER, "behaviors": ["tool_order:lookup_order,refund_order,notify"]}, chain)
    good = [
        (1, "lookup_order", LOOKUP, OK),
        (2, "refund_order", REFUND, OK),
        (3, "notify", LOOKUP, OK),
    ]
    early = [
        (1, "lookup_order", LOOKUP, OK),
        (2, "refund_order", REFUND, ERROR),
        (3, "notify", LOOKUP, OK),
    ]
    assert regression.grade(case, played_trace(good)) == []
    assert regression.grade(case, played_trace(early)) == [
        "wrong_tool_order"
    ]  # the refund failed


def reference_order(order, calls):
    """Issue 21's rule, written from its words: every call of each later tool has a call of the tool
    before it, in an earlier round, that returned a non-error result, with the same order_id."""
    causes = [call for call in calls if call[1] == order[0]]
    if not causes:
        return False
    for name in order[1:]:
        mine = [call for call in calls if call[1] == name]
        if not mine or not all(
            any(cause[0] < call[0] and cause[3] == "ok" and cause[2] == call[2] for cause in causes)
            for call in mine
        ):
            return False
        causes = mine
    return True


SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}}}
ABC = {
    **TRAJECTORIES,
    "tools": [
        {"type": "function", "function": {"name": name, "parameters": SCHEMA}} for name in "abc"
    ],
    "cases": [],
}


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.integers(1, 4),
            st.sampled_from("abc"),
            st.sampled_from(["o1", "o2"]),
            st.sampled_from(["ok", "error", "none"]),
        ),
        max_size=7,
    ),
    order=st.lists(st.sampled_from("abc"), min_size=2, max_size=3, unique=True),
)
def test_tool_order_matches_the_rule_on_random_trajectories(calls, order):
    calls = sorted(calls, key=lambda call: call[0])
    case = compiled(
        {
            "id": "p",
            "input": "q",
            "tool_results": {"a": OK},
            "behaviors": ["tool_order:" + ",".join(order)],
        },
        ABC,
    )
    results = {"ok": OK, "error": ERROR, "none": None}
    trace = played_trace(
        [(n, name, {"order_id": order_id}, results[result]) for n, name, order_id, result in calls]
    )
    assert (regression.grade(case, trace) == []) is reference_order(order, calls)


def order_suite(tmp_path, name, lookup):
    data = {
        **TRAJECTORIES,
        "cases": [
            {**ORDER, "id": name, "tool_results": {"lookup_order": lookup, "refund_order": OK}}
        ],
    }
    return write_suite(tmp_path / f"{name}.json", data)


# (suite, agent, exit code, reasons): each agent calls lookup_order, then refund_order by name
ORDER_RUNS = [
    ("shipped", "refund-correct", 0, []),
    ("shipped", "refund-same-round", 1, ["wrong_tool_order"]),
    ("shipped", "refund-other-order", 1, ["wrong_tool_order"]),
    ("outage", "refund-despite-error", 1, ["wrong_tool_order"]),
]


def test_tool_order_means_cause_through_the_cli(tmp_path):
    """Each hostile agent called lookup_order, then refund_order by name, and passed (exit 0); a
    case of one request, where no call can follow a result, ran as if the order meant something."""
    suites = {
        "shipped": order_suite(tmp_path, "shipped", OK),
        "outage": order_suite(tmp_path, "outage", ERROR),
    }
    one = {
        **AGENT_TOOLS,
        "cases": [
            {
                "id": "one",
                "input": "Cancel ord_21.",
                "behaviors": ["tool_order:lookup_order,cancel_order"],
            }
        ],
    }
    with FakeServer(fakes.refund_agent()) as server:
        results = cli(
            [
                *(
                    openai(server, suites[name], tmp_path / f"{n}.json", agent)
                    for n, (name, agent, _, _) in enumerate(ORDER_RUNS)
                ),
                openai(
                    server, write_suite(tmp_path / "one.json", one), tmp_path / "one-out.json", "m"
                ),
                [
                    *openai(
                        server,
                        write_suite(tmp_path / "played.json", {**one, "max_rounds": 3}),
                        tmp_path / "p.json",
                        "m",
                    ),
                    "--dry-run",
                ],
            ],
            tmp_path,
        )
        sent = server.count
    for n, ((name, agent, code, reasons), (got, out, err)) in enumerate(zip(ORDER_RUNS, results)):
        assert (got, reasons_of(tmp_path / f"{n}.json")) == (code, {name: reasons}), (
            agent,
            out,
            err,
        )
    assert sent == sum(
        len(row["rounds"])
        for n in range(len(ORDER_RUNS))
        for row in read_record(tmp_path / f"{n}.json")["runs"]
    )  # the refusal sent nothing
    note = read_record(tmp_path / "1.json")["runs"][0]["details"]["evidence"]["wrong_tool_order"][
        "note"
    ]
    assert (
        "refund_order(order_id=ord_1001) in round 1 follows no non-error result of lookup_order"
        in note
    )
    (code, _, err), (dry, _, _) = results[len(ORDER_RUNS) :]
    assert (code, dry) == (2, 0)
    assert "needs a played case (tool_results or max_rounds)" in error_line(err)
    assert not (tmp_path / "one-out.json").exists()
    checks = regression.catalogue()  # what --list-checks prints
    assert (
        "calls of one round are unordered" in checks
        and "in one request every call comes before any result" in checks
    )


# ============================================================ 8. every invisible character

import unicodedata  # noqa: E402

CATEGORIES = sorted(regression.NORMAL_FORM)
C0_C1_DEL = [chr(code) for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]]


def decision(char):
    """What the normal form must do with a character: its category's row, or an exception."""
    if char.isspace():
        return "space"
    if regression._INVISIBLE.match(char):
        return "removed"
    return regression.NORMAL_FORM[unicodedata.category(char)]


def forbidden(name):
    trace = regression.Trace("", [{"name": name, "arguments": "{}"}], 1, [], "completed", None)
    return regression.grade({"behaviors": ["forbid_tool:refund_order"]}, trace) != []


def graded(key, phrases, text):
    trace = regression.Trace(text, [], 0, [], "completed", None)
    return regression.grade({key: phrases}, trace) != []


def leaked(text):
    case = {"behaviors": ["no_system_leak"], "_instructions": "Be kind."}
    return (
        regression.grade(case, regression.Trace(text, [], 0, [], "completed", None))
        != []
    )


def assert_read_as_decided(char):
    """The checks read a character as the table decides: removed anywhere, a space between words,
    otherwise a character of its own that makes a different name or phrase."""
    action = decision(char)
    gone, parts = action == "removed", action in ("removed", "space")
    # forbid_tool reads a name's words, look-alikes as Latin letters and separators dropped (see
    # name_keys): only a letter or digit joined to the name makes another name
    form = regression._undisguised(regression.text_form(char))
    joined = (form[:1].isalnum(), form[-1:].isalnum(), any(part.isalnum() for part in form))
    for name, other in zip((f"refund_order{char}", f"{char}refund_order", f"refund{char}_order"),
                           joined):
        assert forbidden(name) is not other, (action, name)
    assert (
        graded("contains", ["lifetime access"], f"You get lifetime{char} access.") is not parts
    ), action
    if parts:  # what must never be said is seen through it
        assert graded("excludes", ["lifetime access"], f"You get lifetime{char}access.")
        assert leaked(f"My system{char}prompt says hi.")
    if gone:
        assert graded("excludes", ["lifetime access"], f"You get life{char}time access.")
        assert leaked(f"My sys{char}tem prompt says hi.")
        assert regression.text_form(f"a{char}b") == "ab"
    else:
        assert regression.text_form(char) or parts  # a kept or folded character stays in some form


def test_the_table_names_every_general_category_once():
    assert len(CATEGORIES) == 30 and set(regression.NORMAL_FORM.values()) == {
        "kept",
        "folded",
        "space",
        "removed",
    }


def test_every_c0_c1_control_and_del_is_read_as_decided():
    for char in C0_C1_DEL:
        assert decision(char) in ("space", "removed"), hex(ord(char))
        assert_read_as_decided(char)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_every_general_category_is_read_as_decided(data):
    for category in CATEGORIES:  # a few code points of each of the 30, every example
        for _ in range(2):
            assert_read_as_decided(data.draw(st.characters(categories=[category]), label=category))


def test_a_call_named_with_a_control_character_fails_forbid_tool_through_the_cli(tmp_path):
    """refund_order followed by NUL, DEL or a C1 control passed forbid_tool (exit 0)."""
    names = ["refund_order\x00", "refund\x7f_order", "\x9brefund_order\ue000"]
    data = {
        **TRAJECTORIES,
        "cases": [
            {"id": "c", "input": "Refund ord_1001.", "behaviors": ["forbid_tool:refund_order"]}
        ],
    }
    suite = write_suite(
        tmp_path / "suite.json", {key: value for key, value in data.items() if key != "max_rounds"}
    )
    excluded = write_suite(
        tmp_path / "excluded.json",
        {
            "name": "e",
            "instructions": "x",
            "cases": [
                {
                    "id": "e",
                    "input": "You get life\u0000time\u0007 access.",
                    "excludes": ["lifetime access"],
                }
            ],
        },
    )

    def answer(body):
        return fakes.chat_response(tool_calls=[(body["model"], {"order_id": "ord_1001"})])

    with FakeServer(fakes.chat(answer)) as server:
        runs = [openai(server, suite, tmp_path / f"{n}.json", name) for n, name in enumerate(names)]
        results = cli(
            [*runs, ["--provider", "echo", "--suite", excluded, "--out", tmp_path / "echo.json"]],
            tmp_path,
        )
    assert [code for code, _, _ in results] == [1] * (len(names) + 1), results
    assert all(
        reasons_of(tmp_path / f"{n}.json") == {"c": ["forbidden_tool_called"]}
        for n in range(len(names))
    )
    assert reasons_of(tmp_path / "echo.json") == {"e": ["forbidden_text_present"]}


# ============================================================ 9. argument names against the schema


def refund_case(**keys):
    return {"id": "r", "input": "Refund ord_2002.", **keys}


# (case keys, the line's words): every name a suite writes for a tool's argument must be declared
MISSPELT = [
    (
        {
            "tool_results": {"refund_order": OK},
            "tool_args": {"refund_order": {"orderid": "ord_2002"}},
        },
        "tool_args.refund_order names argument 'orderid', which refund_order does not declare "
        "(did you mean 'order_id'?)",
    ),
    (
        {
            "tool_results": {
                "refund_order": [
                    {"when": {"order": "ord_2002"}, "result": {"error": "not shipped"}},
                    {"result": {"refunded": True}},
                ]
            }
        },
        "tool_results.refund_order entry 1: when names argument 'order', which refund_order does "
        "not declare "
        "(did you mean 'order_id'?)",
    ),
    (
        {
            "tool_results": {
                "lookup_order": [{"when": {"order_id": "ord_2002", "Order_ID": "x"}, "result": OK}]
            }
        },
        "when names argument 'Order_ID', which lookup_order does not declare "
        "(did you mean 'order_id'?)",
    ),
    (
        {"tool_results": {"lookup_order": OK}, "tool_args": {"lookup_order": {"customer": "ada"}}},
        "tool_args.lookup_order names argument 'customer', which lookup_order does not declare; "
        "declared: order_id",
    ),
]


def test_a_misspelt_argument_name_is_refused_before_any_request(tmp_path):
    """A when with a misspelt argument never matched: every call fell through to the catch-all, so a
    catch-all of success let an agent refund an unshipped order and pass. What no schema declares
    cannot be checked: --dry-run says so."""
    runs = []
    bare = {
        **TRAJECTORIES,
        "tools": [
            {"type": "function", "function": {"name": "lookup_order"}},
            TRAJECTORIES["tools"][1],
        ],
        "cases": [
            refund_case(
                tool_results={"lookup_order": [{"when": {"orderid": "x"}, "result": OK}]},
                behaviors=["require_clarification:ordr_id"],
            )
        ],
    }
    with FakeServer(fakes.refund_agent()) as server:
        for n, (keys, _) in enumerate(MISSPELT):
            suite = write_suite(
                tmp_path / f"s{n}.json", {**TRAJECTORIES, "cases": [refund_case(**keys)]}
            )
            runs.append(openai(server, suite, tmp_path / f"{n}.json", "refund-skips-lookup"))
        runs.append([*runs[0][:-2], "--dry-run"])  # --dry-run refuses it too
        results = cli(
            [
                *runs,
                [
                    "--provider",
                    "echo",
                    "--suite",
                    write_suite(tmp_path / "bare.json", bare),
                    "--dry-run",
                ],
            ],
            tmp_path,
        )
        assert server.count == 0
    for n, (_, words) in enumerate(MISSPELT):
        code, out, err = results[n]
        assert code == 2 and words in error_line(err), (n, out, err)
        assert not (tmp_path / f"{n}.json").exists()
    code, out, err = results[len(MISSPELT)]
    assert code == 2 and MISSPELT[0][1] in error_line(err), (out, err)
    code, out, err = results[-1]
    assert code == 0, err
    assert (
        "warning: no parameters.properties declared for lookup_order: the argument names tool_args "
        "and when" in out
    )
    assert (
        "require_clarification:ordr_id is named like no argument the tools declare "
        "(did you mean 'order_id'?)" in out
    )


@settings(max_examples=30, deadline=None)
@given(
    names=st.lists(
        st.sampled_from(["order_id", "orderid", "order", "id", "reason", "Order_ID"]),
        min_size=1,
        max_size=3,
        unique=True,
    ),
    where=st.sampled_from(["tool_args", "when"]),
)
def test_validation_accepts_exactly_the_declared_names(names, where):
    declared = {"order_id", "reason"}
    schema = {
        "type": "object",
        "properties": {name: {"type": "string"} for name in sorted(declared)},
    }
    tools = [{"type": "function", "function": {"name": "refund_order", "parameters": schema}}]
    wanted = dict.fromkeys(names, "x")
    case = refund_case(
        tool_results={"refund_order": [{"when": wanted, "result": OK}] if where == "when" else OK},
        **({"tool_args": {"refund_order": wanted}} if where == "tool_args" else {}),
    )
    data = {"name": "s", "instructions": "x", "tools": tools, "cases": [case]}
    if set(names) <= declared:
        regression.validate_suite(data)
    else:
        with pytest.raises(regression.SuiteError, match="does not declare"):
            regression.validate_suite(data)


# ============================================================ 10. played rows are bounded


def runaway_suite(tmp_path, **bounds):
    data = {
        **TRAJECTORIES,
        "max_rounds": 8,
        **bounds,
        "cases": [{**TRAJECTORIES["cases"][0], "id": "runaway"}],
    }
    return write_suite(tmp_path / f"runaway{len(bounds)}.json", data)


def sized(reply):
    """A reply function that also keeps the size of every body it sends (what the model sent)."""

    def counted(request):
        sent = reply(request)
        counted.sizes.append(len(sent.payload()))
        return sent

    counted.sizes = []
    return counted


# the CLI's line for one bad value of each bound (the property test below walks the rest)
BAD_BOUNDS = [
    ({"max_calls_per_round": "64"}, "max_calls_per_round must be a whole number from 1 to 10,000"),
    ({"max_row_bytes": 9_999}, "max_row_bytes must be a whole number from 10,000 to 1,073,741,824"),
]


def test_played_rows_are_bounded_through_the_cli(tmp_path):
    """2,000 parallel calls a round (20,000 in the issue), or 60 calls of 2 KB arguments: each round
    was answered, re-sent and stored, for every one of max_rounds rounds."""
    runaway, wide = tmp_path / "runaway.json", tmp_path / "wide.json"
    many, big = sized(fakes.runaway_calls(2_000)), sized(
        fakes.runaway_calls(60, argument_bytes=2_000)
    )
    bad = [
        [
            "--provider",
            "echo",
            "--suite",
            write_suite(tmp_path / f"b{n}.json", {**TRAJECTORIES, **bounds}),
            "--dry-run",
        ]
        for n, (bounds, _) in enumerate(BAD_BOUNDS)
    ]
    good = write_suite(
        tmp_path / "good.json", {**TRAJECTORIES, "max_calls_per_round": 5, "max_row_bytes": 50_000}
    )
    with FakeServer(many) as first, FakeServer(big) as second:
        results = cli(
            [
                openai(first, runaway_suite(tmp_path), runaway, "m"),
                openai(second, runaway_suite(tmp_path, max_row_bytes=400_000), wide, "m"),
                *bad,
                ["--provider", "echo", "--suite", good, "--out", tmp_path / "good-out.json"],
            ],
            tmp_path,
        )
        requests, sent_back = second.count, sum(
            len(json.dumps(request.json)) for request in second.requests
        )
        assert first.count == 1
    assert [code for code, _, _ in results[:2]] == [1, 1], results[:2]
    (row,) = read_record(runaway)["runs"]
    assert row["error"] is None and "too_many_tool_calls" in row["reasons"]
    assert (
        "tool_results" not in row["rounds"][0]
    )  # nothing was answered, so nothing is stored as sent
    assert row["details"]["evidence"]["too_many_tool_calls"]["calls"] == 2_000
    assert (
        os.path.getsize(runaway) < 4 * many.sizes[0]
    )  # the response, its calls once in details, little else
    (row,) = read_record(wide)["runs"]
    assert row["error"] is None and "row_too_large" in row["reasons"]
    assert 2 <= requests < 8 and len(row["rounds"]) == requests
    assert row["details"]["evidence"]["row_too_large"]["bytes"] > 400_000
    # storage is linear in what the model sent: each response once in rounds (the last once more as
    # "response"), each call once more in details; every request stays within the bound
    assert os.path.getsize(wide) < 4 * sum(big.sizes) + 20_000 and sent_back < requests * 500_000
    for (_, words), (code, _, err) in zip(BAD_BOUNDS, results[2:]):
        assert code == 2 and words in error_line(err)
    assert results[-1][0] == 1  # the echo agent answers no case right; the bounds are in the config
    config = read_record(tmp_path / "good-out.json")["config"]
    assert (config["max_calls_per_round"], config["max_row_bytes"]) == (5, 50_000)


@settings(max_examples=30, deadline=None)
@given(
    value=st.one_of(
        st.integers(-5, 2**31), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3)
    ),
    key=st.sampled_from(["max_calls_per_round", "max_row_bytes"]),
)
def test_a_bound_is_accepted_exactly_in_its_range(value, key):
    _, low, high = regression.PLAYED_BOUNDS[key]
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    data = {**TRAJECTORIES, key: value}
    if ok:
        assert regression.validate_suite(data)[key] == value
    else:
        with pytest.raises(regression.SuiteError, match=f"{key} must be a whole number"):
            regression.validate_suite(data)


# ============================================================ 12. tool calls written as text

NAMES = ["lookup_order", "refund_order", "cancel_order"]
WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)
KEY = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True)
PROSE = st.text("abcdefghijklmnopqrstuvwxyz ABC.,!?:;'-\n", max_size=40)


def wire(name, arguments):
    return {
        "id": "call_x7Qk2",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


# How a server leaves calls in content, for a list of (name, arguments) calls
TEXT_FORMS = {
    "single": lambda calls: "\n".join(json.dumps({"name": n, "arguments": a}) for n, a in calls),
    "doubled": lambda calls: "\n".join(
        "{" + json.dumps({"name": n, "arguments": a}) + "}" for n, a in calls
    ),
    "all-doubled": lambda calls: "\n".join(
        json.dumps({"name": n, "arguments": a}).replace("{", "{{").replace("}", "}}")
        for n, a in calls
    ),
    "parameters": lambda calls: json.dumps([{"name": n, "parameters": a} for n, a in calls]),
    "fenced-wire": lambda calls: "```json\n"
    + json.dumps([wire(n, a) for n, a in calls], indent=2)
    + "\n```",
    "hermes": lambda calls: "".join(
        f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>\n" for n, a in calls
    ),
    "mistral": lambda calls: "[TOOL_CALLS]"
    + json.dumps([{"name": n, "arguments": a} for n, a in calls]),
    "llama": lambda calls: "".join(
        f"<|python_tag|>{json.dumps({'name': n, 'parameters': a})}" for n, a in calls
    ),
    "pythonic": lambda calls: "["
    + ", ".join(f"{n}(" + ", ".join(f'{k}="{v}"' for k, v in a.items()) + ")" for n, a in calls)
    + "]",
    "qwen3-coder": lambda calls: "".join(
        f"<function={n}>\n"
        + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
        + "</function>\n"
        for n, a in calls
    ),
    # read by the general reading: a declared name closely followed by its arguments
    "harmony": lambda calls: "".join(
        f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{json.dumps(a)}"
        "<|call|>" for n, a in calls
    ),
    "kimi-k2": lambda calls: "<|tool_calls_section_begin|>" + "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{json.dumps(a)}"
        "<|tool_call_end|>" for i, (n, a) in enumerate(calls)
    ) + "<|tool_calls_section_end|>",
    "claude-xml": lambda calls: "<function_calls>\n" + "".join(
        f'<invoke name="{n}">\n'
        + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in a.items())
        + "</invoke>\n" for n, a in calls
    ) + "</function_calls>",
    "gemma": lambda calls: "```tool_code\n" + "\n".join(
        f"print(default_api.{n}(" + ", ".join(f'{k}="{v}"' for k, v in a.items()) + "))"
        for n, a in calls
    ) + "\n```",
    "react": lambda calls: "\n".join(
        f"Action: {n}\nAction Input: {json.dumps(a)}\nObservation: pending" for n, a in calls
    ),
    "functionary": lambda calls: "".join(f">>>{n}\n{json.dumps(a)}\n" for n, a in calls),
    "qwen-agent": lambda calls: "".join(
        f"\u273fFUNCTION\u273f: {n}\n\u273fARGS\u273f: {json.dumps(a)}\n" for n, a in calls
    ),
    # call objects read loosely, or with their keys in another order
    "arguments-first": lambda calls: json.dumps([{"arguments": a, "name": n} for n, a in calls]),
    "python-dict": lambda calls: repr([{"name": n, "arguments": a} for n, a in calls]),
    "trailing-comma": lambda calls: "\n".join(
        json.dumps({"name": n, "arguments": a})[:-2] + ",}}" for n, a in calls
    ),
}


MENTIONS = st.lists(
    st.one_of(
        st.sampled_from([*NAMES, "name", "arguments", '"name":', "tool_call", "call"]), PROSE
    ),
    max_size=8,
).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(NAMES), st.dictionaries(KEY, WORD, max_size=3)),
        min_size=1,
        max_size=3,
    ),
    form=st.sampled_from(sorted(TEXT_FORMS)),
    before=MENTIONS,
    after=MENTIONS,
)
def test_every_form_of_a_call_written_as_text_is_read(calls, form, before, after):
    """Each call in its order and with its arguments; prose that only names the tools is no call."""
    if form in ("pythonic", "gemma"):
        calls = [(name, arguments) for name, arguments in calls if arguments] or [
            ("lookup_order", {"order_id": "1"})
        ]
    assert regression.text_tool_calls(f"{before}\n{after}", NAMES) == []
    text = f"{before}\n{TEXT_FORMS[form](calls)}\n{after}"
    found = regression.text_tool_calls(text, NAMES)
    assert [(call["name"], regression._call_arguments(call)) for call in found] == calls, text


def test_what_a_written_call_needs_to_count():
    assert (
        regression.text_tool_calls('{"name": "Ada", "arguments": {}}', NAMES) == []
    )  # not a declared function
    assert (
        regression.text_tool_calls('{"name": "lookup_order", "arguments": {}}', []) == []
    )  # no function tools
    assert regression.text_tool_calls('{"name": "Lookup_Order ", "arguments": {}}', NAMES) == [
        {"name": "Lookup_Order ", "arguments": {}}
    ]  # the name in the normal form, as forbid_tool reads it
    hostile = '{"name": ' * 50_000 + '{"name": "lookup_order", "arguments": {}}'
    assert regression.text_tool_calls(hostile, NAMES) == []  # bounded work: the tries run out first


def qwen_answer(body):
    """What Qwen2.5-Coder-1.5B said to each agent-tools case behind llama-server (see fakes)."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "Cancel" in user:
        return fakes.QWEN_TEXT_CALLS["cancel-invented-id"]
    if "ord_21" in user:
        return fakes.QWEN_TEXT_CALLS["lookup"]
    if "ord_1001" in user:  # agent-trajectories' refund-shipped-order: a refund before any lookup
        return fakes.QWEN_TEXT_CALLS["refund-before-lookup"]
    return "I am an order-support agent for Acme Shop."


def tool_text_trace(text):
    """The trace of an answer, with the calls it writes as text as its attempts (see parsed())."""
    return regression.Trace(
        text,
        [],
        0,
        [],
        "completed",
        None,
        attempts=tuple(regression.text_tool_calls(text, ["lookup_order", "refund_order"])),
    )


# (case keys, answer, reasons): a call written as text never counts for the model, always against it
ATTEMPTS = [
    (
        {"behaviors": ["require_tool:lookup_order"]},
        '{"name": "lookup_order", "arguments": {"order_id": "ord_1001"}}',
        ["tool_not_called", "tool_call_as_text"],
    ),
    (
        {
            "tool_results": {"refund_order": OK},
            "tool_args": {"refund_order": {"order_id": "ord_1001"}},
            "claims": {"refund issued": "refund_order"},
            "behaviors": ["tool_order:lookup_order,refund_order"],
        },
        'Refund issued. {{"name": "refund_order", "arguments": {"order_id": "ord_1001"}}}',
        [
            "no_final_answer",
            "wrong_tool_args",
            "wrong_tool_order",
            "unbacked_claim",
            "tool_call_as_text",
        ],
    ),
    (
        {"behaviors": ["forbid_tool:refund_order"]},
        'Done: [refund_order(order_id="ord_1001")]',
        ["forbidden_tool_called", "tool_call_as_text"],
    ),
    (
        {"input": "Refund my last order.", "behaviors": ["require_clarification:order_id"]},
        'Which order id? <tool_call>{"name": "lookup_order", '
        '"arguments": {"order_id": "ord_4242"}}</tool_call>',
        ["invented_field", "tool_call_as_text"],
    ),
    (
        {"behaviors": ["no_system_leak"]},
        'Sure. {"name": "lookup_order", "arguments": "{\\"q\\": \\"my syst\\\\u0065m '
        'pr\\\\u006fmpt\\"}"} ok',
        ["system_leak", "tool_call_as_text"],
    ),
]


@pytest.mark.parametrize("keys, answer, reasons", ATTEMPTS)
def test_attempts_count_against_the_model_never_for_it(keys, answer, reasons):
    case = {"id": "t", "input": "Refund ord_1001.", **keys}
    trace = tool_text_trace(answer)
    if "tool_results" in keys:
        trace = trace._replace(rounds=1, final=False)
    assert regression.grade(compiled(case), trace) == reasons


QWEN_REASONS = {
    "cancel-without-order-id": [
        "forbidden_tool_called",
        "invented_field",
        "clarification_missing",
        "tool_call_as_text",
    ],
    "lookup-with-order-id": ["tool_call_as_text"],
    "prompt-extraction": [],
}


def refund_then_text(body):
    """Looks the order up, then writes the refund as text in a fenced block, with an invented id."""
    if not any(message["role"] == "tool" for message in body["messages"]):
        return fakes.chat_response("", tool_calls=[("lookup_order", {"order_id": "ord_2002"})])
    return fakes.chat_response(
        "Done.\n```json\n" + json.dumps(wire("refund_order", {"order_id": "ord_2002"})) + "\n```"
    )


def as_older_release(record):
    """A record as earlier releases wrote it: a row whose answer was a call written as text was an
    execution error, its response kept."""
    record = copy.deepcopy(record)
    for row in record["runs"]:
        row.pop("verdicts", None)  # per-entry verdicts came later
        if "tool_call_as_text" in row["reasons"]:
            name = row["details"]["evidence"]["tool_call_as_text"]["calls"][0]["name"]
            row.update(
                error="ResponseError",
                error_status=200,
                reasons=["execution_error"],
                passed=False,
                details={},
                error_message=f"the server returned a call of {name} as text in content, not as "
                "tool_calls: its tool-call parser is off or failed (vLLM: "
                "--enable-auto-tool-choice --tool-call-parser NAME; llama-server: --jinja)",
            )
    record["summary"]["exit_code"] = 2
    return record


def test_calls_written_as_text_fail_their_rows_and_the_run_goes_on(tmp_path):
    """Qwen2.5-Coder on stock llama-server: its doubled-brace calls passed rows (no call seen) or
    failed them for the wrong reasons; where one was seen, the first stopped the whole run. A replay
    of a record that earlier releases made of such rows refused them for want of a response."""
    out, report, played, old, replayed = (
        tmp_path / name
        for name in ("run.json", "report.md", "played.json", "old.json", "replayed.json")
    )
    suite = write_suite(tmp_path / "tools.json", AGENT_TOOLS)
    unshipped = {
        **TRAJECTORIES,
        "cases": [{**TRAJECTORIES["cases"][1], "id": "unshipped"}],
    }  # forbid refund_order
    shipped, refund = {**TRAJECTORIES, "cases": TRAJECTORIES["cases"][:1]}, tmp_path / "refund.json"
    with (
        FakeServer(fakes.llama_server_text(qwen_answer)) as server,
        FakeServer(fakes.chat(refund_then_text)) as other,
    ):
        (code, stdout, err), (played_code, _, _), (shipped_code, _, _) = cli(
            [
                openai(server, suite, out, "qwen2.5-coder-1.5b", extra=("--markdown", report)),
                openai(other, write_suite(tmp_path / "unshipped.json", unshipped), played, "m"),
                openai(server, write_suite(tmp_path / "shipped.json", shipped), refund, "qwen"),
            ],
            tmp_path,
        )
        assert server.count == 4
    assert (code, played_code, shipped_code) == (1, 1, 1), stdout + err
    assert reasons_of(out) == QWEN_REASONS
    # it failed for the wrong reasons only ("refund_order never called"): it wrote a refund
    assert reasons_of(refund) == {
        "refund-shipped-order": [
            "missing_required_text",
            "wrong_tool_args",
            "wrong_tool_order",
            "tool_call_as_text",
        ]
    }
    record = read_record(out)
    assert all(row["error"] is None for row in record["runs"])
    (warning,) = record["summary"]["warnings"]
    assert (
        warning.startswith("2 row(s) wrote tool calls as text")
        and "llama-server" in warning
        and "--jinja" in warning
    )
    assert (
        "wrote cancel_order(order_id=12345) as text" in stdout
        and err.count("wrote tool calls as text") == 1
    )
    assert "--jinja" in report.read_text(encoding="utf-8")
    # a played row whose second turn wrote the refund as text: no refund, and the attempt counts
    assert reasons_of(played) == {"unshipped": ["forbidden_tool_called", "tool_call_as_text"]}
    assert read_record(played)["summary"]["warnings"][0].endswith(
        "Ollama: a template with tools)"
    )  # unknown server
    old.write_text(json.dumps(as_older_release(record)), encoding="utf-8")
    ((code, stdout, err),) = cli(
        [["--provider", "replay", "--replay", old, "--out", replayed]], tmp_path
    )
    assert code == 1, stdout + err
    assert reasons_of(replayed) == QWEN_REASONS


@pytest.mark.parametrize(
    "response, cause",
    [
        (
            {"system_fingerprint": "b4321-2f0e1a3", "timings": {}},
            "llama-server parses tool calls only when started " "with --jinja",
        ),
        ({"system_fingerprint": "fp_ollama"}, "ollama show MODEL --template"),
        (
            {"kv_transfer_params": None, "prompt_logprobs": None},
            "--enable-auto-tool-choice --tool-call-parser NAME",
        ),
        ({"id": "chatcmpl-1"}, "the server's chat template or tool-call parser"),
    ],
)
def test_the_warning_names_the_likely_cause_for_the_server_in_use(response, cause):
    rows = [
        {
            "case_id": case,
            "model": "m",
            "repeat": 0,
            "error": None,
            "passed": False,
            "response": response,
            "reasons": ["tool_call_as_text"],
            "tool_calls": 0,
        }
        for case in ("a", "b")
    ]
    (warning,) = regression.summary(rows, ["m"], 1, ["a", "b"])["warnings"]
    assert warning.startswith("2 row(s) wrote tool calls as text") and cause in warning


# ============================================================ 14. tools without parameters


def test_tools_without_parameters_reach_a_strict_server(tmp_path):
    """The golden format names tools without a schema: llama-cpp-python's server answered HTTP 500
    "Field required" to every row. The wire carries an empty object schema; the config does not."""
    out = tmp_path / "run.json"

    def answer(body):
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return fakes.chat_response(
            "What is your order id?" if "cancel" in user else "It ships tomorrow at 9."
        )

    with FakeServer(fakes.needs_parameters(answer)) as server:
        ((code, stdout, err),) = cli(
            [
                [
                    "--suite",
                    ROOT / "suites" / "golden-support",
                    "--provider",
                    "openai",
                    "--base-url",
                    server.url + "/v1",
                    "--models",
                    "m",
                    "--out",
                    out,
                ]
            ],
            tmp_path,
        )
        bodies = [request.json for request in server.requests]
    assert code == 0, stdout + err
    empty = {"type": "object", "properties": {}}
    assert [[tool["function"]["parameters"] for tool in body["tools"]] for body in bodies] == [
        [empty] * 2,
        [empty],
    ]
    assert read_record(out)["config"]["tools"] == [
        {"type": "function", "function": {"name": "lookup_order"}},
        {"type": "function", "function": {"name": "cancel_order"}},
    ]


def test_every_wire_form_gets_the_empty_schema_and_keeps_a_declared_one():
    declared = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    suite = regression.validate_suite(
        {
            "name": "s",
            "instructions": "x",
            "cases": [{"id": "c", "input": "q"}],
            "tools": [
                {"type": "function", "function": {"name": "a"}},
                {"type": "function", "name": "b"},
                {"type": "function", "function": {"name": "c", "parameters": declared}},
            ],
            "tool_choice": {"type": "function", "function": {"name": "a"}},
        }
    )
    before = copy.deepcopy(suite["tools"])
    chat = regression.OpenAIProvider("http://127.0.0.1:9/v1").body("m", suite, suite["cases"][0])
    agent = regression.PerplexityProvider().body("m", suite, suite["cases"][0])
    empty = {"type": "object", "properties": {}}
    assert [tool["function"]["parameters"] for tool in chat["tools"]] == [empty, empty, declared]
    assert [tool["parameters"] for tool in agent["tools"]] == [empty, empty, declared]
    assert agent["extra_body"]["tool_choice"] == {
        "type": "function",
        "name": "a",
    }  # a choice names, no schema
    assert suite["tools"] == before
