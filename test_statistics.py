"""Statistics that decide: every number checked against an independent computation (scipy,
a direct implementation or brute force), and each promise pinned through the real CLIs.

Holm-Bonferroni for --alpha over (model, case) pairs; Wilson 95 % intervals on every pass
rate; pass^k; the --repeats-needed planner; --repeats up to 100 with the dry-run estimate;
--trend across records, its HTML chart opened in headless Chromium.

The CLI cases of the module run in two tables (fakes.cli_table: the real scripts, forked
from one interpreter), built once per worker by the `compared` and `ran` fixtures.
"""

import fractions
import html
import json
import math
import re
import stat
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

import compare_runs
import fakes
import regression
from test_reports import (
    _Page,
    csp_directives,
    dump_dom,
    hostile_strings,
    loopback,
)  # noqa: F401 (fixture)
from testkit import cli_env

HERE = Path(__file__).resolve().parent
HYPOTHESIS = dict(deadline=None, database=None, derandomize=True)
RATE = re.compile(r"(\d+)/(\d+) = (\d\.\d\d) \[(\d\.\d+), (\d\.\d+)\]")


# ====================================================================== helpers


def make_record(models, case_ids, repeats, failing=(), name="run"):
    """A complete record; `failing` holds the (model, case, repeat) keys whose row failed."""
    rows = [
        {
            "case_id": c,
            "model": m,
            "repeat": r,
            "error": None,
            "error_status": None,
            "cost_usd": "0",
            "response": {"status": "completed", "output_text": "a"},  # a verdict needs its evidence
            "answer_text": "a",
            "reasons": ["wrong_code"] if (m, c, r) in failing else [],
            "seconds": 0.1,
            "passed": (m, c, r) not in failing,
        }
        for m, c, r in regression.plan_rows(list(models), list(case_ids), repeats)
    ]
    config = {
        "models": list(models),
        "cases": [{"id": c} for c in case_ids],
        "instructions": name,
        "repeats": repeats,
    }
    return {
        "created_at": name,
        "config": config,
        "sdk_version": "0.43.5",
        "code_sha256": "0" * 64,
        "runs": rows,
        "summary": regression.summary(rows, list(models), repeats, config["cases"]),
    }


def write(path, record):
    path.write_text(json.dumps(record), encoding="utf-8")
    return str(path)


def one_line(err):
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err


def scipy_wilson(passed, total):
    interval = scipy_stats.binomtest(passed, total).proportion_ci(
        confidence_level=0.95, method="wilson"
    )
    return float(interval.low), float(interval.high)


def scipy_drop_p(passed_before, runs_before, passed_after, runs_after):
    """scipy's one-sided Fisher exact p that the 'before' side passes more often."""
    table = [
        [passed_before, runs_before - passed_before],
        [passed_after, runs_after - passed_after],
    ]
    return float(scipy_stats.fisher_exact(table, alternative="greater").pvalue)


def direct_holm(p_values):
    """Holm-adjusted p as usually written: sorted p times (m - rank), made monotone, capped at 1."""
    order, adjusted, running = sorted(range(len(p_values)), key=lambda n: p_values[n]), {}, 0
    for rank, index in enumerate(order):
        running = max(running, min(1, (len(order) - rank) * p_values[index]))
        adjusted[index] = running
    return [adjusted[n] for n in range(len(p_values))]


def direct_holm_rejections(p_values, alpha):
    """Holm's step-down procedure as stated: walk up the sorted p, reject while
    p_(k) <= alpha / (m - k + 1)."""
    m, rejected = len(p_values), set()
    for rank, index in enumerate(sorted(range(m), key=lambda n: p_values[n])):
        if p_values[index] > fractions.Fraction(alpha) / (m - rank):
            break
        rejected.add(index)
    return rejected


def brute_power(n, before, after, alpha):
    """Power by enumerating every (x, y) with scipy's binomial pmf and hypergeometric tail."""
    x, y = numpy.meshgrid(numpy.arange(n + 1), numpy.arange(n + 1), indexing="ij")
    p = scipy_stats.hypergeom.sf(x - 1, 2 * n, x + y, n)  # P(X >= x) given x + y passes in all
    rejected = (y < x) & (p <= alpha * (1 + 1e-12))  # 1/20 is 0.05 "exactly", as compare decides it
    weights = numpy.outer(
        scipy_stats.binom.pmf(numpy.arange(n + 1), n, before),
        scipy_stats.binom.pmf(numpy.arange(n + 1), n, after),
    )
    return float((weights * rejected).sum())


# ====================================================================== the CLI tables


def _issue_records(folder, name, failing_repeats, cases=8):
    """The issue's measured case: one of 8 pairs goes from 10/10 to (10 - k)/10."""
    case_ids = [f"c{n}" for n in range(cases)]
    before = make_record(["m"], case_ids, 10, name="before")
    after = make_record(
        ["m"], case_ids, 10, {("m", "c0", r) for r in failing_repeats}, name="after"
    )
    return write(folder / f"{name}-before.json", before), write(
        folder / f"{name}-after.json", after
    )


