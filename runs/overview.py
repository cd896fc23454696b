"""The overview dashboard's reads: one tenant's runs per time bucket by status,
p50/p95 run duration, approvals waiting and the median time to a decision, the
top agents and tools by cost and by failures, and each period limit's burn.

The runs' figures come from hourly rollups kept as runs end (runs/rollups.py):
30 days of 10,000 runs a day read ~30,000 rollup rows, not 300,000 runs
(bench/bench_ui_overview.py). Approvals are aggregated by the database with the
ORM (GROUP BY, and a window function for the median).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import (
    Count,
    F,
    Q,
    QuerySet,
    Window,
)
from django.db.models.functions import RowNumber
from django.utils import timezone

from approvals.models import ApprovalRequest
from controlplane.models import Tenant
from runs.budget_burn import bucket_edges, burn_down_for
from runs.models import Agent, Run
from runs.rollups import RunFigures, histogram_percentile, run_figures
from runs.time_buckets import BucketKey, SecondsBetween, bucket_key

MAX_RANGE = dt.timedelta(days=93)
# The finest step a range may ask for: hourly buckets up to a month.
MAX_HOURLY_RANGE = dt.timedelta(days=31)
DEFAULT_HOURLY_RANGE = dt.timedelta(days=7)
TOP = 5
# Nearest-rank percentiles: the p-th is the row whose rank r is the least with
# r * 100 >= p * n (integer arithmetic: no per-row function on SQLite).
PERCENTILES = (50, 95)


@dataclass(frozen=True)
class OverviewWindow:
    start: dt.datetime
    end: dt.datetime
    step: str  # hour | day


class OverviewInputError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def overview_window(
    *,
    start: dt.datetime | None,
    end: dt.datetime | None,
    step: str | None,
    now: dt.datetime | None = None,
) -> OverviewWindow:
    """The window asked for (default: the last 24 hours) and its step (hours
    up to a week, days beyond unless hours are asked for)."""
    now = now or timezone.now()
    end = end or now
    start = start or end - dt.timedelta(hours=24)
    if start >= end:
        raise OverviewInputError("from", "must be before `to`")
    span = end - start
    if span > MAX_RANGE:
        raise OverviewInputError("from", f"the range is at most {MAX_RANGE.days} days")
    if step is None:
        step = "hour" if span <= DEFAULT_HOURLY_RANGE else "day"
    if step not in ("hour", "day"):
        raise OverviewInputError("step", "must be `hour` or `day`")
    if step == "hour" and span > MAX_HOURLY_RANGE:
        raise OverviewInputError(
            "step", f"hourly buckets cover at most {MAX_HOURLY_RANGE.days} days"
        )
    return OverviewWindow(start=start, end=end, step=step)


def _bucket(field: str, step: str) -> BucketKey:
    return BucketKey(F(field), step)


def _index(edges: list[dt.datetime], step: str) -> dict[str, int]:
    return {bucket_key(edge, step): i for i, edge in enumerate(edges)}


def _percentile_rows(
    rows: QuerySet[Any], value: Any, partition: Any | None
) -> dict[Any, dict[int, float]]:
    """The nearest-rank percentiles of `value` per `partition` (None: over all
    rows), found by the database: rank the rows, keep the ranks that are a
    percentile of their partition's count. Key 0 holds that count."""
    by = [partition] if partition is not None else None
    ranked = rows.annotate(
        v=value,
        p=partition if partition is not None else F("pk"),
        rank=Window(RowNumber(), partition_by=by, order_by=value.asc()),
        n=Window(Count("pk"), partition_by=by),
    )
    wanted = Q()
    for pct in PERCENTILES:
        wanted |= Q(rank__gte=pct * F("n") / 100.0, rank__lt=pct * F("n") / 100.0 + 1)
    found: dict[Any, dict[int, float]] = {}
    for key, rank, n, measured in ranked.filter(wanted).values_list(
        "p", "rank", "n", "v"
    ):
        found.setdefault(key if partition is not None else None, {})[0] = n
        for pct in PERCENTILES:
            if rank * 100 >= pct * n and (rank - 1) * 100 < pct * n:
                found.setdefault(key if partition is not None else None, {})[pct] = (
                    float(measured)
                )
    return found


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _runs_part(figures: RunFigures, keys: list[str]) -> dict[str, Any]:
    by_status = {
        status: [figures.runs[(key, status)] for key in keys]
        for status in Run.Status.values
    }
    totals = {status: sum(counts) for status, counts in by_status.items()}
    return {"by_status": by_status, "totals": totals, "total": sum(totals.values())}


