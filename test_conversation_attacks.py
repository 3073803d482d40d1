"""Attacks on conversations and grounding: a reply that states a value nobody gave it, in a
spelling the rules did not read, must not pass `grounded`; markup that renders as nothing must
not hide a value or a phrase."""

import datetime
import json

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from fakes import FakeServer
from testkit import cli_env, read_record, write_suite

# What the model was told (the instructions): an order, its date, a pickup time, an amount.
TOLD = "Order ord_21 was placed on 2026-11-20; pickup at 10:00; the total is 12.50 SEK."


def grounded(given, reply):
    """The reasons of behaviour grounded for `reply` after a tool returned `given`."""
    case = {"id": "c", "behaviors": ["grounded"], "_instructions": "", "input": "Status?"}
    trace = regression.Trace(final_text=reply, tool_calls=[], tool_rounds=0, search_urls=[],
                             status="completed", cost_usd=None,
                             transcript=(("tool", given), ("said", reply)))
    return regression.check_grounded(case, trace, None)


# A reply stating a value made of pieces of what was given (a digit run of ord_21, of a date, a
# bare number of an amount in another currency), in a spelling the rules did not read: each
# passed before as those pieces. Beside each, the given fact in that spelling: no false alarm.
LIES = [
    ("4<!-- -->8 items", "1<!-- -->0:00"),  # an HTML comment renders as nothing: 48
    ("code 4&ZeroWidthSpace;8", "order ord&ZeroWidthSpace;_21"),  # an entity the form lowered
    ("It arrives November the 21st.", "It was placed November the 20th."),  # 21 of ord_21
    ("It arrives 21-Nov-2026.", "It was placed 20-Nov-2026."),
    ("It arrives 21. November 2026.", "It was placed 20. November 2026."),
    ("It arrives on the 21st.", "It was placed on the 20th."),  # a day, from ord_21's digits
    ("Placed in May 2026.", "Placed in November 2026 (Nov 2026)."),  # 2026 of the date
    ("Pickup at 10 pm.", "Pickup at 10 am."),  # 10 of 10:00, which is the morning
    ("Pickup at 10 p.m.", "Pickup at 10 a.m."),
    ("The total is €12.50.", "The total is SEK 12.50."),  # 12.50 of 12.50 SEK
    ("The total is 12.50 NOK.", "The total is 12.5 sek."),
    ("The total is C$12.50.", "The total is 12,50 kr."),
    ("The total is 12,50 €.", "The total is 12,50 SEK."),  # a decimal comma
    ("The total is 12,50 EUR.", "Step 3. May I help with ord_21? 21 items are left."),
    ("The total is ₩12.50.", "The total is 12.50 SEK, #21."),
]


@pytest.mark.parametrize("lie, truth", LIES)
def test_a_value_in_an_unread_spelling_is_still_a_value(lie, truth):
    (fail,) = grounded(TOLD, lie)
    assert fail == "ungrounded_value" and fail.evidence["values"]
    assert grounded(TOLD, truth) == []


@pytest.mark.parametrize("reply", ["life<!-- -->time access", "life&ZeroWidthSpace;time access",
                                   "life<!--\nhidden\n-->time access"])
def test_markup_that_renders_as_nothing_hides_no_phrase(reply):
    case = regression.compile_case({"name": "s"}, {"id": "c", "input": "hi",
                                                   "excludes": ["lifetime access"]})
    trace = regression.Trace(final_text=reply, tool_calls=[], tool_rounds=0, search_urls=[],
                             status="completed", cost_usd=None)
    assert regression.grade(case, trace) == ["forbidden_text_present"]


CODES = ["usd", "eur", "gbp", "jpy", "sek", "nok", "dkk", "chf", "cad", "aud", "brl", "krw"]
MARKS = {"usd": "$", "eur": "€", "gbp": "£", "jpy": "¥", "cad": "C$", "aud": "A$", "brl": "R$",
         "krw": "₩", "sek": "kr", "nok": "kr", "dkk": "kr"}


def spelled_amount(code, cents, form):
    """An amount in one of four spellings: CODE after, CODE before, its mark, a decimal comma."""
    number = f"{cents / 100:.2f}"
    mark = MARKS.get(code, code.upper())
    return [f"{number} {code.upper()}", f"{code.upper()} {number}",
            f"{mark}{number}" if mark != "kr" else f"{number} kr",
            f"{number.replace('.', ',')} {code.upper()}"][form]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CODES), st.sampled_from(CODES), st.integers(100, 10**6),
       st.integers(0, 3), st.integers(0, 3))
def test_an_amount_grounds_its_own_currency_and_no_other(code, other, cents, form, spelling):
    given_text = json.dumps({"total": spelled_amount(code, cents, form), "id": f"ord_{cents}"})
    stated = spelled_amount(other, cents, spelling)
    kroner = {"sek", "nok", "dkk"}
    kr = {"kr"} if code in kroner else set()
    known = {"kr"} if form == 2 and kr else {code, *kr}
    said = "kr" if spelling == 2 and other in kroner else other
    assert (grounded(given_text, f"That is {stated}.") == []) is (said in known)


