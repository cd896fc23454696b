"""The budget vector and check-before-spend (spec/loop-tools-protocol.md §1.8).

Every check happens before the spend: the (max+1)-th model call or tool call is
refused before it runs, with the exact stop reason. Before each model call the
output allowance is reserved first (a truncated answer is harder to detect than an
input overflow), then input tokens and cost are checked with that reservation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from typing import Any

from runs.engine.stop import StopReason

MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class BudgetVector:
    """Consumption (or a reservation) along every budget dimension."""

    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)  # in the tenant's currency (USD by default)
    wall_seconds: float = 0.0

    def __add__(self, other: BudgetVector) -> BudgetVector:
        return BudgetVector(
            steps=self.steps + other.steps,
            tool_calls=self.tool_calls + other.tool_calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost=self.cost + other.cost,
            wall_seconds=self.wall_seconds + other.wall_seconds,
        )

    def with_wall_seconds(self, wall_seconds: float) -> BudgetVector:
        return replace(self, wall_seconds=wall_seconds)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["cost"] = str(self.cost)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> BudgetVector:
        data = data or {}
        return cls(
            steps=int(data.get("steps", 0)),
            tool_calls=int(data.get("tool_calls", 0)),
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cost=Decimal(str(data.get("cost", "0"))),
            wall_seconds=float(data.get("wall_seconds", 0.0)),
        )


# The largest caps accepted: a count a database integer holds, and a cost that
# is still a finite float.
MAX_COUNT = 2**63 - 1
MAX_COST = Decimal(10**12)


@dataclass(frozen=True)
class BudgetLimits:
    """Caps per run; `None` means no cap on that dimension."""

    max_steps: int | None = None
    max_tool_calls: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost: Decimal | None = None
    max_wall_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["max_cost"] = None if self.max_cost is None else str(self.max_cost)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> BudgetLimits:
        """Parse caps; raises `ValueError` on unknown keys or negative values."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown budget limits: {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name in (
            "max_steps",
            "max_tool_calls",
            "max_input_tokens",
            "max_output_tokens",
        ):
            if data.get(name) is not None:
                value = data[name]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{name} must be a non-negative integer")
                if value > MAX_COUNT:
                    raise ValueError(f"{name} must be at most {MAX_COUNT}")
                values[name] = value
        if data.get("max_cost") is not None:
            cost = Decimal(str(data["max_cost"]))
            if not cost.is_finite() or cost < 0:
                raise ValueError("max_cost must be a non-negative number")
            if cost > MAX_COST:
                # Beyond a float (1e400 is inf), which spans and JSON cannot hold.
                raise ValueError(f"max_cost must be at most {MAX_COST}")
            values["max_cost"] = cost
        if data.get("max_wall_seconds") is not None:
            wall = data["max_wall_seconds"]
            if isinstance(wall, bool) or not isinstance(wall, int | float) or wall < 0:
                raise ValueError("max_wall_seconds must be a non-negative number")
            values["max_wall_seconds"] = float(wall)
        return cls(**values)


@dataclass(frozen=True)
class ModelPrice:
    """Price per million tokens."""

    input_per_million: Decimal = Decimal(0)
    output_per_million: Decimal = Decimal(0)

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        return (
            self.input_per_million * input_tokens
            + self.output_per_million * output_tokens
        ) / MILLION


FREE = ModelPrice()


def estimate_input_tokens(
    messages_json: str, tools: Sequence[Mapping[str, Any]] = ()
) -> int:
    """A cheap upper-ish estimate (about 4 characters a token) for the pre-check;
    `messages_json`: the messages encoded (`Transcript.messages_json`)."""
    chars = len(messages_json)
    chars += len(json.dumps(list(tools), ensure_ascii=False))
    return chars // 4 + 1


def model_call_reservation(
    *,
    reserve_output_tokens: int,
    estimated_input_tokens: int,
    price: ModelPrice = FREE,
) -> BudgetVector:
    """What a model call may spend: one step, the estimate in, the reservation out."""
    return BudgetVector(
        steps=1,
        input_tokens=estimated_input_tokens,
        output_tokens=reserve_output_tokens,
        cost=price.cost(estimated_input_tokens, reserve_output_tokens),
    )


def check_before_model_call(
    usage: BudgetVector,
    limits: BudgetLimits,
    *,
    reserve_output_tokens: int,
    estimated_input_tokens: int,
    price: ModelPrice = FREE,
) -> StopReason | None:
    """`None` if the next model call fits every cap, else the exact stop reason.

    Order: deadline, steps, output reservation, input tokens, cost.
    """
    if limits.max_wall_seconds is not None and (
        usage.wall_seconds >= limits.max_wall_seconds
    ):
        return StopReason.DEADLINE
    if limits.max_steps is not None and usage.steps + 1 > limits.max_steps:
        return StopReason.MAX_STEPS
    if limits.max_output_tokens is not None and (
        usage.output_tokens + reserve_output_tokens > limits.max_output_tokens
    ):
        return StopReason.MAX_TOKENS
    if limits.max_input_tokens is not None and (
        usage.input_tokens + estimated_input_tokens > limits.max_input_tokens
    ):
        return StopReason.MAX_TOKENS
    if limits.max_cost is not None and (
        usage.cost + price.cost(estimated_input_tokens, reserve_output_tokens)
        > limits.max_cost
    ):
        return StopReason.MAX_COST
    return None


def check_before_tool_call(
    usage: BudgetVector,
    limits: BudgetLimits,
    *,
    tool_cost: Decimal = Decimal(0),
) -> StopReason | None:
    """`None` if one more tool execution fits, else the exact stop reason."""
    if limits.max_wall_seconds is not None and (
        usage.wall_seconds >= limits.max_wall_seconds
    ):
        return StopReason.DEADLINE
    if limits.max_tool_calls is not None and (
        usage.tool_calls + 1 > limits.max_tool_calls
    ):
        return StopReason.MAX_TOOL_CALLS
    if limits.max_cost is not None and usage.cost + tool_cost > limits.max_cost:
        return StopReason.MAX_COST
    return None


def charge_model_call(
    usage: BudgetVector, input_tokens: int, output_tokens: int, price: ModelPrice
) -> BudgetVector:
    """Usage after a model call settles with its real token counts."""
    return usage + BudgetVector(
        steps=1,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=price.cost(input_tokens, output_tokens),
    )


def charge_tool_call(
    usage: BudgetVector, tool_cost: Decimal = Decimal(0)
) -> BudgetVector:
    """Usage after one tool execution."""
    return usage + BudgetVector(tool_calls=1, cost=tool_cost)