def trend_files(folder, models=("m", "n"), cases=("c0", "c1")):
    """Four runs: the first model drops significantly at run 3 and stays down; the second
    loses one row of its second case at run 4. Failures as (model, case, repeat) positions."""
    fails = [
        set(),
        {(0, 0, 1)},
        {(0, 0, r) for r in range(8)} | {(0, 1, r) for r in range(3)},
        {(0, 0, r) for r in range(9)} | {(1, 1, 0)},
    ]
    return [
        write(
            folder / f"run{n}.json",
            make_record(
                models, cases, 10, {(models[m], cases[c], r) for m, c, r in failing}, name=f"run{n}"
            ),
        )
        for n, failing in enumerate(fails, 1)
    ]


def _compare_table(folder):
    """{name: argv} of every compare_runs.py case of the module, with the files they read."""
    chance, real = _issue_records(folder, "chance", range(4)), _issue_records(
        folder, "real", range(10)
    )
    swap = write(
        folder / "swap.json",
        make_record(
            ["a", "b"], [f"c{n}" for n in range(8)], 10, {("b", "c0", r) for r in range(4)}
        ),
    )
    four = [f"c{n}" for n in range(4)]
    low = (
        write(folder / "low-b.json", make_record(["m"], four, 3)),
        write(
            folder / "low-a.json", make_record(["m"], four, 3, {("m", "c0", r) for r in range(3)})
        ),
    )
    hundred = (
        write(folder / "h-b.json", make_record(["m"], ["c"], 100)),
        write(folder / "h-a.json", make_record(["m"], ["c"], 100, {("m", "c", 0)})),
    )
    over = make_record(["m"], ["c"], 100)
    over["config"]["repeats"] = 101
    over = write(folder / "over.json", over)
    runs = trend_files(folder)
    for week, run in enumerate(runs[:3], 1):  # the docs' example reads three weekly records
        (folder / f"week{week}.json").write_text(
            (folder / run).read_text(encoding="utf-8"), encoding="utf-8"
        )
    other = write(folder / "other.json", make_record(["m"], ["c0", "c1"], 10))
    partial = make_record(["m", "n"], ["c0", "c1"], 10)
    partial["runs"] = partial["runs"][:-1]
    partial = write(folder / "partial.json", partial)
    (folder / "old.html").write_text("keep", encoding="utf-8")
    table = {
        "chance holm": [*chance, "--alpha", "0.05"],
        "chance none": [*chance, "--alpha", "0.05", "--correction", "none"],
        "chance plain": list(chance),
        "real holm": [*real, "--alpha", "0.05"],
        "swap holm": ["--models", "a", "b", swap, "--alpha", "0.05"],
        "swap none": ["--models", "a", "b", swap, "--alpha", "0.05", "--correction", "none"],
        "low repeats": [*low, "--alpha", "0.05"],
        "hundred": list(hundred),
        "over hundred": [hundred[0], over],
        "planner": ["--repeats-needed", "0.95", "0.8"],
        "planner options": [
            "--repeats-needed",
            "95%",
            "80%",
            "--alpha",
            "0.01",
            "--power",
            "0.9",
            "--repeats",
            "40",
        ],
        "trend": ["--trend", *runs],
        "trend docs": DOCS_TREND.split()[2:],
        "trend per case": [
            "--trend",
            *runs,
            "--per-case",
            "--markdown",
            "t.md",
            "--html",
            "t.html",
        ],
        "trend steady": ["--trend", runs[0], runs[1]],
        "trend none": ["--trend", runs[0], runs[3], "--correction", "none", "--alpha", "0.3"],
        "trend other": ["--trend", runs[0], runs[1], other, runs[2], "--html", "refused.html"],
        "trend partial": ["--trend", runs[0], partial, "--html", "refused.html"],
        "trend twice": ["--trend", runs[0], runs[1], runs[0], "--html", "refused.html"],
        "trend missing": [
            "--trend",
            runs[0],
            str(folder / "missing.json"),
            "--html",
            "refused.html",
        ],
    }
    for correction in ("holm", "none"):
        table[f"reports {correction}"] = [
            *real,
            "--alpha",
            "0.05",
            "--correction",
            correction,
            "--markdown",
            f"{correction}.md",
            "--html",
            f"{correction}.html",
            "--junit",
            f"{correction}.xml",
        ]
    for name, argv in USAGE_ERRORS.items():
        table[name] = [*runs[:2], *argv[1:]] if argv[0] == "RECORDS" else argv
    return table, {"runs": runs, "other": other, "partial": partial, "folder": folder}


COMPARING = (HERE / "docs" / "comparing.md").read_text(encoding="utf-8")
DOCS_TREND = (
    "python compare_runs.py --trend week1.json week2.json week3.json --per-case --html trend.html"
)

