"""The ledger's vocabulary: amounts, refusals, and the buckets a period counts."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Q

from budgets.models import Budget

ROLLING_WINDOWS = {"day": dt.timedelta(hours=24), "month": dt.timedelta(days=30)}


@dataclass(frozen=True)
class Amounts:
    """What a reservation holds or a settlement spent, per period dimension."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    runs: int = 0

    def get(self, dimension: str) -> Any:
        return getattr(self, dimension)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": str(self.cost),
            "runs": self.runs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Amounts:
        data = data or {}
        return cls(
            input_tokens=int(data.get("input_tokens", 0)),
            output_tokens=int(data.get("output_tokens", 0)),
            cost=Decimal(str(data.get("cost", "0"))),
            runs=int(data.get("runs", 0)),
        )


@dataclass(frozen=True)
class BudgetRefusal:
    """A reservation that would cross a limit; `dimension` is the exact one.

    For a period limit, `period` and `name` say which; `limit` is what the run
    was held to (the tenant's limit, or its own grant), `total` what was used or
    reserved against it and `wanted` what the reservation needed. `needed` is
    the least extension (of the run's grant) that would let it through.
    """

    dimension: str  # e.g. "tenant_cost_per_day"
    detail: str
    period: str = ""
    name: str = ""
    limit: Decimal = Decimal(0)
    total: Decimal = Decimal(0)
    wanted: Decimal = Decimal(0)
    needed: Decimal = Decimal(0)


def refusal_dimension(dimension: str, period: str) -> str:
    return f"tenant_{dimension}_per_{period}"


def bucket_start(mode: str, period: str, now: dt.datetime) -> dt.datetime:
    now = now.astimezone(dt.UTC)
    if mode == Budget.PeriodMode.ROLLING:
        if period == "day":
            return now.replace(minute=0, second=0, microsecond=0)
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def window_filter(mode: str, period: str, now: dt.datetime) -> Q:
    """The buckets that count for `period` at `now` (conservative at the edges)."""
    if mode == Budget.PeriodMode.ROLLING:
        return Q(period=period, bucket_start__gte=_window_oldest(mode, period, now))
    return Q(period=period, bucket_start=bucket_start(mode, period, now))


def _window_oldest(mode: str, period: str, now: dt.datetime) -> dt.datetime:
    """The start of the oldest bucket in `period`'s rolling window at `now`."""
    return bucket_start(mode, period, now - ROLLING_WINDOWS[period])


def limits_of_period(
    period_limits: dict[str, Any] | None, period: str
) -> dict[str, Any]:
    """The period's limits as numbers (int for counts, Decimal for cost)."""
    raw = (period_limits or {}).get(period) or {}
    return {
        name: Decimal(str(value)) if name == "cost" else int(value)
        for name, value in raw.items()
        if value is not None
    }
