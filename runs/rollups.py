"""The overview's run figures over a window: read from hourly rollups kept as
runs end (runs/services/rollups.py) and, for what those do not hold, from the
runs themselves: the window's partial first and last hour, and the runs of its
whole hours still pending (not ended, or ended since the last rollup pass).

30 days of 10,000 runs a day are then ~30,000 rollup rows and a few hundred
runs instead of 300,000 runs (bench/bench_ui_overview.py).

Durations are counted in a log histogram of BUCKETS_PER_DOUBLING buckets per
doubling: a percentile is the middle of its bucket, within 4.4% of the exact
nearest-rank value.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import (
    Count,
    F,
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from budgets.models import BudgetLedgerEntry
from controlplane.models import Tenant
from runs.models import (
    Run,
    RunDurationRollup,
    RunHourRollup,
    ToolCall,
    ToolHourRollup,
)
from runs.time_buckets import BucketKey, bucket_key

BUCKETS_PER_DOUBLING = 8
TOOL_FAILURES = (ToolCall.Status.FAILED, ToolCall.Status.UNKNOWN)
HOUR = dt.timedelta(hours=1)

# What a run's share is computed from (RunShare.of reads these fields).
SHARE_FIELDS = (
    "id",
    "tenant_id",
    "agent_id",
    "status",
    "cost",
    "created_at",
    "started_at",
    "finished_at",
    "rollup_status",
    "rollup_cost",
    "rollup_duration",
)


def duration_bucket(seconds: float) -> int:
    """The histogram bucket of a duration (anything under 1 ms is bucket 0)."""
    ms = max(seconds * 1000.0, 1.0)
    return int(math.floor(math.log2(ms) * BUCKETS_PER_DOUBLING))


def bucket_ms(bucket: int) -> float:
    """The geometric middle of a bucket, in milliseconds."""
    return float(2 ** ((bucket + 0.5) / BUCKETS_PER_DOUBLING))


def histogram_percentile(histogram: Counter[int], pct: int) -> float | None:
    """The nearest-rank `pct`-th percentile of the histogram, in milliseconds."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen * 100 >= pct * total:
            return bucket_ms(bucket)
    return None


def hour_of(at: dt.datetime) -> dt.datetime:
    return at.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class RunShare:
    """What one run adds to the figures of the hour it was created in."""

    hour: dt.datetime
    agent_id: Any
    status: str
    cost: Decimal
    duration: int | None  # its histogram bucket; None until it has ended

    @classmethod
    def of(cls, row: dict[str, Any]) -> RunShare:
        started, finished = row["started_at"], row["finished_at"]
        duration = (
            duration_bucket(max((finished - started).total_seconds(), 0.0))
            if started is not None and finished is not None
            else None
        )
        return cls(
            hour=hour_of(row["created_at"]),
            agent_id=row["agent_id"],
            status=row["status"],
            cost=row["cost"] or Decimal(0),
            duration=duration,
        )

    @classmethod
    def held(cls, row: dict[str, Any]) -> RunShare | None:
        """The share the rollups hold for this run (None: none yet)."""
        if not row["rollup_status"]:
            return None
        return cls(
            hour=hour_of(row["created_at"]),
            agent_id=row["agent_id"],
            status=row["rollup_status"],
            cost=row["rollup_cost"] or Decimal(0),
            duration=row["rollup_duration"],
        )


@dataclass
class ToolFigures:
    calls: int = 0
    failed: int = 0
    cost: Decimal = Decimal(0)


@dataclass
class AgentFigures:
    runs: int = 0
    cost: Decimal = Decimal(0)
    failed: int = 0


@dataclass
class RunFigures:
    """Runs by (bucket, status), duration histograms per bucket, and totals per
    agent and per tool, for one window at one step (hour | day)."""

    step: str
    runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    durations: defaultdict[str, Counter[int]] = field(
        default_factory=lambda: defaultdict(Counter)
    )
    agents: defaultdict[Any, AgentFigures] = field(
        default_factory=lambda: defaultdict(AgentFigures)
    )
    tools: defaultdict[str, ToolFigures] = field(
        default_factory=lambda: defaultdict(ToolFigures)
    )

    def add_runs(self, share: RunShare, runs: int = 1) -> None:
        key = bucket_key(share.hour, self.step)
        self.runs[(key, share.status)] += runs
        agent = self.agents[share.agent_id]
        agent.runs += runs
        agent.cost += runs * share.cost
        if share.status == Run.Status.FAILED:
            agent.failed += runs
        if share.duration is not None:
            self.durations[key][share.duration] += runs

    def take_back(self, share: RunShare) -> None:
        self.add_runs(share, runs=-1)

    def add_tool(self, tool: str, calls: int, failed: int, cost: Decimal) -> None:
        figures = self.tools[tool]
        figures.calls += calls
        figures.failed += failed
        figures.cost += cost


