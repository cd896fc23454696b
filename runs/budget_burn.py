"""Reads for the budget's charts: the burn-down of each period limit with a
forecast of when it runs out, the ledger's recent reservations and the budget
extension requests with their outcomes. Tenant-scoped, aggregated by the
database (ORM, SQLite and PostgreSQL alike), never by loading every row.

The figures are the ledger's when the tenant has a budget (what its limits are
held to) and the runs' own counters otherwise (as `tenant_budget_usage`), so a
tenant sees its use before it sets any limit.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, FloatField, QuerySet, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.models import (
    PERIOD_DIMENSIONS,
    PERIODS,
    Budget,
    BudgetLedgerEntry,
)
from budgets.periods import ROLLING_WINDOWS, bucket_start
from budgets.selectors import budget_of
from controlplane.models import Tenant
from runs.models import Run
from runs.selectors import tenant_budget_usage
from runs.time_buckets import BucketKey, bucket_key

# A day's burn is drawn per hour, a month's per day.
STEP = {"day": "hour", "month": "day"}
_STEP_DELTA = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1)}
RECENT_LIMIT = 50


def period_bounds(
    mode: str, period: str, now: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """Where the period's window starts and where it ends: the next calendar
    boundary, or (rolling) now, the window moving with the clock."""
    if mode == Budget.PeriodMode.ROLLING:
        return bucket_start(mode, period, now - ROLLING_WINDOWS[period]), now
    start = bucket_start(mode, period, now)
    if period == "day":
        return start, start + dt.timedelta(days=1)
    month_later = (start + dt.timedelta(days=32)).replace(day=1)
    return start, month_later


def bucket_edges(start: dt.datetime, end: dt.datetime, step: str) -> list[dt.datetime]:
    """Every bucket start from `start` (truncated to `step`) up to `end`."""
    first = start.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)
    if step == "day":
        first = first.replace(hour=0)
    edges = []
    at = first
    while at < end:
        edges.append(at)
        at += _STEP_DELTA[step]
    return edges


def _amount(name: str) -> Any:
    """One dimension of a ledger entry's settled `actual` (JSON) as a number."""
    return Coalesce(Sum(Cast(KT(f"actual__{name}"), FloatField())), 0.0)


def _spend_per_bucket(
    tenant: Tenant, budget: Budget | None, start: dt.datetime, step: str
) -> dict[str, dict[str, float]]:
    """Use per bucket since `start`: the settled ledger with a budget (where
    the counters' use comes from), the runs' own counters without one."""
    bucket = BucketKey(F("created_at"), step)
    rows: QuerySet[Any]
    if budget is not None:
        rows = (
            BudgetLedgerEntry.objects.filter(
                tenant=tenant,
                created_at__gte=start,
                status=BudgetLedgerEntry.Status.SETTLED,
            )
            .annotate(at=bucket)
            .order_by()
            .values("at")
            .annotate(**{name: _amount(name) for name in PERIOD_DIMENSIONS})
        )
    else:
        rows = (
            Run.objects.filter(tenant=tenant, created_at__gte=start)
            .exclude(stop_reason="external")
            .annotate(at=bucket)
            .order_by()
            .values("at")
            .annotate(
                input_tokens=Sum("input_tokens"),
                output_tokens=Sum("output_tokens"),
                cost=Sum("cost"),
                runs=Count("id"),
            )
        )
    return {
        row["at"]: {name: float(row[name] or 0) for name in PERIOD_DIMENSIONS}
        for row in rows
    }


def _forecast(
    *,
    limit: float | None,
    used: float,
    reserved: float,
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
    rolling: bool,
) -> dict[str, Any]:
    """When the limit runs out at the period's average rate so far."""
    elapsed_hours = max((now - start).total_seconds() / 3600, 1 / 60)
    rate = used / elapsed_hours
    forecast: dict[str, Any] = {"rate_per_hour": rate, "runs_out_at": None}
    if limit is None:
        return {**forecast, "state": "no_limit"}
    left = limit - used - reserved
    if left <= 0:
        return {**forecast, "state": "exhausted"}
    if rate <= 0:
        return {**forecast, "state": "idle"}
    at = now + dt.timedelta(hours=left / rate)
    # A rolling window never resets: only a forecast within one window length
    # says anything (the oldest use leaves the window meanwhile).
    horizon = now + (end - start) if rolling else end
    if at >= horizon:
        return {**forecast, "state": "lasts"}
    return {**forecast, "state": "runs_out", "runs_out_at": at.isoformat()}