# name: argv ("RECORDS" stands for two trend records); each exits 2 with USAGE_MESSAGES[name]
USAGE_ERRORS = {
    "correction without alpha": ["RECORDS", "--correction", "holm"],
    "unknown correction": ["RECORDS", "--alpha", "0.05", "--correction", "bonferroni"],
    "correction with matrix": ["RECORDS", "--matrix", "--correction", "none"],
    "rates reversed": ["--repeats-needed", "0.8", "0.95"],
    "rates equal": ["--repeats-needed", "0.8", "0.8"],
    "rate above 1": ["--repeats-needed", "1.5", "0.2"],
    "rate below 0": ["--repeats-needed", "0.9", "-0.1"],
    "rate nan": ["--repeats-needed", "nan", "0.1"],
    "rate over 100%": ["--repeats-needed", "0.9", "120%"],
    "power 1": ["--repeats-needed", "0.9", "0.5", "--power", "1"],
    "power 0": ["--repeats-needed", "0.9", "0.5", "--power", "0"],
    "power nan": ["--repeats-needed", "0.9", "0.5", "--power", "nan"],
    "planner repeats 0": ["--repeats-needed", "0.9", "0.5", "--repeats", "0"],
    "planner with a record": ["--repeats-needed", "0.9", "0.5", "b.json"],
    "power without planner": ["RECORDS", "--power", "0.9"],
    "trend of one": ["--trend", "run1.json"],
    "trend with junit": ["--trend", "run1.json", "run2.json", "--junit", "t.xml"],
    "trend after a record": ["run1.json", "--trend", "run2.json", "run3.json"],
    "per case without trend": ["RECORDS", "--per-case"],
    "trend report exists": ["--trend", "run1.json", "run2.json", "--html", "old.html"],
}
USAGE_MESSAGES = {
    "correction without alpha": "--correction applies to --alpha",
    "unknown correction": "invalid choice: 'bonferroni'",
    "correction with matrix": "--correction applies to --alpha",
    "rates reversed": "BEFORE must be higher than AFTER",
    "rates equal": "BEFORE must be higher than AFTER",
    "rate above 1": "'1.5' is not a pass rate from 0 to 1",
    "rate below 0": "'-0.1' is not a pass rate",
    "rate nan": "'nan' is not a pass rate",
    "rate over 100%": "'120%' is not a pass rate",
    "power 1": "power must be between 0 and 1",
    "power 0": "power must be between 0 and 1",
    "power nan": "power must be between 0 and 1",
    "planner repeats 0": "repeats must be a whole number from 1 to 1000",
    "planner with a record": (
        "--repeats-needed BEFORE AFTER takes --alpha, --power and --repeats only"
    ),
    "power without planner": "--power and --repeats go with --repeats-needed",
    "trend of one": "--trend needs at least two records",
    "trend with junit": "--trend RUN RUN ... takes",
    "trend after a record": "--trend RUN RUN ... takes",
    "per case without trend": "--per-case goes with --trend",
    "trend report exists": "old.html already exists",
}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """{name: (exit code, stdout, stderr)} of the module's compare_runs.py cases; their files."""
    folder = tmp_path_factory.mktemp("compared")
    table, files = _compare_table(folder)
    results = fakes.cli_table(
        [(argv, folder) for argv in table.values()],
        env=cli_env(),
        script="compare_runs.py",
    )
    return dict(zip(table, results)), files


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """{name: (exit code, stdout, stderr)} of the module's regression.py cases, in their folder."""
    folder = tmp_path_factory.mktemp("ran")
    suite = HERE / "suites" / "support-guardrails.json"
    dry = [
        "--provider",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--suite",
        suite,
        "--models",
        "m",
        "n",
        "--dry-run",
    ]
    table = {
        "summary": [
            "--provider",
            "echo",
            "--suite",
            suite,
            "--models",
            "a",
            "b",
            "--repeats",
            "3",
            "--out",
            "run.json",
            "--markdown",
            "run.md",
            "--html",
            "run.html",
        ],
        "dry 100": [*dry, "--repeats", "100", "--price", "m=1/10"],
        "dry 101": [*dry, "--repeats", "101"],
        "dry unpriced": [*dry, "--repeats", "50"],
        "dry capped": [
            *dry,
            "--repeats",
            "20",
            "--price",
            "m=2/8",
            "--price",
            "n=1/4",
            "--max-cost-usd",
            "1",
        ],
        "dry request cap": [*dry, "--repeats", "2", "--price", "m=0/1", "--request",
                            "max_tokens=9000"],
        "list checks": ["--list-checks"],
    }
    with fakes.FakeServer(fakes.chat(lambda body: fakes.chat_response("ok"))) as server:
        # every answer reports 10 input tokens: $0.01 at $1,000 per million
        table["cap"] = [
            "--provider",
            "openai",
            "--base-url",
            server.url + "/v1",
            "--suite",
            suite,
            "--models",
            "m",
            "--repeats",
            "40",
            "--price",
            "m=1000/0",
            "--max-cost-usd",
            "0.05",
            "--out",
            "cap.json",
        ]
        results = fakes.cli_table([(argv, folder) for argv in table.values()], env=cli_env())
    return dict(zip(table, results)), folder


# ====================================================================== Wilson intervals