@dataclass(frozen=True)
class ToolShare:
    run_id: Any
    tool: str
    calls: int
    failed: int
    cost: Decimal


def tool_shares(run_ids: Iterable[Any]) -> list[ToolShare]:
    """Per run and tool: its calls, failed calls, and the cost its calls settled
    in the ledger (a declared cost is reserved and settled per call)."""
    ids = list(run_ids)
    if not ids:
        return []
    shares: dict[tuple[Any, str], list[Any]] = {}
    for run_id, tool, calls, failed in (
        ToolCall.objects.filter(run_id__in=ids)
        .order_by()
        .values_list("run_id", "tool_name")
        .annotate(
            calls=Count("id"), failed=Count("id", filter=Q(status__in=TOOL_FAILURES))
        )
    ):
        shares[(run_id, tool)] = [calls, failed, Decimal(0)]
    tool_of = ToolCall.objects.filter(
        run_id=OuterRef("run_id"), call_id=OuterRef("call_id")
    ).values("tool_name")[:1]
    for run_id, tool, cost in (
        BudgetLedgerEntry.objects.filter(
            run_id__in=ids,
            kind=BudgetLedgerEntry.Kind.TOOL_CALL,
            status=BudgetLedgerEntry.Status.SETTLED,
        )
        .annotate(tool=Subquery(tool_of))
        .order_by()
        .values_list("run_id", "tool")
        .annotate(cost=Sum(Cast(KT("actual__cost"), FloatField())))
    ):
        if tool:
            # The ledger keeps amounts as JSON text; six places, as Run.cost.
            settled = Decimal(f"{cost or 0:.6f}")
            shares.setdefault((run_id, tool), [0, 0, Decimal(0)])[2] += settled
    return [
        ToolShare(run_id, tool, calls, failed, cost)
        for (run_id, tool), (calls, failed, cost) in shares.items()
    ]


def _add_runs(figures: RunFigures, runs: QuerySet[Run], *, take_back: bool) -> None:
    """Add what these runs are now; with `take_back`, less what the rollups
    hold for them (their tool calls are counted there once, when first held)."""
    new: list[Any] = []
    for row in runs.order_by().values(*SHARE_FIELDS):
        figures.add_runs(RunShare.of(row))
        held = RunShare.held(row) if take_back else None
        if held is not None:
            figures.take_back(held)
        else:
            new.append(row["id"])
    for share in tool_shares(new):
        figures.add_tool(share.tool, share.calls, share.failed, share.cost)


def run_figures(
    *, tenant: Tenant, start: dt.datetime, end: dt.datetime, step: str
) -> RunFigures:
    """The figures of the tenant's runs created in [start, end)."""
    figures = RunFigures(step=step)
    runs = Run.objects.filter(tenant=tenant)
    first = hour_of(start) + (HOUR if hour_of(start) < start else dt.timedelta())
    last = hour_of(end)
    if first >= last:
        _add_runs(
            figures, runs.filter(created_at__gte=start, created_at__lt=end),
            take_back=False,
        )  # fmt: skip
        return figures
    whole = {"tenant": tenant, "hour__gte": first, "hour__lt": last}
    # The database sums the rollups per bucket, agent and tool: a month is a
    # few hundred rows to read, not ~60,000.
    at = BucketKey(F("hour"), step)
    held = RunHourRollup.objects.filter(**whole).order_by()
    for key, status, count in (
        held.annotate(at=at).values_list("at", "status").annotate(n=Sum("runs"))
    ):
        figures.runs[(key, status)] += count
    for agent_id, count, cost, failed in held.values_list("agent_id").annotate(
        n=Sum("runs"),
        cost=Sum("cost"),
        failed=Sum("runs", filter=Q(status=Run.Status.FAILED)),
    ):
        agent = figures.agents[agent_id]
        agent.runs += count
        agent.cost += cost
        agent.failed += failed or 0
    for key, bucket, count in (
        RunDurationRollup.objects.filter(**whole)
        .order_by()
        .annotate(at=at)
        .values_list("at", "bucket")
        .annotate(n=Sum("runs"))
    ):
        figures.durations[key][bucket] += count
    for tool, calls, failed, cost in (
        ToolHourRollup.objects.filter(**whole)
        .order_by()
        .values_list("tool_name")
        .annotate(calls=Sum("calls"), failed=Sum("failed"), cost=Sum("cost"))
    ):
        figures.add_tool(tool, calls, failed, cost)
    _add_runs(
        figures,
        runs.filter(rollup_pending=True, created_at__gte=first, created_at__lt=last),
        take_back=True,
    )
    for edge_start, edge_end in ((start, first), (last, end)):
        if edge_start < edge_end:
            _add_runs(
                figures,
                runs.filter(created_at__gte=edge_start, created_at__lt=edge_end),
                take_back=False,
            )
    return figures
