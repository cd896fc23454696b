"""Model prices: the tenant's row, else the global row, else the settings default."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from budgets.models import ModelPriceEntry
from controlplane.rows import ColumnOf, OrNull, Select, instances_select
from runs.engine.budget import ModelPrice


@dataclass(frozen=True)
class PriceLookup:
    price: ModelPrice
    known: bool
    cached_input_per_million: Decimal = Decimal(0)


def model_price_for(*, model: str, tenant_id: Any) -> PriceLookup:
    """The tenant's row, else the global row, else the settings default, else unknown.

    An unknown price counts tokens at zero cost; whether the run may go on is
    decided at reservation time (the cost cannot be bounded).
    """
    return model_price_of(
        model_price_select(model=model, tenant_id=tenant_id).run(), model=model
    )


def model_price_select(*, model: str | ColumnOf, tenant_id: Any) -> Select:
    """`model_price_for`'s query, to run with others; `model` may be read by it
    (the model an agent names: `ColumnOf(Agent, "model", agent_id)`)."""
    return instances_select(
        ModelPriceEntry, {"tenant": OrNull(tenant_id), "model": model}
    )


def model_price_of(rows: list[ModelPriceEntry], *, model: str) -> PriceLookup:
    """`model_price_for` from what `model_price_select` found."""
    row = next((r for r in rows if r.tenant_id is not None), None) or next(
        iter(rows), None
    )
    if row is not None:
        return PriceLookup(
            ModelPrice(row.input_per_million, row.output_per_million),
            True,
            row.cached_input_per_million,
        )
    default = settings.BUDGET_DEFAULT_PRICES.get(model)
    if default is not None:
        return PriceLookup(
            ModelPrice(Decimal(default[0]), Decimal(default[2])),
            True,
            Decimal(default[1]),
        )
    return PriceLookup(ModelPrice(), False)