@given(st.integers(1, 2000).flatmap(lambda total: st.tuples(st.integers(0, total), st.just(total))))
@settings(max_examples=50, **HYPOTHESIS)
def test_wilson_interval_matches_scipy_and_contains_the_rate(counts):
    passed, total = counts
    low, high = regression.wilson_interval(passed, total)
    expected = scipy_wilson(passed, total)
    assert low == pytest.approx(expected[0], abs=1e-12) and high == pytest.approx(
        expected[1], abs=1e-12
    )
    assert 0 <= low <= passed / total <= high <= 1
    assert (low == 0) == (passed == 0) and (high == 1) == (passed == total)
    shown = RATE.fullmatch(regression.rate_text(passed, total))
    assert shown and (int(shown.group(1)), int(shown.group(2))) == (passed, total)
    for text, value in ((shown.group(4), low), (shown.group(5), high)):
        assert abs(float(text) - value) <= 0.5 * 10 ** -(len(text) - 2) + 1e-12  # rounded, not cut
        assert (float(text) in (0.0, 1.0)) == (
            value in (0.0, 1.0)
        )  # a bound inside 0..1 never reads 0 or 1


@pytest.mark.parametrize(
    "counts, text",
    [
        ((6, 10), "6/10 = 0.60 [0.31, 0.83]"),  # the issue's example
        ((10, 10), "10/10 = 1.00 [0.72, 1.00]"),
        ((0, 3), "0/3 = 0.00 [0.00, 0.56]"),
        ((1500, 1500), "1500/1500 = 1.00 [0.997, 1.00]"),  # never a certain-looking [1.00, 1.00]
        ((0, 0), "0/0 (no row)"),
    ],
)
def test_rate_text_form(counts, text):
    assert regression.rate_text(*counts) == text


# ====================================================================== pass^k, the run's summary


@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 6), st.data())
@settings(max_examples=30, **HYPOTHESIS)
def test_summary_pass_k_and_interval_against_a_direct_count(models, cases, repeats, data):
    names, case_ids = [f"m{n}" for n in range(models)], [f"c{n}" for n in range(cases)]
    plan = regression.plan_rows(names, case_ids, repeats)
    failing = {key for key in plan if data.draw(st.booleans())}
    final = make_record(names, case_ids, repeats, failing)["summary"]
    for model in names:
        stats = final["models"][model]
        passed = sum(1 for key in plan if key[0] == model and key not in failing)
        all_passed = sum(
            all((model, c, r) not in failing for r in range(repeats)) for c in case_ids
        )
        assert stats["pass_k"] == {"k": repeats, "passed": all_passed, "cases": cases}
        assert stats["interval_95"] == pytest.approx(
            scipy_wilson(passed, cases * repeats), abs=1e-4
        )
        assert stats["pass_rate"] == regression.rate_text(passed, cases * repeats)
        assert stats["failed_cases"] == {
            c: regression.rate_text(
                sum((model, c, r) not in failing for r in range(repeats)), repeats
            )
            for c in case_ids
            if any((model, c, r) in failing for r in range(repeats))
        }


def test_run_summary_console_record_and_reports_carry_rates_and_pass_k(ran):
    """A real run: echo passes one support case of four; 3 repeats of two models."""
    results, folder = ran
    code, out, err = results["summary"]
    assert code == 1, err
    record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    final = record["summary"]
    passing = {row["case_id"] for row in record["runs"] if row["passed"]}
    assert len(passing) == 1  # the same case passes for both models in every repeat
    for model in ("a", "b"):
        stats = final["models"][model]
        assert stats["pass_rate"] == "3/12 = 0.25 [0.09, 0.53]"
        assert stats["interval_95"] == pytest.approx(scipy_wilson(3, 12), abs=1e-4)
        assert stats["pass_k"] == {"k": 3, "passed": 1, "cases": 4}
        assert sorted(stats["failed_cases"]) == sorted(
            {c["id"] for c in record["config"]["cases"]} - passing
        )
        assert set(stats["failed_cases"].values()) == {"0/3 = 0.00 [0.00, 0.56]"}
    assert json.loads(out[out.index("\n{") + 1 :]) == final  # the console's summary ends the output
    markdown = (folder / "run.md").read_text(encoding="utf-8")
    assert "| a | 3/12 = 0.25 \\[0.09, 0.53\\] | 0 | no | 0 | pass^3 1/4 = 0.25 |" in markdown
    assert "2 model/case pair(s) passed every repeat: 3/3 = 1.00 \\[0.44, 1.00\\] each" in markdown
    assert markdown.count("0/3 = 0.00 \\[0.00, 0.56\\]") == 6
    html = (folder / "run.html").read_text(encoding="utf-8")
    assert html.count("0/3 = 0.00 [0.00, 0.56]") == 6 and "pass^3 1/4 = 0.25" in html


# ====================================================================== Fisher and Holm


