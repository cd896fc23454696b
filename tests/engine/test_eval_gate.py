"""CI gate expressions and the regression check against a baseline."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runs.engine.eval_gate import (
    GateClause,
    evaluate_gate,
    metric_value,
    parse_gate,
    regression_check,
)
from runs.engine.eval_metrics import summarise_suite
from tests.engine.eval_trials import suite_trials, trials


def test_single_and_joined_clauses_parse() -> None:
    assert parse_gate("pass^k>=0.8").clauses == (
        GateClause("pass^k", ">=", Decimal("0.8")),
    )
    assert parse_gate("pass@1>=0.9 and cost<=0.05").clauses == (
        GateClause("pass@1", ">=", Decimal("0.9")),
        GateClause("cost", "<=", Decimal("0.05")),
    )
    gate = parse_gate(
        " pass@k > 0.95 AND latency_ms<2000 and tokens == 100 and steps<5"
    )
    assert [(c.metric, c.operator) for c in gate.clauses] == [
        ("pass@k", ">"),
        ("latency_ms", "<"),
        ("tokens", "=="),
        ("steps", "<"),
    ]


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ("pass@1>=0.9 or cost<=0.05", "unknown token 'or' at position 12"),
        ("pass@2>=0.8", "unknown token 'pass@2' at position 0"),
        ("pass^k=>0.8", "unknown token '=>' at position 6"),
        ("pass^k != 1", "unknown token '!=' at position 7"),
        ("costs<=1", "unknown token 'costs' at position 0"),
        ("cost<=$0.05", "unknown token '$0.05' at position 6"),
        ("pass^k>=", "expected a number after '>=' but the expression ended"),
        ("cost<=0.05 and", "expected a metric but the expression ended"),
        ("pass@1 0.9", "expected an operator at position 7 but found '0.9'"),
        (">=0.9", "expected a metric at position 0 but found '>='"),
        ("pass^k>=80", "pass^k is a rate between 0 and 1, not '80'"),
        ("pass@1>=0.9 cost<=1", "expected 'and' at position 12 but found 'cost'"),
        ("(pass@1>=0.9)", "unknown token '(pass@1' at position 0"),
        ("   ", "the gate expression is empty"),
    ],
)
def test_bad_gate_names_the_token_and_lists_what_is_allowed(
    expression: str, named: str
) -> None:
    with pytest.raises(ValueError) as raised:
        parse_gate(expression)
    message = str(raised.value)
    assert named in message
    assert (
        "allowed: metrics pass@1, pass@k, pass^k, cost, latency_ms, tokens, steps"
        in (message)
    )
    assert "operators >=, >, <=, <, ==" in message
    assert "'and'" in message


def test_gate_passes_and_fails_per_clause() -> None:
    # 4 cases x 5 trials: pass^k with k=5 is the share of cases passing all 5
    summary = summarise_suite(suite_trials((5, 5), (5, 5), (5, 5), (5, 4)), k=5)
    assert summary.pass_hat_k == 0.75
    result = evaluate_gate("pass^k>=0.8 and pass@1>=0.9 and cost<=0.05", summary)
    assert result.passed is False
    assert [(r.clause.metric, r.passed) for r in result.clauses] == [
        ("pass^k", False),
        ("pass@1", True),
        ("cost", True),
    ]
    assert [r.clause.metric for r in result.failures] == ["pass^k"]
    assert result.failures[0].actual == Decimal("0.75")
    assert result.failures[0].describe() == "pass^k>=0.8: pass^k is 0.75 (FAILED)"
    assert evaluate_gate("pass^k>=0.75 and pass@k>0.95", summary).passed is True


def test_cost_is_compared_exactly_as_a_decimal() -> None:
    at_limit = summarise_suite(trials("a", 2, 2, cost="0.05"), k=1)
    over = summarise_suite(trials("a", 2, 2, cost="0.0501"), k=1)
    assert evaluate_gate("cost<=0.05", at_limit).passed is True
    assert evaluate_gate("cost<0.05", at_limit).passed is False
    assert evaluate_gate("cost<=0.05", over).passed is False


def test_rates_from_float_means_meet_a_threshold_they_equal() -> None:
    # (1 + 0.8 + 0.9) / 3 = 0.9 only up to float rounding
    summary = summarise_suite(suite_trials((10, 10), (10, 8), (10, 9)), k=1)
    assert evaluate_gate("pass@1>=0.9", summary).passed is True
    assert evaluate_gate("pass@1==0.9", summary).passed is True
    assert evaluate_gate("pass@1>0.9", summary).passed is False


def test_latency_tokens_and_steps_are_means_per_trial() -> None:
    summary = summarise_suite(
        trials("a", 2, 2, latency_ms=1000, tokens=100, steps=2)
        + trials("b", 2, 2, latency_ms=3000, tokens=300, steps=4),
        k=1,
    )
    assert metric_value(summary, "latency_ms") == Decimal("2000.0")
    assert evaluate_gate(
        "latency_ms<=2000 and tokens==200 and steps<3.5", summary
    ).passed
    with pytest.raises(ValueError, match="unknown metric 'speed'"):
        metric_value(summary, "speed")


def test_regression_check_passes_an_unchanged_run() -> None:
    summary = summarise_suite(suite_trials(*[(3, 3)] * 10, *[(3, 2)] * 10), k=3)
    result = regression_check(baseline=summary, current=summary)
    assert result.passed is True
    assert result.reasons == ()


def test_regression_check_fails_on_a_case_going_from_passing_to_failing() -> None:
    baseline = summarise_suite(suite_trials(*[(3, 3)] * 20), k=3)
    current = summarise_suite(suite_trials((3, 0), *[(3, 3)] * 19), k=3)
    result = regression_check(baseline=baseline, current=current)
    assert result.passed is False
    # one case of 20 is within the noise, so the only reason is the flip
    assert result.reasons == (
        "case case0 went from passing to failing (pass@1 1.00 -> 0.00)",
    )


def test_regression_check_fails_when_pass_rates_fall_beyond_the_noise() -> None:
    # every case loses one trial of five: no case flips, but all 40 moved down
    baseline = summarise_suite(suite_trials(*[(5, 5)] * 40), k=5)
    current = summarise_suite(suite_trials(*[(5, 4)] * 40), k=5)
    result = regression_check(baseline=baseline, current=current)
    assert result.passed is False
    assert result.comparison.flips == ()
    assert len(result.reasons) == 2
    assert result.reasons[0].startswith("pass@1 fell from 1.00 to 0.80 (-0.20; 95%")
    assert result.reasons[1].startswith("pass^k fell from 1.00 to 0.00 (-1.00; 95%")


def test_a_drop_within_the_noise_is_not_a_regression() -> None:
    baseline = summarise_suite(suite_trials(*[(3, 2)] * 20), k=3)
    current = summarise_suite(suite_trials(*[(3, 2)] * 19, (3, 1)), k=3)
    result = regression_check(baseline=baseline, current=current)
    assert result.comparison.pass_at_1.delta < 0
    assert result.passed is True