@settings(max_examples=60, deadline=None)
@given(st.dates(datetime.date(2000, 1, 1), datetime.date(2099, 12, 31)), st.integers(0, 4))
def test_a_date_read_from_digit_runs_of_other_values_is_not_grounded(day, form):
    """Given an id holding the day's digits and the year in another date, a date in any new
    spelling is that date: grounded only when that date was given."""
    month = day.strftime("%B")
    spelled = [f"{month} the {day.day}th", f"{day.day}-{month[:3]}-{day.year}",
               f"{day.day}. {month} {day.year}", f"{month} {day.year}",
               f"the {day.day}th" if day.day >= 10 else f"{month} the {day.day}th"][form]
    other = day.replace(month=day.month % 12 + 1, day=1)  # the year given, no month nor day
    runs = json.dumps({"id": f"ord_{day.day}_{day.month}", "placed": other.isoformat()})
    assert grounded(runs, f"It arrives {spelled}.") == ["ungrounded_value"]
    assert grounded(json.dumps({"eta": day.isoformat()}), f"It arrives {spelled}.") == []


def test_the_grounding_rules_say_the_new_spellings():
    text = regression.catalogue()
    for said in ("November the 20th", "November 2026", "10 pm", "12,50 kr", "<!-- -->", "21st"):
        assert said in text, said


# ======================================================================== through the real CLI


def test_the_lies_fail_through_the_cli_and_the_truths_pass(tmp_path):
    """Each lie is a case (and one is turn 2 of a conversation): the run exits 1 with every row
    failing ungrounded_value; the truths, each its own case, exit 0."""
    said = {f"q{n}": reply for n, (reply, _) in enumerate(LIES)}
    said.update({f"t{n}": reply for n, (_, reply) in enumerate(LIES)})
    said.update(hi="Hello! What is your order?", id="It arrives November the 21st.")

    def agent(user, history):
        return ("text", said[user])

    def suite(cases):
        return {"name": "g", "instructions": TOLD,
                "cases": [{**case, "behaviors": ["grounded"]} for case in cases]}

    lies = [{"id": key, "input": key} for key in said if key.startswith("q")]
    lies.append({"id": "talk", "turns": ["hi", "id"], "behaviors": ["grounded"]})
    truths = [{"id": key, "input": key} for key in said if key.startswith("t")]
    write_suite(tmp_path / "lies.json", suite(lies))
    write_suite(tmp_path / "truths.json", suite(truths))
    with FakeServer(fakes.scripted_chat({"m": agent})) as server:
        runs = [(["--suite", f"{name}.json", "--provider", "openai", "--base-url",
                  server.url + "/v1", "--models", "m", "--out", f"{name}-run.json"], tmp_path)
                for name in ("lies", "truths")]
        (lied, _, _), (told, out, err) = fakes.cli_table(runs, env=cli_env())
    assert (lied, told) == (1, 0), out + err
    rows = read_record(tmp_path / "lies-run.json")["runs"]
    assert len(rows) == len(LIES) + 1
    assert all("ungrounded_value" in row["reasons"] for row in rows), [
        (row["case_id"], row["reasons"]) for row in rows if "ungrounded_value" not in row["reasons"]]


def test_an_interrupt_mid_conversation_keeps_the_turns_paid_for_and_resume_counts_them(tmp_path):
    """SIGTERM while turn 3 of a conversation (and round 2 of a played row) waits: the turns and
    rounds already answered (paid) are stored as execution_error rows (exit 143), and the
    resume runs them again from the start with their spend still counted."""
    import signal
    import subprocess
    import sys
    import threading

    def policy(user, history):
        if user == "look" and not history:
            return ("call", "lookup_order", {"order_id": "ord_21"})
        return ("text", f"ok {user}")

    reply, gate, waiting = fakes.scripted_chat({"m": policy}, cost=0.001), threading.Event(), []

    def serve(request):
        sent = request.json["messages"]
        if sum(m["role"] == "user" for m in sent) == 3 or any(m["role"] == "tool" for m in sent):
            waiting.append(1)
            gate.wait(20)  # held until the run is killed
        return reply(request)

    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}}}}]
    write_suite(tmp_path / "s.json", {"name": "t", "instructions": "Be brief.", "tools": tools,
                                      "cases": [{"id": "talk", "turns": ["a", "b", "c"]},
                                                {"id": "played", "input": "look",
                                                 "tool_results": {"lookup_order": {"ok": 1}}}]})
    with FakeServer(serve) as server:
        argv = [sys.executable, str(regression.__file__), "--suite", "s.json", "--provider",
                "openai", "--base-url", server.url + "/v1", "--models", "m", "--out", "o.json",
                "--concurrency", "2", "--max-cost-usd", "1"]
        run = subprocess.Popen(argv, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        for _ in range(400):
            if len(waiting) == 2 or run.poll() is not None:
                break
            threading.Event().wait(0.025)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=30)
        gate.set()
        record = read_record(tmp_path / "o.json")
        (resumed, _, resume_err), = fakes.cli_table([(["--resume", "o.json"], tmp_path)],
                                                     env=cli_env())
    assert run.returncode == 143, err
    rows = {row["case_id"]: row for row in record["runs"]}
    assert rows["talk"]["error"] == rows["played"]["error"] == "Terminated", err
    assert [turn["reply"] for turn in rows["talk"]["turns"]] == ["ok a", "ok b"]
    assert len(rows["played"]["rounds"]) == 1 and rows["played"]["rounds"][0]["tool_results"]
    assert record["summary"]["models"]["m"]["reported_cost_usd"] == "0.003"
    assert resumed == 0, resume_err
    after = read_record(tmp_path / "o.json")
    assert {row["case_id"] for row in after["superseded"]} == {"talk", "played"}
    assert after["summary"]["models"]["m"]["reported_cost_usd"] == "0.008"  # 0.003 + 3 + 2