@given(st.integers(1, 60), st.integers(1, 60), st.data())
@settings(max_examples=50, **HYPOTHESIS)
def test_fisher_drop_and_its_exact_form_match_scipy(runs_before, runs_after, data):
    passed_before, passed_after = data.draw(st.integers(0, runs_before)), data.draw(
        st.integers(0, runs_after)
    )
    counts = passed_before, runs_before, passed_after, runs_after
    exact = compare_runs.fisher_drop_exact(*counts)  # what --alpha decides with
    assert isinstance(exact, fractions.Fraction) and float(exact) == compare_runs.fisher_drop(
        *counts
    )
    assert float(exact) == pytest.approx(scipy_drop_p(*counts), rel=1e-9)


def test_fisher_drop_exact_equals_the_hypergeometric_sum_term_by_term():
    """The tail is built term from term (so 4,000 rows a side take milliseconds); every count
    up to 7 a side, the empty sides included, equals the direct sum of binomial products."""
    for before, after in [(b, a) for b in range(8) for a in range(8)]:
        for passed_before, passed_after in [(x, y) for x in range(before + 1)
                                            for y in range(after + 1)]:
            total, passes = before + after, passed_before + passed_after
            tail = sum(math.comb(passes, x) * math.comb(total - passes, before - x)
                       for x in range(passed_before, min(before, passes) + 1))
            expected = fractions.Fraction(tail, math.comb(total, before))
            got = compare_runs.fisher_drop_exact(passed_before, before, passed_after, after)
            assert got == expected, (passed_before, before, passed_after, after)


@given(
    st.lists(st.fractions(0, 1, max_denominator=400), min_size=1, max_size=12),
    st.sampled_from(["0.01", "0.05", "0.1", "0.25"]),
)
@settings(max_examples=30, **HYPOTHESIS)
def test_holm_matches_the_step_down_procedure(p_values, alpha):
    adjusted = compare_runs.holm(p_values)
    limit = fractions.Fraction(alpha)
    assert {n for n, value in enumerate(adjusted) if value <= limit} == direct_holm_rejections(
        p_values, alpha
    )
    assert all(p <= value <= 1 for p, value in zip(p_values, adjusted))
    ranked = sorted(range(len(p_values)), key=lambda n: p_values[n])
    assert all(
        adjusted[a] <= adjusted[b] for a, b in zip(ranked, ranked[1:])
    )  # the order of the p is kept


def test_one_chance_drop_among_eight_pairs_no_longer_fails_the_gate(compared):
    results, _ = compared
    raw = scipy_drop_p(10, 10, 6, 10)  # 10/10 -> 6/10: p = 0.043
    code, out, err = results["chance holm"]
    assert code == 0, out + err
    (rate,) = [line for line in out.splitlines() if line.startswith("RATE           m  c0  ")]
    assert (
        f"10/10 = 1.00 [0.72, 1.00] -> 6/10 = 0.60 [0.31, 0.83]  p={raw:.4f}  adjusted"
        f" p={8 * raw:.4f}"
        in rate
    )
    verdict = (
        "verdict: no significant drop (exit 0): 4 rows flipped to failing, none at adjusted p <="
        " 0.05 (Holm-Bonferroni correction over 8 model/case pairs)"
    )
    assert (
        verdict in out.splitlines() and f"```text\n{verdict}\n```" in COMPARING
    )  # as the docs show it
    code, out, _ = results["chance none"]
    assert code == 1 and "(uncorrected over 8 model/case pairs: --correction none)" in out
    assert "adjusted p=" not in out
    code, out, _ = results["chance plain"]  # without --alpha: any new failure, as before
    assert code == 1 and "verdict: NEW FAILURES (exit 1): 4 rows flipped to failing" in out


def test_a_real_drop_among_eight_pairs_still_fails_the_gate(compared):
    code, out, _ = compared[0]["real holm"]  # 10/10 -> 0/10
    assert code == 1, out
    assert f"adjusted p={8 * scipy_drop_p(10, 10, 0, 10):.4f}" in out
    assert (
        "SIGNIFICANT DROP (exit 1): 1 model/case pair dropped at adjusted p <= 0.05"
        " (Holm-Bonferroni correction over 8 model/case pairs)"
        in out
    )
    assert (
        "MODEL          m  80/80 = 1.00 [0.95, 1.00] -> 70/80 = 0.88 [0.78, 0.93]  pass^10 8/8"
        " -> 7/8"
        in out
    )
    assert scipy_wilson(70, 80) == pytest.approx((0.78, 0.93), abs=0.005)


def test_every_comparison_report_names_the_correction(compared):
    results, files = compared
    for correction, words in (
        ("holm", "Holm-Bonferroni correction over 8 model/case pairs"),
        ("none", "uncorrected over 8 model/case pairs: --correction none"),
    ):
        assert results[f"reports {correction}"][0] == 1
        reports = [files["folder"] / f"{correction}.{kind}" for kind in ("md", "html", "xml")]
        for report in reports:
            assert words in report.read_text(encoding="utf-8"), report
            assert stat.S_IMODE(report.stat().st_mode) == 0o600
        junit = reports[2].read_text(encoding="utf-8")
        assert (
            junit.count("<failure ") == 10
            and junit.count(
                "pass rate 10/10 = 1.00 [0.72, 1.00] -&gt; 0/10 = 0.00 [0.00, 0.28]:"
                f" p={scipy_drop_p(10, 10, 0, 10):.4f}"
            )
            == 10
        )
        markdown = reports[0].read_text(encoding="utf-8")
        assert (
            "| m | 80/80 = 1.00 \\[0.95, 1.00\\] -&gt; 70/80 = 0.88 \\[0.78, 0.93\\] | pass^10 8/8"
            " -&gt; 7/8 |"
            in markdown
        )
        assert ("adjusted" in markdown) == (correction == "holm")