def burn_down_for(*, tenant: Tenant, now: dt.datetime | None = None) -> dict[str, Any]:
    """Per period: the buckets, and per dimension its limit, use, reservations,
    cumulative use per bucket and the forecast of when the limit runs out."""
    now = now or timezone.now()
    budget = budget_of(tenant)
    mode = budget.period_mode if budget else Budget.PeriodMode.CALENDAR
    limits = (budget.period_limits if budget else {}) or {}
    usage = tenant_budget_usage(tenant=tenant)
    periods: dict[str, Any] = {}
    for period in PERIODS:
        start, end = period_bounds(mode, period, now)
        step = STEP[period]
        edges = bucket_edges(start, now, step)
        spent = _spend_per_bucket(tenant, budget, edges[0], step)
        dims: dict[str, Any] = {}
        for name in PERIOD_DIMENSIONS:
            raw_limit = (limits.get(period) or {}).get(name)
            limit = None if raw_limit is None else float(raw_limit)
            running = 0.0
            cumulative = []
            for edge in edges:
                running += spent.get(bucket_key(edge, step), {}).get(name, 0.0)
                cumulative.append(running)
            used = float(Decimal(usage[period][name]["used"]))
            reserved = float(Decimal(usage[period][name]["reserved"]))
            dims[name] = {
                "limit": raw_limit if raw_limit is None else str(raw_limit),
                "used": usage[period][name]["used"],
                "reserved": usage[period][name]["reserved"],
                "cumulative": cumulative,
                "forecast": _forecast(
                    limit=limit,
                    used=used,
                    reserved=reserved,
                    start=start,
                    end=end,
                    now=now,
                    rolling=mode == Budget.PeriodMode.ROLLING,
                ),
            }
        periods[period] = {
            "start": start.isoformat(),
            "end": end.isoformat(),
            "step": step,
            "buckets": [edge.isoformat() for edge in edges],
            "dimensions": dims,
        }
    return {"period_mode": mode, "has_budget": budget is not None, "periods": periods}


def ledger_recent_for(
    *, tenant: Tenant, limit: int = RECENT_LIMIT
) -> list[dict[str, Any]]:
    """The tenant's latest reservations, newest first, with how each ended."""
    latest = BudgetLedgerEntry.objects.filter(tenant=tenant)
    entries = latest.order_by("-created_at")[:limit]
    return [
        {
            "id": str(entry.id),
            "run_id": str(entry.run_id),
            "step_index": entry.step_index,
            "kind": entry.kind,
            "status": entry.status,
            "reserved": entry.reserved,
            "actual": entry.actual,
            "from_grant": bool(entry.funding),
            "created_at": entry.created_at.isoformat(),
            "settled_at": entry.settled_at.isoformat() if entry.settled_at else None,
        }
        for entry in entries
    ]


def extension_requests_for(
    *, tenant: Tenant, limit: int = RECENT_LIMIT
) -> dict[str, Any]:
    """The budget extension requests, newest first, with their outcomes, and
    how many ended each way."""
    requests = ApprovalRequest.objects.filter(
        tenant=tenant, kind=ApprovalRequest.Kind.BUDGET_EXTENSION
    )
    outcomes = dict(
        requests.order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    latest = requests.select_related("decided_by", "run__agent").order_by(
        "-requested_at"
    )[:limit]
    return {
        "outcomes": {
            status: outcomes.get(status, 0) for status in ApprovalRequest.Status.values
        },
        "requests": [
            {
                "id": str(request.id),
                "run_id": str(request.run_id),
                "agent": request.run.agent.slug,
                "extension": request.extension or {},
                "status": request.status,
                "requested_at": request.requested_at.isoformat(),
                "expires_at": request.expires_at.isoformat(),
                "decided_by": request.decided_by.username
                if request.decided_by
                else None,
                "decided_at": request.decided_at.isoformat()
                if request.decided_at
                else None,
                "reason": request.reason,
            }
            for request in latest
        ],
    }


def budget_activity_for(*, tenant: Tenant) -> dict[str, Any]:
    return {
        "burn_down": burn_down_for(tenant=tenant),
        "ledger": ledger_recent_for(tenant=tenant),
        "extensions": extension_requests_for(tenant=tenant),
    }


__all__ = [
    "budget_activity_for",
    "burn_down_for",
    "extension_requests_for",
    "ledger_recent_for",
    "period_bounds",
]