def _duration_part(figures: RunFigures, keys: list[str]) -> dict[str, Any]:
    overall: Counter[int] = Counter()
    for histogram in figures.durations.values():
        overall.update(histogram)

    def at(histogram: Counter[int], pct: int) -> int | None:
        found = histogram_percentile(histogram, pct)
        return None if found is None else round(found)

    return {
        "count": sum(overall.values()),
        "p50_ms": at(overall, 50),
        "p95_ms": at(overall, 95),
        "p50_ms_series": [
            at(figures.durations.get(key, Counter()), 50) for key in keys
        ],
        "p95_ms_series": [
            at(figures.durations.get(key, Counter()), 95) for key in keys
        ],
    }


def _approvals_part(
    tenant: Tenant, window: OverviewWindow, edges: list[dt.datetime]
) -> dict[str, Any]:
    requests = ApprovalRequest.objects.filter(tenant=tenant)
    pending = requests.filter(status=ApprovalRequest.Status.PENDING)
    oldest = pending.order_by("requested_at").values_list("requested_at", flat=True)
    decided = requests.filter(
        decided_at__isnull=False,
        decided_at__gte=window.start,
        decided_at__lt=window.end,
    )
    wait = SecondsBetween(F("requested_at"), F("decided_at"))
    median = _percentile_rows(decided, wait, None).get(None, {}).get(50)
    index = _index(edges, window.step)
    requested = [0] * len(edges)
    for at, n in (
        requests.filter(requested_at__gte=window.start, requested_at__lt=window.end)
        .annotate(at=_bucket("requested_at", window.step))
        .order_by()
        .values_list("at")
        .annotate(n=Count("id"))
    ):
        if at in index:
            requested[index[at]] = n
    first = oldest.first()
    return {
        "waiting": pending.count(),
        "oldest_waiting_since": first.isoformat() if first else None,
        "decided": decided.count(),
        "median_decision_ms": _ms(median),
        "requested_series": requested,
    }


def _agents_part(figures: RunFigures) -> dict[str, Any]:
    named = {
        pk: (slug, name)
        for pk, slug, name in Agent.objects.filter(
            pk__in=list(figures.agents)
        ).values_list("pk", "slug", "name")
    }
    shaped: list[dict[str, Any]] = [
        {
            "agent": named.get(agent_id, ("", ""))[0],
            "name": named.get(agent_id, ("", ""))[1],
            "runs": agent.runs,
            "cost": float(agent.cost),
            "failed": agent.failed,
        }
        for agent_id, agent in figures.agents.items()
        if agent.runs > 0
    ]
    return {
        "by_cost": sorted(
            (r for r in shaped if r["cost"] > 0), key=lambda r: (-r["cost"], r["agent"])
        )[:TOP],
        "by_failures": sorted(
            (r for r in shaped if r["failed"] > 0),
            key=lambda r: (-r["failed"], r["agent"]),
        )[:TOP],
    }


def _tools_part(figures: RunFigures) -> dict[str, Any]:
    tools = figures.tools.items()
    by_cost = sorted(
        ((tool, t) for tool, t in tools if t.cost > 0), key=lambda i: (-i[1].cost, i[0])
    )
    by_failures = sorted(
        ((tool, t) for tool, t in tools if t.failed > 0),
        key=lambda i: (-i[1].failed, i[0]),
    )
    return {
        "by_cost": [
            {"tool": tool, "calls": t.calls, "cost": float(t.cost)}
            for tool, t in by_cost[:TOP]
        ],
        "by_failures": [
            {"tool": tool, "calls": t.calls, "failed": t.failed}
            for tool, t in by_failures[:TOP]
        ],
    }


def overview_for(*, tenant: Tenant, window: OverviewWindow) -> dict[str, Any]:
    """Every figure of the dashboard for the tenant over the window."""
    edges = bucket_edges(window.start, window.end, window.step)
    keys = list(_index(edges, window.step))
    figures = run_figures(
        tenant=tenant, start=window.start, end=window.end, step=window.step
    )
    return {
        "from": window.start.isoformat(),
        "to": window.end.isoformat(),
        "step": window.step,
        "buckets": [edge.isoformat() for edge in edges],
        "runs": _runs_part(figures, keys),
        "duration": _duration_part(figures, keys),
        "approvals": _approvals_part(tenant, window, edges),
        "agents": _agents_part(figures),
        "tools": _tools_part(figures),
        "budgets": burn_down_for(tenant=tenant),
    }