def test_model_swap_is_corrected_too(compared):
    assert compared[0]["swap holm"][0] == 0 and compared[0]["swap none"][0] == 1


def test_low_repeats_note_points_to_the_planner_with_the_family_alpha(compared):
    code, out, _ = compared[0]["low repeats"]
    assert code == 0  # 3/3 -> 0/3 is p = 0.05; Holm over 4 pairs needs 0.0125
    assert (
        "note: with 3 repeat(s) per side no drop can reach adjusted p <= 0.05 over 4 pairs (the"
        " smallest possible p is 0.0500; Holm needs p <= 0.0125 for the first); to plan repeats:"
        " python compare_runs.py --repeats-needed BEFORE AFTER --alpha 0.0125"
        in out
    )


@pytest.mark.parametrize("name", USAGE_ERRORS)
def test_usage_errors_are_one_line_exit_2(compared, name):
    code, out, err = compared[0][name]
    assert code == 2 and out == "" and USAGE_MESSAGES[name] in one_line(err)
    assert (compared[1]["folder"] / "old.html").read_text(
        encoding="utf-8"
    ) == "keep"  # never overwritten


# ====================================================================== the repeats planner


@given(
    st.integers(1, 30),
    st.sampled_from([0.5, 0.8, 0.9, 0.95, 1.0]),
    st.sampled_from([0.0, 0.2, 0.5, 0.7]),
    st.sampled_from([0.01, 0.05, 0.1, 0.3]),
)
@settings(max_examples=40, **HYPOTHESIS)
def test_planner_power_matches_brute_force(n, before, after, alpha):
    assert compare_runs.power(n, before, after, alpha) == pytest.approx(
        brute_power(n, before, after, alpha), abs=1e-9
    )


def test_planner_power_at_the_exact_tie():
    """3 repeats: 3/3 -> 0/3 is p = 1/20 exactly, which compare calls significant at alpha 0.05."""
    assert compare_runs.power(3, 1.0, 0.0, 0.05) == 1.0
    assert compare_runs.power(3, 1.0, 0.0, 0.049) == 0.0


@pytest.mark.parametrize(
    "before, after, alpha, goal",
    [(0.95, 0.8, 0.05, 0.8), (1.0, 0.6, 0.05, 0.8), (0.9, 0.5, 0.01, 0.9)],
)
def test_repeats_needed_is_the_smallest_by_brute_force(before, after, alpha, goal):
    n, found = compare_runs.repeats_needed(before, after, alpha, goal)
    assert found == pytest.approx(brute_power(n, before, after, alpha), abs=1e-9) and found >= goal
    assert all(brute_power(m, before, after, alpha) < goal for m in range(1, n))


@pytest.mark.parametrize(
    "n, before, alpha, goal", [(10, 0.95, 0.05, 0.8), (30, 0.9, 0.05, 0.9), (3, 1.0, 0.05, 0.5)]
)
def test_smallest_detectable_drop_by_brute_force(n, before, alpha, goal):
    after = compare_runs.smallest_drop(n, before, alpha, goal)
    assert (
        brute_power(n, before, after, alpha) >= goal > brute_power(n, before, after + 0.01, alpha)
    )


def test_repeats_needed_cli(compared):
    code, out, err = compared[0]["planner"]
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(
        "repeats needed: 67 per side to detect a drop from 0.95 to 0.8 with power 0.8 "
        "(one-sided Fisher exact test at alpha 0.05"
    )  # the issue's "about 67"
    after = compare_runs.smallest_drop(10, 0.95, 0.05, 0.8)
    assert (
        "with 10 repeats per side (--repeats N to change): power"
        f" {brute_power(10, 0.95, 0.8, 0.05):.4f} for this drop; a drop from 0.95 to {after:.2f} or"
        " lower is detected with power 0.8"
        in lines
    )
    assert f"```text\n{out}```" in COMPARING  # the docs show this very output
    code, out, _ = compared[0]["planner options"]
    n, _ = compare_runs.repeats_needed(0.95, 0.8, 0.01, 0.9)
    assert (
        code == 0 and f"repeats needed: {n} per side" in out and "with 40 repeats per side" in out
    )
    assert n > 100 and "a record holds at most 100 repeats" in out


# ====================================================================== --repeats 1-100, dry run


