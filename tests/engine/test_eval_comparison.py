"""Comparing two eval runs paired by case: flips, deltas, intervals, the warning."""

from __future__ import annotations

import pytest

from runs.engine.eval_comparison import (
    Flip,
    compare_suites,
    minimum_detectable_difference,
    sample_size_warning,
)
from runs.engine.eval_metrics import summarise_suite
from tests.engine.eval_trials import suite_trials, trials


def twenty_by_three(
    improved: int,
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """15 cases always pass, 5 pass one trial in 3; `improved` of those gain a trial."""
    before = [(3, 3)] * 15 + [(3, 1)] * 5
    after = [(3, 3)] * 15 + [(3, 2)] * improved + [(3, 1)] * (5 - improved)
    return before, after


def test_twenty_cases_by_three_trials_cannot_show_a_three_point_gain() -> None:
    before, after = twenty_by_three(improved=2)
    comparison = compare_suites(
        summarise_suite(suite_trials(*before), k=3),
        summarise_suite(suite_trials(*after), k=3),
    )
    assert comparison.pass_at_1.delta == pytest.approx(2 / 60)  # +3.3 points
    assert comparison.minimum_detectable_difference == pytest.approx(0.217, abs=1e-3)
    assert comparison.warning == (
        "20 cases × 3 trials cannot show a 3-point gain "
        "(it would need about 22 points or 850 cases)"
    )


def test_a_claimed_three_point_gain_from_twenty_by_three_is_warned_about() -> None:
    warning = sample_size_warning(cases=20, trials=3, delta=0.03, detectable=0.217)
    assert warning is not None
    assert warning.startswith("20 cases × 3 trials cannot show a 3-point gain")
    # 20 * (0.217 / 0.03)^2 = 1046.5 -> 1,047 -> about 1,100
    assert warning.endswith("(it would need about 22 points or 1,100 cases)")


def test_no_warning_when_the_difference_exceeds_what_the_sample_can_detect() -> None:
    before = summarise_suite(suite_trials(*[(5, 0)] * 60, *[(5, 5)] * 40), k=5)
    after = summarise_suite(suite_trials(*[(5, 5)] * 100), k=5)
    comparison = compare_suites(before, after)
    assert comparison.pass_at_1.delta == pytest.approx(0.6)
    assert comparison.minimum_detectable_difference < 0.6
    assert comparison.warning is None
    assert comparison.pass_at_1.interval is not None
    assert comparison.pass_at_1.interval.low > 0


def test_no_difference_gives_no_warning_but_a_nonzero_interval() -> None:
    summary = summarise_suite(suite_trials(*[(3, 3)] * 20), k=3)
    comparison = compare_suites(summary, summary)
    assert comparison.pass_at_1.delta == 0
    assert comparison.warning is None
    interval = comparison.pass_at_1.interval
    assert interval is not None
    # the trial-level floor keeps two all-passing runs from claiming certainty
    assert interval.low < -0.1 and interval.high > 0.1
    assert comparison.flips == ()


def test_a_small_drop_is_warned_about_as_a_drop() -> None:
    before, after = twenty_by_three(improved=1)
    comparison = compare_suites(
        summarise_suite(suite_trials(*after), k=3),
        summarise_suite(suite_trials(*before), k=3),
    )
    assert comparison.warning is not None
    assert "cannot show a 2-point drop" in comparison.warning


def test_flips_are_pass_at_1_moves_of_at_least_the_threshold() -> None:
    before = summarise_suite(
        trials("broke", 3, 3) + trials("dipped", 3, 3) + trials("fixed", 3, 0), k=3
    )
    after = summarise_suite(
        trials("broke", 3, 1) + trials("dipped", 3, 2) + trials("fixed", 3, 3), k=3
    )
    comparison = compare_suites(before, after)
    assert [(f.case_id, f.direction) for f in comparison.flips] == [
        ("broke", Flip.REGRESSED),
        ("fixed", Flip.FIXED),
    ]
    assert comparison.regressions[0].before == 1.0
    assert comparison.regressions[0].after == pytest.approx(1 / 3)
    strict = compare_suites(before, after, flip_threshold=1.0)
    assert [(f.case_id, f.direction) for f in strict.flips] == [("fixed", Flip.FIXED)]
    loose = compare_suites(before, after, flip_threshold=0.3)
    assert [f.case_id for f in loose.regressions] == ["broke", "dipped"]


def test_one_trial_per_case_flips_exactly_on_pass_becoming_fail() -> None:
    before = summarise_suite(trials("a", 1, 1) + trials("b", 1, 0), k=1)
    after = summarise_suite(trials("a", 1, 0) + trials("b", 1, 0), k=1)
    flips = compare_suites(before, after).flips
    assert [(f.case_id, f.direction) for f in flips] == [("a", Flip.REGRESSED)]


def test_flip_threshold_must_be_a_fraction() -> None:
    summary = summarise_suite(trials("a", 1, 1), k=1)
    with pytest.raises(ValueError, match="flip_threshold=0"):
        compare_suites(summary, summary, flip_threshold=0)


def test_only_common_cases_are_compared_and_the_rest_listed() -> None:
    before = summarise_suite(trials("kept", 2, 2) + trials("dropped", 2, 0), k=2)
    after = summarise_suite(trials("new", 2, 0) + trials("kept", 2, 1), k=2)
    comparison = compare_suites(before, after)
    assert comparison.cases_compared == ("kept",)
    assert comparison.cases_added == ("new",)
    assert comparison.cases_removed == ("dropped",)
    assert comparison.pass_at_1.before == 1.0
    assert comparison.pass_at_1.after == 0.5


def test_runs_with_no_case_in_common_are_refused() -> None:
    with pytest.raises(ValueError, match="no case in common"):
        compare_suites(
            summarise_suite(trials("a", 1, 1), k=1),
            summarise_suite(trials("b", 1, 1), k=1),
        )


def test_k_defaults_to_the_smaller_k_and_pass_at_k_uses_it() -> None:
    before = summarise_suite(trials("a", 5, 3), k=2)
    after = summarise_suite(trials("a", 5, 4), k=5)
    comparison = compare_suites(before, after)
    assert comparison.k == 2
    assert comparison.pass_at_k.before == pytest.approx(0.9)
    assert comparison.pass_at_k.after == pytest.approx(1.0)
    assert comparison.pass_hat_k.before == pytest.approx(0.3)
    assert comparison.pass_hat_k.after == pytest.approx(0.6)  # C(4,2)/C(5,2)
    with pytest.raises(ValueError, match=r"k=4 is more than the 3 trials"):
        compare_suites(before, summarise_suite(trials("a", 3, 3), k=3), k=4)


def test_cost_latency_tokens_and_steps_deltas_are_paired_means() -> None:
    before = summarise_suite(
        trials("a", 2, 2, cost="0.01", latency_ms=1000, tokens=100, steps=2)
        + trials("b", 2, 2, cost="0.03", latency_ms=3000, tokens=300, steps=4),
        k=1,
    )
    after = summarise_suite(
        trials("a", 2, 2, cost="0.02", latency_ms=1500, tokens=150, steps=3)
        + trials("b", 2, 2, cost="0.04", latency_ms=3500, tokens=350, steps=5),
        k=1,
    )
    comparison = compare_suites(before, after)
    assert comparison.cost.delta == pytest.approx(0.01)
    assert comparison.latency_ms.delta == pytest.approx(500)
    assert comparison.tokens.delta == pytest.approx(50)
    assert comparison.steps.delta == pytest.approx(1)
    assert comparison.cost.before == pytest.approx(0.02)
    # every case moved by the same amount: the paired interval is that amount
    assert comparison.latency_ms.interval is not None
    assert comparison.latency_ms.interval.low == pytest.approx(500)


def test_one_common_case_has_no_interval_for_cost() -> None:
    before = summarise_suite(trials("a", 2, 2), k=1)
    after = summarise_suite(trials("a", 2, 2, cost="0.05"), k=1)
    comparison = compare_suites(before, after)
    assert comparison.cost.interval is None
    assert comparison.pass_at_1.interval is not None  # the trial-level floor


def test_paired_interval_is_narrower_than_treating_runs_as_independent() -> None:
    # Cases differ a lot in difficulty but each moves by the same small amount:
    # pairing removes the between-case spread.
    before_cases = [(10, c) for c in (0, 2, 4, 6, 8) * 8]
    after_cases = [(10, c + 2) for _, c in before_cases]
    comparison = compare_suites(
        summarise_suite(suite_trials(*before_cases), k=1),
        summarise_suite(suite_trials(*after_cases), k=1),
    )
    interval = comparison.pass_at_1.interval
    assert interval is not None
    assert comparison.pass_at_1.delta == pytest.approx(0.2)
    assert interval.low > 0.1
    assert comparison.warning is None


def test_minimum_detectable_difference_at_95_and_80_percent() -> None:
    assert minimum_detectable_difference(0.1) == pytest.approx(0.28016, abs=1e-4)
    assert minimum_detectable_difference(0.1, power=0.9) == pytest.approx(
        0.32415, abs=1e-4
    )
    with pytest.raises(ValueError, match="power=1"):
        minimum_detectable_difference(0.1, power=1)
