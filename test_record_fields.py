"""A record's fields of the wrong JSON type are one line and exit 2 in every reader, never a
traceback: a provider name that is a list or an object (it cannot be looked up), a superseded
field that is not a list (it was walked even after it was found wrong)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

import fakes
import regression
from testkit import ROOT, cli_env

GUARDRAILS = ROOT / "suites" / "support-guardrails.json"
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
HOSTILE = [("provider", {"name": []}, "provider.name is not the name of a provider"),
           ("provider", {"name": {"a": 1}}, "provider.name is not the name of a provider"),
           ("superseded", 1.5, "superseded is not a list"),
           ("superseded", True, "superseded is not a list")]


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """A real record of the echo provider (a passing run, written by the CLI)."""
    folder = tmp_path_factory.mktemp("record")
    argv = ["--suite", GUARDRAILS, "--provider", "echo", "--models", "m", "--out", "run.json"]
    code, _, err = fakes.cli_table([(argv, folder)], env=cli_env())[0]
    assert code in (0, 1), err
    return json.loads((folder / "run.json").read_text(encoding="utf-8"))


def test_a_real_record_is_usable(record):
    assert regression.record_problem(record) is None


@settings(max_examples=60, deadline=None)
@given(field=st.sampled_from(sorted(regression.RECORD_FIELDS)), value=JSON, name=JSON)
def test_a_field_of_any_json_type_is_a_problem_or_none_never_a_raise(record, field, value, name):
    """Any JSON value in a header field, and any provider name, gives a verdict on the record."""
    for edited in ({**record, field: value}, {**record, "provider": {"name": name}}):
        problem = regression.record_problem(edited)
        assert problem is None or isinstance(problem, str)


@pytest.mark.parametrize("field, value, said", HOSTILE)
def test_record_problem_names_the_field(record, field, value, said):
    assert regression.record_problem({**record, field: value}) == said


def test_every_reader_refuses_a_mistyped_field_in_one_line(record, tmp_path):
    """--report and compare_runs.py: exit 2, one line naming the field, no traceback."""
    runs = []
    for number, (field, value, said) in enumerate(HOSTILE):
        paths = [tmp_path / f"bad{number}-{side}.json" for side in ("a", "b")]
        for path in paths:
            path.write_text(json.dumps({**record, field: value}), encoding="utf-8")
        runs.append(("regression.py", ["--report", paths[0], "--markdown", tmp_path / "r.md"], said))
        runs.append(("compare_runs.py", paths, said))
    for script, argv, said in runs:
        code, out, err = fakes.cli_table([(argv, tmp_path)], env=cli_env(), script=script)[0]
        said_lines = (out + err).strip().splitlines()
        assert (code, len(said_lines), "Traceback" in err) == (2, 1, False), (script, out, err)
        assert said in said_lines[0]