def test_repeats_up_to_100_and_the_dry_run_estimate(ran):
    results, _ = ran
    code, out, _ = results["dry 100"]
    assert code == 0 and "plan: 4 cases x 2 models x 100 repeats = 800 requests" in out
    # m: 400 requests of at most 4,096 output tokens at $10 per million; n has no price
    assert (
        f"estimated cost: at most ${400 * 4096 * 10 / 1_000_000:.4f} for output (up to 400 requests"
        " x 4,096 output tokens each, the output cap) + about $"
        in out
        and "n not estimated (no price)" in out
    )
    code, _, err = results["dry 101"]
    assert code == 2 and "--repeats: must be a whole number from 1 to 100" in one_line(err)
    code, out, _ = results["dry unpriced"]
    assert code == 0 and "estimated cost" not in out
    code, out, _ = results["dry capped"]
    assert (
        code == 0
        and f"at most ${80 * 4096 * (8 + 4) / 1_000_000:.4f} for output (up to 160 requests" in out
    )
    assert "--max-cost-usd 1 still stops the run at that spend" in out
    code, out, _ = results["dry request cap"]  # a cap the request sets bounds the output instead
    assert code == 0
    assert f"at most ${8 * 9000 / 1_000_000:.4f} for output (up to 8 requests x 9,000" in out


def test_the_spending_cap_holds_beyond_ten_repeats(ran):
    results, folder = ran
    assert results["cap"][0] == 2
    record = json.loads((folder / "cap.json").read_text(encoding="utf-8"))
    assert len(record["runs"]) == 5 and record["config"]["repeats"] == 40  # 5 x $0.01 reaches $0.05
    assert "--max-cost-usd reached" in record["summary"]["stopped"]


def test_records_of_up_to_100_repeats_compare(compared):
    results, _ = compared
    assert results["hundred"][0] == 1
    code, out, _ = results["over hundred"]
    assert code == 2 and "config.repeats is not a whole number from 1 to 100" in out


# ====================================================================== --trend


def _expected_trend(per_case):
    """The p of every later run against run 1 with scipy, Holm-adjusted directly."""
    series = {("m", None): [20, 19, 9, 11], ("n", None): [20, 20, 20, 19]}
    if per_case:
        series.update(
            {
                ("m", "c0"): [10, 9, 2, 1],
                ("m", "c1"): [10, 10, 7, 10],
                ("n", "c0"): [10, 10, 10, 10],
                ("n", "c1"): [10, 10, 10, 9],
            }
        )
    tests = {
        (key, run): scipy_drop_p(counts[0], 10 if key[1] else 20, counts[run], 10 if key[1] else 20)
        for key, counts in series.items()
        for run in (1, 2, 3)
    }
    return series, tests, dict(zip(tests, direct_holm(list(tests.values()))))


@pytest.mark.parametrize("name, per_case", [("trend", False), ("trend per case", True)])
def test_trend_rates_p_and_first_significant_run(compared, name, per_case):
    code, out, err = compared[0][name]
    assert code == 1, out + err
    series, tests, adjusted = _expected_trend(per_case)
    lines = out.splitlines()
    for (model, case_id), counts in series.items():
        runs = 10 if case_id else 20
        label = f"{model}  {case_id}" if case_id else model
        for run, passed in enumerate(counts):
            (line,) = [
                line
                for line in lines
                if line.startswith(f"TREND          {label}  run {run + 1}  ")
            ]
            low, high = scipy_wilson(passed, runs)
            assert f"{passed}/{runs} = {passed / runs:.2f} [{low:.2f}, {high:.2f}]" in line
            if run:
                key = ((model, case_id), run)
                assert f"p={tests[key]:.4f}  adjusted p={adjusted[key]:.4f}" in line
                assert ("SIGNIFICANT DROP" in line) == (
                    adjusted[key] <= 0.05 and passed < counts[0]
                ), line
    assert f"Holm-Bonferroni correction over {len(tests)} tests" in out
    (verdict,) = [line for line in lines if line.startswith("verdict: ")]
    assert (
        "SIGNIFICANT DROP (exit 1)" in verdict
        and "m first at run 3 (" in verdict
        and "n first" not in verdict
    )
    assert [
        line.endswith("SIGNIFICANT DROP (first)")
        for line in lines
        if line.startswith("TREND          m  run")
    ] == [False, False, True, False]


def test_the_docs_trend_command_as_written(compared):
    assert f"```sh\n{DOCS_TREND}\n```" in COMPARING
    code, out, _ = compared[0]["trend docs"]
    assert code == 1 and "first at run 3 (week3.json)" in out  # run 3 is where the drop shows
    page = (compared[1]["folder"] / "trend.html").read_text(encoding="utf-8")
    assert page.count("<svg ") == 3 and "week3.json" in page


def test_trend_without_a_significant_drop_exits_0_and_correction_none_is_said(compared):
    code, out, _ = compared[0]["trend steady"]
    assert code == 0 and "verdict: no significant drop (exit 0)" in out
    code, out, _ = compared[0]["trend none"]
    assert (
        code == 1
        and "uncorrected over 2 tests: --correction none" in out
        and "adjusted p=" not in out
    )


