"""A reported cost is read as the number it is: an integer too large for a float (a hostile or
broken server's usage.cost) is a cost, never an OverflowError that turns a paid row into an error."""

import pytest

import fakes
import regression
from fakes import FakeServer
from testkit import cli_env, read_record, write_suite

HUGE = 10**400  # JSON holds it exactly; float(HUGE) overflows


@pytest.mark.parametrize("amount, expected", [
    (HUGE, "1" + "0" * 400),
    (-HUGE, None),
    (10**400 + 1, "1" + "0" * 399 + "1"),
], ids=["huge", "huge-negative", "huge-odd"])
def test_an_integer_too_large_for_a_float_is_read_exactly(amount, expected):
    raw = {"usage": {"cost": {"currency": "USD", "total_cost": amount}}}
    assert regression.reported_cost(raw) == expected


def test_a_huge_reported_cost_keeps_the_paid_row_graded_through_the_cli(tmp_path):
    suite = write_suite(tmp_path / "s.json", {"name": "s", "instructions": "", "cases": [
        {"id": "c", "input": "hi", "contains": ["hello"]}]})
    out = tmp_path / "r.json"

    def answer(body):
        return fakes.chat_response("hello there", cost=HUGE)  # OpenRouter: usage.cost

    with FakeServer(fakes.chat(answer)) as server:
        [(code, _, err)] = fakes.cli_table([(
            ["--provider", "openai", "--base-url", server.url + "/v1", "--models", "m",
             "--suite", str(suite), "--out", str(out)], tmp_path)], env=cli_env())
    assert code == 0, err
    [row] = read_record(out)["runs"]
    assert row["error"] is None and row["passed"] is True
    assert row["cost_usd"] == "1" + "0" * 400
