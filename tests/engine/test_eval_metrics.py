"""pass@1, pass@k, pass^k per case and suite, and the case-clustered interval."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runs.engine.eval_metrics import (
    TrialOutcome,
    pass_at_k,
    pass_hat_k,
    summarise_case,
    summarise_suite,
    wilson_interval,
    z_value,
)
from tests.engine.eval_trials import suite_trials, trials


def test_known_values_for_five_trials_three_passed_k_two() -> None:
    # 1 - C(2,2)/C(5,2) = 1 - 1/10; C(3,2)/C(5,2) = 3/10
    assert pass_at_k(5, 3, 2) == pytest.approx(0.9)
    assert pass_hat_k(5, 3, 2) == pytest.approx(0.3)


def test_pass_at_k_is_one_when_too_few_failures_to_fill_k_draws() -> None:
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(3, 0, 3) == 0.0
    assert pass_hat_k(3, 3, 3) == 1.0
    assert pass_hat_k(5, 1, 2) == 0.0


def test_k_of_one_gives_pass_at_1_for_both_estimators() -> None:
    assert pass_at_k(7, 3, 1) == pytest.approx(3 / 7)
    assert pass_hat_k(7, 3, 1) == pytest.approx(3 / 7)


def test_pass_at_k_matches_brute_force_over_all_k_subsets() -> None:
    from itertools import combinations

    outcomes = [True, False, True, False, False, True]
    subsets = list(combinations(outcomes, 3))
    assert pass_at_k(6, 3, 3) == pytest.approx(
        sum(any(s) for s in subsets) / len(subsets)
    )
    assert pass_hat_k(6, 3, 3) == pytest.approx(
        sum(all(s) for s in subsets) / len(subsets)
    )


def test_k_above_n_is_refused_naming_k() -> None:
    with pytest.raises(ValueError, match=r"k=6 is more than the n=5 trials"):
        pass_at_k(5, 3, 6)
    with pytest.raises(ValueError, match=r"k=6"):
        pass_hat_k(5, 3, 6)


def test_k_zero_and_n_zero_and_bad_c_are_refused() -> None:
    with pytest.raises(ValueError, match=r"k=0"):
        pass_at_k(5, 3, 0)
    with pytest.raises(ValueError, match=r"n=0"):
        pass_hat_k(0, 0, 1)
    with pytest.raises(ValueError, match=r"c=6"):
        pass_at_k(5, 6, 1)


def test_case_summary_means_its_trials() -> None:
    outcomes = trials("task_07", 4, 3, cost="0.02", tokens=120, latency_ms=500)
    outcomes[0] = TrialOutcome("task_07", True, Decimal("0.06"), 200, 5, 900.0)
    case = summarise_case("task_07", outcomes, k=2)
    assert (case.n, case.c) == (4, 3)
    assert case.pass_at_1 == 0.75
    assert case.pass_at_k == pytest.approx(1.0)
    assert case.pass_hat_k == pytest.approx(0.5)  # C(3,2)/C(4,2)
    assert case.mean_cost == Decimal("0.03")
    assert case.mean_tokens == 140
    assert case.mean_steps == 3.5
    assert case.mean_latency_ms == 600
    assert [t.trial_id for t in case.failed_trials] == ["task_07-4"]


def test_case_with_no_trials_or_k_above_its_trials_names_the_case() -> None:
    with pytest.raises(ValueError, match=r"n=0: case 'empty'"):
        summarise_case("empty", [], k=1)
    with pytest.raises(ValueError, match=r"case 'short': k=3"):
        summarise_case("short", trials("short", 2, 1), k=3)


def test_case_summary_refuses_another_case_trials() -> None:
    with pytest.raises(ValueError, match="other"):
        summarise_case("mine", trials("mine", 2, 1) + trials("other", 1, 1), k=1)


def test_suite_figures_are_means_over_cases_not_trials() -> None:
    # a case run 4 times does not outweigh a case run twice
    summary = summarise_suite(trials("a", 4, 4) + trials("b", 2, 0), k=2)
    assert summary.pass_at_1 == 0.5
    assert summary.pass_at_k == 0.5
    assert summary.pass_hat_k == 0.5
    assert summary.trials == 6
    assert [c.case_id for c in summary.cases] == ["a", "b"]


def test_suite_means_cost_tokens_steps_and_latency_per_trial() -> None:
    outcomes = trials("a", 2, 2, cost="0.01", tokens=100, steps=2, latency_ms=1000)
    outcomes += trials("b", 2, 1, cost="0.03", tokens=300, steps=4, latency_ms=3000)
    summary = summarise_suite(outcomes, k=1)
    assert summary.mean_cost == Decimal("0.02")
    assert summary.total_cost == Decimal("0.08")
    assert summary.mean_tokens == 200
    assert summary.mean_steps == 3
    assert summary.mean_latency_ms == 2000


def test_suite_of_no_trials_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one case"):
        summarise_suite([], k=1)


def test_wilson_interval_known_value() -> None:
    interval = wilson_interval(0.5, 40, 0.95)
    assert interval.low == pytest.approx(0.3520, abs=1e-3)
    assert interval.high == pytest.approx(0.6480, abs=1e-3)
    assert z_value(0.95) == pytest.approx(1.95996, abs=1e-4)


def test_clustered_cases_give_a_wider_interval_than_the_same_trials_spread_out() -> (
    None
):
    # Both suites: 10 cases x 4 trials, 20 of 40 trials passed.
    clustered = summarise_suite(suite_trials(*[(4, 4)] * 5, *[(4, 0)] * 5), k=1)
    spread = summarise_suite(suite_trials(*[(4, 2)] * 10), k=1)
    assert clustered.pass_at_1 == spread.pass_at_1 == 0.5
    # all-or-nothing cases: the 10 cases are the sample (m - 1 after the unbiased SE)
    assert clustered.effective_trials == pytest.approx(9)
    assert spread.effective_trials == 40
    assert clustered.pass_at_1_interval == wilson_interval(0.5, 9, 0.95)
    assert spread.pass_at_1_interval == wilson_interval(0.5, 40, 0.95)
    width = clustered.pass_at_1_interval.high - clustered.pass_at_1_interval.low
    assert width > 1.8 * (
        spread.pass_at_1_interval.high - spread.pass_at_1_interval.low
    )


def test_all_passing_suite_still_has_an_interval_below_one() -> None:
    summary = summarise_suite(suite_trials(*[(3, 3)] * 20), k=3)
    interval = summary.pass_at_1_interval
    assert summary.effective_trials == 20
    assert interval.high == 1.0
    assert interval.low == pytest.approx(20 / (20 + z_value(0.95) ** 2))
    assert interval.contains(1.0)


def test_single_case_counts_as_one_observation() -> None:
    summary = summarise_suite(trials("only", 10, 5), k=5)
    assert summary.effective_trials == 1
    assert summary.pass_at_1_interval.low < 0.1
    assert summary.pass_at_1_interval.high > 0.9


def test_confidence_level_widens_the_interval_and_is_validated() -> None:
    outcomes = suite_trials((3, 3), (3, 1), (3, 2), (3, 0), (3, 3))
    at_90 = summarise_suite(outcomes, k=1, confidence=0.90).pass_at_1_interval
    at_99 = summarise_suite(outcomes, k=1, confidence=0.99).pass_at_1_interval
    assert at_99.low < at_90.low and at_90.high < at_99.high
    assert at_90.confidence == 0.90
    with pytest.raises(ValueError, match="confidence=1.5"):
        summarise_suite(outcomes, k=1, confidence=1.5)


def test_interval_covers_the_population_pass_rate_about_as_often_as_it_claims() -> None:
    # Seeded simulation: each suite draws 30 cases of uniform difficulty (population
    # pass@1 0.5) and runs each 3 times; the interval generalises over cases.
    import random

    rng = random.Random(27)
    covered = 0
    for _ in range(400):
        outcomes = []
        for i in range(30):
            p = rng.random()
            outcomes += trials(f"c{i}", 3, sum(rng.random() < p for _ in range(3)))
        covered += summarise_suite(outcomes, k=1).pass_at_1_interval.contains(0.5)
    assert 0.92 <= covered / 400 <= 0.98


def test_treating_trials_as_independent_would_undercover_clustered_suites() -> None:
    # The same simulation with all-or-nothing cases: a plain Wilson interval on
    # 90 trials misses the population rate far more often than the clustered one.
    import random

    rng = random.Random(9)
    clustered = naive = 0
    for _ in range(300):
        cases = [3 if rng.random() < 0.5 else 0 for _ in range(30)]
        summary = summarise_suite(suite_trials(*[(3, c) for c in cases]), k=1)
        clustered += summary.pass_at_1_interval.contains(0.5)
        naive += wilson_interval(summary.pass_at_1, 90, 0.95).contains(0.5)
    assert clustered / 300 >= 0.90
    assert naive / 300 < 0.80
