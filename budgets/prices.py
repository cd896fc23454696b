"""Model prices: the tenant's row, else the global row, else the settings default."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q

from budgets.models import PERIODS, Budget, ModelPriceEntry
from runs.engine.budget import ModelPrice


@dataclass(frozen=True)
class PriceLookup:
    price: ModelPrice
    known: bool
    cached_input_per_million: Decimal = Decimal(0)
    context_window_tokens: int | None = None  # the price table's, if it says


def model_price_for(*, model: str, tenant_id: Any) -> PriceLookup:
    """The tenant's row, else the global row, else the settings default, else unknown.

    An unknown price counts tokens at zero cost; whether the run may go on is
    decided at reservation time (the cost cannot be bounded).
    """
    rows = list(
        ModelPriceEntry.objects.filter(
            Q(tenant_id=tenant_id) | Q(tenant__isnull=True), model=model
        )
    )
    row = next((r for r in rows if r.tenant_id is not None), None) or next(
        iter(rows), None
    )
    if row is not None:
        return PriceLookup(
            ModelPrice(row.input_per_million, row.output_per_million),
            True,
            row.cached_input_per_million,
            row.context_window_tokens,
        )
    default = settings.BUDGET_DEFAULT_PRICES.get(model)
    if default is not None:
        return PriceLookup(
            ModelPrice(Decimal(default[0]), Decimal(default[2])),
            True,
            Decimal(default[1]),
        )
    return PriceLookup(ModelPrice(), False)


def unknown_price_refused(*, budget: Budget | None, run_limits: Any) -> bool:
    """Whether a model of unknown price may not be called for a run with these
    limits: a cost cap (the run's or a period's) could not be kept, unless the
    tenant allows unknown prices."""
    if budget is not None and budget.allow_unknown_price:
        return False
    period_cost = budget is not None and any(
        (budget.period_limits.get(period) or {}).get("cost") is not None
        for period in PERIODS
    )
    return bool(period_cost or (run_limits or {}).get("max_cost") is not None)
