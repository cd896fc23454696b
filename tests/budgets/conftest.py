from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.db.models import Sum

from budgets.models import Budget, BudgetCounter, ModelPriceEntry
from runs.engine.contracts import (
    Effect,
    Idempotency,
    ToolContract,
    ToolCost,
    ToolSource,
)
from runs.engine.tools import Tool
from runs.tools import registry
from tests.runs.conftest import (  # noqa: F401 (fixtures)
    demo_agent,
    drive_run,
    scripted_agent,
    shop,
)

# The scripted model costs $0.001 per input token and $0.002 per output token.
SCRIPTED_PRICE = {"input": Decimal("1000"), "output": Decimal("2000")}


@pytest.fixture
def make_budget() -> Any:
    def build(tenant: Any, **fields: Any) -> Budget:
        budget, _ = Budget.objects.update_or_create(tenant=tenant, defaults=fields)
        return budget

    return build


def counter_sums(period: str, **filters: Any) -> SimpleNamespace:
    """The period's counters summed (one bucket in these tests)."""
    fields = [
        f"{state}_{name}"
        for state in ("used", "reserved")
        for name in ("input_tokens", "output_tokens", "cost", "runs")
    ]
    sums = BudgetCounter.objects.filter(period=period, **filters).aggregate(
        **{field: Sum(field) for field in fields}
    )
    return SimpleNamespace(**{field: sums[field] or 0 for field in fields})


@pytest.fixture
def scripted_price(db: Any) -> ModelPriceEntry:
    return ModelPriceEntry.objects.create(
        model="scripted",
        input_per_million=SCRIPTED_PRICE["input"],
        cached_input_per_million=Decimal("500"),
        output_per_million=SCRIPTED_PRICE["output"],
    )


@pytest.fixture
def small_reservations(settings: Any) -> None:
    """Each model call reserves 100 output tokens (about $0.2 with the input)."""
    settings.RUN_RESERVE_OUTPUT_TOKENS = 100


@pytest.fixture
def paid_tool(monkeypatch: Any) -> list[dict[str, Any]]:
    """A tool declaring a cost of 50 cents; the list records each time it ran."""
    ran: list[dict[str, Any]] = []

    def handler(arguments: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ran.append(arguments)
        return {"ok": True}

    tool = Tool(
        ToolContract(
            name="paid_lookup",
            description="A lookup that costs 50 cents.",
            input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
            effect=Effect.READ_ONLY,
            idempotency=Idempotency.NATURAL,
            cost=ToolCost(money_cents=50),
            source=ToolSource.BUILTIN,
        ),
        handler,
        timeout_seconds=None,
    )
    monkeypatch.setitem(registry.BUILTIN_TOOLS, "paid_lookup", tool)
    return ran
