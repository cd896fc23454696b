from __future__ import annotations

from decimal import Decimal

import pytest

from runs.engine.budget import (
    BudgetLimits,
    BudgetVector,
    ModelPrice,
    charge_model_call,
    charge_tool_call,
    check_before_model_call,
    check_before_tool_call,
    model_call_reservation,
)
from runs.engine.stop import StopReason

PRICE = ModelPrice(input_per_million=Decimal("3"), output_per_million=Decimal("15"))


def model_check(usage: BudgetVector, limits: BudgetLimits) -> StopReason | None:
    return check_before_model_call(
        usage,
        limits,
        reserve_output_tokens=500,
        estimated_input_tokens=1000,
        price=PRICE,
    )


def test_no_limits_never_stops() -> None:
    assert model_check(BudgetVector(steps=10_000), BudgetLimits()) is None


def test_the_step_after_the_last_allowed_is_refused_before_the_call() -> None:
    limits = BudgetLimits(max_steps=10)
    assert model_check(BudgetVector(steps=9), limits) is None
    assert model_check(BudgetVector(steps=10), limits) is StopReason.MAX_STEPS


def test_output_reservation_that_does_not_fit_stops_with_max_tokens() -> None:
    limits = BudgetLimits(max_output_tokens=2000)
    assert model_check(BudgetVector(output_tokens=1500), limits) is None
    assert (
        model_check(BudgetVector(output_tokens=1501), limits) is StopReason.MAX_TOKENS
    )


def test_input_estimate_that_does_not_fit_stops_with_max_tokens() -> None:
    limits = BudgetLimits(max_input_tokens=5000)
    assert model_check(BudgetVector(input_tokens=4000), limits) is None
    assert model_check(BudgetVector(input_tokens=4001), limits) is StopReason.MAX_TOKENS


def test_cost_including_the_reservation_stops_with_max_cost() -> None:
    # The call may cost 1000 * 3/1e6 + 500 * 15/1e6 = 0.0105.
    limits = BudgetLimits(max_cost=Decimal("0.05"))
    assert model_check(BudgetVector(cost=Decimal("0.0395")), limits) is None
    assert (
        model_check(BudgetVector(cost=Decimal("0.0396")), limits) is StopReason.MAX_COST
    )


def test_deadline_stops_first() -> None:
    limits = BudgetLimits(max_steps=1, max_wall_seconds=60)
    usage = BudgetVector(steps=1, wall_seconds=60.0)
    assert model_check(usage, limits) is StopReason.DEADLINE


def test_output_reservation_is_checked_before_input_and_cost() -> None:
    limits = BudgetLimits(
        max_output_tokens=100, max_input_tokens=10, max_cost=Decimal(0)
    )
    assert model_check(BudgetVector(), limits) is StopReason.MAX_TOKENS


def test_tool_call_after_the_last_allowed_is_refused() -> None:
    limits = BudgetLimits(max_tool_calls=3)
    assert check_before_tool_call(BudgetVector(tool_calls=2), limits) is None
    assert (
        check_before_tool_call(BudgetVector(tool_calls=3), limits)
        is StopReason.MAX_TOOL_CALLS
    )


def test_tool_money_cost_counts_against_max_cost() -> None:
    limits = BudgetLimits(max_cost=Decimal("1.00"))
    usage = BudgetVector(cost=Decimal("0.90"))
    assert check_before_tool_call(usage, limits, tool_cost=Decimal("0.10")) is None
    assert (
        check_before_tool_call(usage, limits, tool_cost=Decimal("0.11"))
        is StopReason.MAX_COST
    )


def test_charges_add_up_exactly() -> None:
    usage = charge_model_call(BudgetVector(), 1000, 500, PRICE)
    usage = charge_tool_call(usage, Decimal("0.25"))
    assert usage == BudgetVector(
        steps=1,
        tool_calls=1,
        input_tokens=1000,
        output_tokens=500,
        cost=Decimal("0.2605"),
    )


def test_reservation_is_one_step_with_the_estimate_and_the_output_allowance() -> None:
    reservation = model_call_reservation(
        reserve_output_tokens=500, estimated_input_tokens=1000, price=PRICE
    )
    assert reservation == BudgetVector(
        steps=1, input_tokens=1000, output_tokens=500, cost=Decimal("0.0105")
    )


def test_budget_vector_round_trips() -> None:
    usage = BudgetVector(3, 2, 100, 50, Decimal("0.0123"), 1.5)
    assert BudgetVector.from_dict(usage.to_dict()) == usage


def test_limits_round_trip_and_reject_unknown_or_negative_caps() -> None:
    limits = BudgetLimits(max_steps=5, max_cost=Decimal("2.5"), max_wall_seconds=30.0)
    assert BudgetLimits.from_dict(limits.to_dict()) == limits
    with pytest.raises(ValueError, match="unknown budget limits: max_turns"):
        BudgetLimits.from_dict({"max_turns": 3})
    with pytest.raises(ValueError, match="max_steps"):
        BudgetLimits.from_dict({"max_steps": -1})
    with pytest.raises(ValueError, match="max_steps"):
        BudgetLimits.from_dict({"max_steps": True})
    with pytest.raises(ValueError, match="max_cost"):
        BudgetLimits.from_dict({"max_cost": "NaN"})
