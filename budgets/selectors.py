"""Reads of the ledger: a tenant's budget, and the use in its windows."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db.models import F, Sum

from budgets.models import PERIOD_DIMENSIONS, Budget, BudgetCounter, BudgetGrant
from budgets.periods import window_filter
from controlplane.models import Tenant

_MICRO = Decimal("0.000001")


def window_totals(
    tenant_id: Any, mode: str, period: str, now: dt.datetime
) -> dict[str, Decimal]:
    """Used + reserved per dimension over the period's window, against the
    tenant's limit (what runs reserved from their own grants is not in it)."""
    sums = BudgetCounter.objects.filter(
        window_filter(mode, period, now), tenant_id=tenant_id
    ).aggregate(
        **{
            name: Sum(F(f"used_{name}") + F(f"reserved_{name}"))
            for name in PERIOD_DIMENSIONS
        }
    )
    return {name: Decimal(str(sums[name] or 0)) for name in PERIOD_DIMENSIONS}


def window_usage(
    tenant_id: Any, mode: str, period: str, now: dt.datetime
) -> dict[str, dict[str, str]]:
    """Used and reserved per dimension in the window, grants included."""
    sums = BudgetCounter.objects.filter(
        window_filter(mode, period, now), tenant_id=tenant_id
    ).aggregate(
        **{
            f"{state}_{name}": Sum(f"{state}_{name}")
            for name in PERIOD_DIMENSIONS
            for state in ("used", "reserved")
        }
    )
    granted = (
        BudgetGrant.objects.filter(
            window_filter(mode, period, now), tenant_id=tenant_id
        )
        .values("dimension")
        .annotate(used=Sum("used"), reserved=Sum("reserved"))
    )
    extra = {row["dimension"]: row for row in granted}
    usage: dict[str, dict[str, str]] = {}
    for name in PERIOD_DIMENSIONS:
        usage[name] = {}
        for state in ("used", "reserved"):
            counted = sums[f"{state}_{name}"] or 0
            granted_here = extra.get(name, {}).get(state)
            if granted_here:
                total = Decimal(str(counted)) + granted_here
                counted = total.quantize(_MICRO) if name == "cost" else int(total)
            usage[name][state] = str(counted)
    return usage


def budget_of(tenant: Tenant | Any) -> Budget | None:
    """The tenant's budget, or None (nothing is limited)."""
    tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
    return Budget.objects.filter(tenant_id=tenant_id).first()