def test_trend_refuses_records_that_are_not_comparable_naming_the_file(compared):
    results, files = compared
    runs = files["runs"]
    for name, message in (
        ("trend other", f"NOT_COMPARABLE: {files['other']}: models differs"),
        ("trend partial", f"NOT_COMPARABLE: {files['partial']}: the run is incomplete"),
        ("trend twice", f"NOT_COMPARABLE: {runs[0]}: it is the same file as {runs[0]}"),
        ("trend missing", f"NOT_COMPARABLE: {files['folder'] / 'missing.json'}: "),
    ):
        code, out, _ = results[name]
        assert code == 2 and out.startswith(message) and out.count("\n") == 1, (name, out)
    assert f"(against {runs[0]}, the reference)" in results["trend other"][1]
    assert not (files["folder"] / "refused.html").exists()


def test_trend_reports_markdown_and_html(compared):
    folder = compared[1]["folder"]
    for name in ("t.md", "t.html"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    markdown = (folder / "t.md").read_text(encoding="utf-8")
    assert (
        "**SIGNIFICANT DROP (exit 1) against run 1 at adjusted p &lt;= 0.05 (Holm-Bonferroni"
        in markdown
    )
    assert "| m | (all cases) | 3 |" in markdown and "SIGNIFICANT DROP (first) |" in markdown
    html = (folder / "t.html").read_text(encoding="utf-8")
    assert html.count("<svg ") == 3  # the models, then the cases of each model
    assert html.count("<polyline ") == 2 + 4 and 'stroke="#d62728"' in html


# ---------------------------------------------------------------------- the chart in a browser

SVG_TAGS = {"svg", "title", "line", "text", "polyline", "circle", "rect"}
SVG_ATTRIBUTES = {
    "width",
    "height",
    "role",
    "aria-label",
    "x",
    "y",
    "x1",
    "x2",
    "y1",
    "y2",
    "font-size",
    "text-anchor",
    "stroke",
    "fill",
    "stroke-width",
    "stroke-opacity",
    "points",
    "cx",
    "cy",
    "r",
}
PAGE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "p",
    "b",
    "table",
    "tbody",
    "tr",
    "th",
    "td",
}
PAGE_ATTRIBUTES = {"lang", "charset", "http-equiv", "content", "name", "class"}


def check_chart_inert(page, charts):
    """Only our tags and attributes (the chart's included), no URL or script anywhere in them."""
    assert set(page.tags) <= PAGE_TAGS | SVG_TAGS, set(page.tags) - PAGE_TAGS - SVG_TAGS
    assert page.tags.count("svg") == charts and page.tags.count("style") == 1
    for tag, name, value in page.attrs:
        assert name in PAGE_ATTRIBUTES | SVG_ATTRIBUTES, (tag, name, value)
        assert not re.search(r"https?:|javascript:|//|url\(", value or "", re.I), (tag, name, value)


def test_trend_chart_is_inert_in_headless_chromium(tmp_path, loopback):  # noqa: F811 (the fixture)
    hostile = hostile_strings(loopback.port)
    folder = tmp_path / "runs <b>&'\""
    folder.mkdir()
    paths = trend_files(folder, (f"m {hostile[0]}", hostile[4]), (hostile[1], f"case {hostile[3]}"))
    page = tmp_path / "t.html"
    assert compare_runs.main(["--trend", *paths, "--per-case", "--html", str(page)]) == 1
    source = page.read_text(encoding="utf-8")
    check_chart_inert(_Page(source), 3)
    policy = csp_directives(_Page(source))
    assert policy["default-src"] == ["'none'"] and policy.get("script-src") == ["'none'"]
    # Escaping alone must keep the page inert (the policy is a second line of defence):
    # open it without.
    stripped, count = re.subn(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", source)
    assert count == 1
    without_csp = tmp_path / "nocsp.html"
    without_csp.write_text(stripped, encoding="utf-8")
    dom_text = dump_dom(without_csp, tmp_path)
    assert loopback.settle() == ([], 0), "the page contacted the loopback server"
    dom = _Page(dom_text)
    check_chart_inert(
        dom, 3
    )  # the hostile <svg onload> stayed text: only our three charts are elements
    assert dom.tags.count("polyline") == 6 and dom.tags.count("circle") >= 6 * 4
    head_title = [
        html.unescape(re.search("<title>(.*?)</title>", text).group(1))
        for text in (dom_text, source)
    ]
    assert head_title[0] == head_title[1]  # no script set document.title
    text = "\x00".join(dom.text)
    for value in [
        hostile[0],
        hostile[1],
        hostile[3],
        hostile[4],
        str(folder),
    ]:  # the names used above
        assert value in text, value


# ====================================================================== the statistics in words


def test_list_checks_describes_the_statistics(ran):
    code, out, _ = ran[0]["list checks"]
    assert code == 0
    for words in (
        "Wilson 95% interval",
        "pass^k",
        "one-sided Fisher exact test",
        "Holm-Bonferroni",
        "--correction none",
        "--repeats-needed BEFORE AFTER",
        "--trend RUN",
    ):
        assert words in out, words
