"""Reads for runs, always scoped to the caller's tenant."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import (
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.models import PERIOD_DIMENSIONS, PERIODS, Budget
from budgets.periods import bucket_start
from budgets.selectors import budget_of
from budgets.services import budget_usage
from controlplane.models import Tenant
from runs.branch_selectors import session_run_ids
from runs.models import (
    Agent,
    AgentVersion,
    ExternalGate,
    McpServer,
    McpTool,
    ModelEndpoint,
    Run,
    RunReview,
    SessionEntry,
    Step,
    ToolCall,
)
from runs.services.agent_validation import version_config_of
from tracing.models import Span

# `waiting=<who>`: the kinds of pending approval request a run waits on. An
# external agent's gated call is an approval like a tool call of ours; `input`
# is a person's answer to "go on after repeated tool errors?" (docs/engine.md).
RUN_WAITING_KINDS: dict[str, tuple[str, ...]] = {
    "approval": (ApprovalRequest.Kind.TOOL_CALL, ApprovalRequest.Kind.EXTERNAL_CALL),
    "input": (ApprovalRequest.Kind.TOOL_ERROR,),
    "budget": (ApprovalRequest.Kind.BUDGET_EXTENSION,),
}
_KIND_WAITING = {
    kind: who for who, kinds in RUN_WAITING_KINDS.items() for kind in kinds
}

# `sort=<name>` or `-<name>`: what each name orders by. Expressions that need the
# moment of the query are built in `_sort_expression`.
RUN_SORT_FIELDS = (
    "created_at",
    "started_at",
    "finished_at",
    "status",
    "agent",
    "started_by",
    "duration",
    "steps",
    "tool_calls",
    "tokens",
    "cost",
    "waiting",
)
RUN_SORT_DEFAULT = "-created_at"


@dataclass(frozen=True)
class RunListQuery:
    """What the runs list asks for; every field optional (None: no filter)."""

    status: str | None = None
    agent: str | None = None
    tool: str | None = None  # a tool the run called at least once
    end_user: str | None = None  # the end user the run serves
    created_from: dt.datetime | None = None  # inclusive
    created_to: dt.datetime | None = None  # exclusive
    cost_gt: Decimal | None = None
    has_error: bool | None = None
    waiting: str | None = None  # a key of RUN_WAITING_KINDS
    text: str = ""  # every word in the input or the final answer
    trace_id: str | None = None  # the run of this trace (lower-case hex)
    sort: str = RUN_SORT_DEFAULT


def _pending(kinds: tuple[str, ...] | None = None) -> QuerySet[ApprovalRequest]:
    pending = ApprovalRequest.objects.filter(
        run=OuterRef("pk"), status=ApprovalRequest.Status.PENDING
    )
    return pending if kinds is None else pending.filter(kind__in=kinds)


def _has_error() -> Q:
    return Q(status=Run.Status.FAILED) | Q(
        Exists(Span.objects.filter(run=OuterRef("pk"), status=Span.Status.ERROR))
    )


def _sort_expression(name: str, now: dt.datetime) -> Any:
    if name == "agent":
        return F("agent__slug")
    if name == "started_by":
        return F("started_by__username")
    if name == "tokens":
        return F("input_tokens") + F("output_tokens")
    if name == "duration":
        # A run going on counts until now, as the list's ticking cell shows it.
        return ExpressionWrapper(
            Coalesce(F("finished_at"), Value(now)) - F("started_at"),
            output_field=DurationField(),
        )
    if name == "waiting":
        return Coalesce(
            Subquery(
                _pending()
                .order_by()
                .values("run")
                .annotate(n=Count("pk"))
                .values("n")[:1]
            ),
            0,
        )
    return F(name)


# A search is every word it holds (AND), each a LIKE over two text columns.
RUN_SEARCH_MAX_WORDS = 10


def _words(text: str) -> list[str]:
    return text.split()[:RUN_SEARCH_MAX_WORDS]


def run_list_for(*, tenant: Tenant, query: RunListQuery | None = None) -> QuerySet[Run]:
    """The tenant's runs matching `query`, in a total order: the chosen field
    (empty values last whichever the direction, on SQLite and PostgreSQL alike),
    then newest first, then id, so pages never repeat or skip a run."""
    query = query or RunListQuery()
    runs = Run.objects.filter(tenant=tenant).select_related(
        "agent", "agent_version", "started_by"
    )
    if query.status:
        runs = runs.filter(status=query.status)
    if query.agent:
        runs = runs.filter(agent__slug=query.agent)
    if query.tool:
        # Exists, not a join: a run that called the tool many times is one row.
        called = ToolCall.objects.filter(run=OuterRef("pk"), tool_name=query.tool)
        runs = runs.filter(Exists(called))
    if query.end_user:
        runs = runs.filter(end_user=query.end_user)
    if query.trace_id:
        runs = runs.filter(trace_id=query.trace_id)
    if query.created_from is not None:
        runs = runs.filter(created_at__gte=query.created_from)
    if query.created_to is not None:
        runs = runs.filter(created_at__lt=query.created_to)
    if query.cost_gt is not None:
        runs = runs.filter(cost__gt=query.cost_gt)
    if query.has_error is not None:
        runs = runs.filter(_has_error() if query.has_error else ~_has_error())
    if query.waiting:
        runs = runs.filter(Exists(_pending(RUN_WAITING_KINDS[query.waiting])))
    for word in _words(query.text):
        runs = runs.filter(Q(input__icontains=word) | Q(final_answer__icontains=word))
    descending = query.sort.startswith("-")
    name = query.sort.lstrip("-")
    if name not in RUN_SORT_FIELDS:
        raise ValueError(f"unknown sort field {name!r}")
    if name == "created_at":
        order = [F("created_at").desc() if descending else F("created_at").asc()]
    else:
        runs = runs.annotate(sort_key=_sort_expression(name, timezone.now()))
        key = F("sort_key")
        order = [
            key.desc(nulls_last=True) if descending else key.asc(nulls_last=True),
            F("created_at").desc(),
        ]
    order.append(F("id").desc() if descending else F("id").asc())
    return runs.order_by(*order)


def run_waiting_on(*, tenant: Tenant, run_ids: list[Any]) -> dict[Any, dict[str, int]]:
    """Per run id, its pending approval requests by who they wait on."""
    counts: dict[Any, dict[str, int]] = {
        run_id: dict.fromkeys(RUN_WAITING_KINDS, 0) for run_id in run_ids
    }
    rows = (
        ApprovalRequest.objects.filter(
            tenant=tenant, run_id__in=run_ids, status=ApprovalRequest.Status.PENDING
        )
        .values("run_id", "kind")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for row in rows:
        counts[row["run_id"]][_KIND_WAITING[row["kind"]]] += row["n"]
    return counts


def run_id_for_trace(*, tenant: Tenant, trace_id: str) -> uuid.UUID | None:
    """The id of the tenant's run of this trace (a trace id names one run in a
    tenant), or None: none yet, or another tenant's."""
    found: uuid.UUID | None = (
        Run.objects.filter(
            tenant=tenant, trace_id=trace_id.lower(), parent_run__isnull=True
        )
        .values_list("id", flat=True)
        .first()
    )
    return found


def run_for_tenant(*, tenant: Tenant, run_id: str | uuid.UUID) -> Run | None:
    """The run alone (no steps), or None: absent, another tenant's, or not an id.
    What the trace views and the run stream ask before reading the run's events."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return Run.objects.filter(tenant=tenant, id=key).first()


def run_get_for(*, tenant: Tenant, run_id: str | uuid.UUID) -> Run | None:
    """The run with its steps and tool calls, or None (absent or another tenant's)."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return (
        Run.objects.filter(tenant=tenant, id=key)
        .select_related("agent", "agent_version", "started_by")
        .prefetch_related(
            Prefetch(
                "step_rows",
                queryset=Step.objects.order_by("index").prefetch_related(
                    Prefetch(
                        "tool_calls", queryset=ToolCall.objects.order_by("position")
                    )
                ),
            )
        )
        .first()
    )


def agent_list_for(*, tenant: Tenant) -> QuerySet[Agent]:
    """The tenant's agents that are not deleted, disabled ones included."""
    return (
        Agent.objects.filter(tenant=tenant, deleted_at__isnull=True)
        .select_related(
            "current_version__endpoint", "current_version__fallback_endpoint"
        )
        .order_by("slug")
    )


def agent_get_for(*, tenant: Tenant, agent_id: Any) -> Agent | None:
    """The tenant's agent (not deleted), or None: absent, another tenant's, or
    not an id."""
    try:
        key = uuid.UUID(str(agent_id))
    except ValueError:
        return None
    return agent_list_for(tenant=tenant).filter(id=key).first()


def agent_versions_for(*, agent: Agent) -> QuerySet[AgentVersion]:
    return (
        AgentVersion.objects.filter(agent=agent)
        .select_related("endpoint", "fallback_endpoint", "created_by")
        .order_by("-number")
    )


def model_endpoint_list_for(*, tenant: Tenant) -> QuerySet[ModelEndpoint]:
    return ModelEndpoint.objects.filter(tenant=tenant).order_by("slug")


def model_endpoint_get_for(*, tenant: Tenant, endpoint_id: Any) -> ModelEndpoint | None:
    try:
        key = uuid.UUID(str(endpoint_id))
    except ValueError:
        return None
    return model_endpoint_list_for(tenant=tenant).filter(id=key).first()


def agent_versions_compare(
    older: AgentVersion, newer: AgentVersion
) -> list[dict[str, Any]]:
    """Field by field, what differs between two versions' configurations."""
    a, b = version_config_of(older), version_config_of(newer)
    return [
        {"field": name, "a": a[name], "b": b[name]}
        for name in AgentVersion.CONFIG_FIELDS
        if a[name] != b[name]
    ]


def tenant_budget_usage(*, tenant: Tenant) -> dict[str, Any]:
    """Used and reserved per period dimension in the current windows.

    A tenant without a budget has no ledger (nothing is reserved where nothing
    is limited): its use is what the window's runs recorded themselves."""
    budget = budget_of(tenant)
    if budget is not None:
        return budget_usage(budget=budget)
    now = timezone.now()
    return {period: _runs_window_usage(tenant.pk, period, now) for period in PERIODS}


def _runs_window_usage(
    tenant_id: Any, period: str, now: dt.datetime
) -> dict[str, dict[str, str]]:
    """The calendar window's own runs' counters (ingested traces spend nothing
    here, so they are left out), in `budgets.ledger.window_usage`'s shape."""
    start = bucket_start(Budget.PeriodMode.CALENDAR, period, now)
    totals = (
        Run.objects.filter(tenant_id=tenant_id, created_at__gte=start)
        .exclude(stop_reason="external")
        .aggregate(
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost"),
            runs=Count("id"),
        )
    )
    return {
        name: {"used": str(totals[name] or 0), "reserved": "0"}
        for name in PERIOD_DIMENSIONS
    }


def mcp_server_list_for(*, tenant: Tenant) -> QuerySet[McpServer]:
    return (
        McpServer.objects.filter(tenant=tenant)
        .prefetch_related("tools")
        .order_by("slug")
    )


def mcp_tool_for(*, tenant: Tenant, server_id: uuid.UUID, name: str) -> McpTool | None:
    return (
        McpTool.objects.filter(server__tenant=tenant, server_id=server_id, name=name)
        .select_related("server", "server__tenant")
        .first()
    )


def run_steps_cost(*, run: Run, indexes: Iterable[int]) -> Decimal:
    """What the run's steps with these indexes cost (a subtree's model calls)."""
    wanted = list(indexes)
    if not wanted:
        return Decimal(0)
    total = Step.objects.filter(run=run, index__in=wanted).aggregate(c=Sum("cost"))
    return total["c"] or Decimal(0)


def gate_list_for(*, tenant: Tenant) -> QuerySet[ExternalGate]:
    """The tenant's external agents' gates, with what their JSON shows."""
    return ExternalGate.objects.filter(tenant=tenant).select_related(
        "run", "approval", "approval__decided_by"
    )


def gate_is_final(*, gate_id: Any) -> bool:
    """Whether the gate has its final answer (a long-poll's re-check, by id:
    the caller was authorised for this gate before it waits)."""
    return (
        ExternalGate.objects.filter(id=gate_id)
        .exclude(status=ExternalGate.Status.PENDING)
        .exists()
    )


def run_review_list_for(
    *, tenant: Tenant, status: str | None = None
) -> QuerySet[RunReview]:
    """The tenant's flagged runs, newest first."""
    reviews = RunReview.objects.filter(tenant=tenant)
    if status:
        reviews = reviews.filter(status=status)
    return reviews.select_related("run", "run__agent", "reviewed_by").order_by(
        "-created_at"
    )


@dataclass(frozen=True)
class RunSession:
    run_id: uuid.UUID
    leaf: str | None
    entries: QuerySet[SessionEntry]


def run_session_for(*, tenant: Tenant, run_id: str | uuid.UUID) -> RunSession | None:
    """The run's session log (entries in order) and its current leaf, or None
    (absent or another tenant's run). A branched run's log is the session's
    whole tree: every branch's entries (runs.services.branches)."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    row = (
        Run.objects.filter(tenant=tenant, id=key)
        .values_list("id", "engine_state__session__leaf")
        .first()
    )
    if row is None:
        return None
    runs = session_run_ids(run_id=key)
    # `seq` alone orders the whole tree: branch n numbers its entries from
    # n << BRANCH_SEQ_SHIFT, so no two entries of a session share one.
    entries = SessionEntry.objects.filter(run_id__in=runs).order_by("seq")
    return RunSession(key, row[1], entries)


def session_entries_page(
    *, session: RunSession, after_seq: int | None, limit: int
) -> tuple[list[SessionEntry], int | None]:
    """Up to `limit` of the session's entries after `after_seq` (None: from the
    first), in seq order, and the `after_seq` of the next page (None: this is
    the last). One row more than the page is read to know whether one follows."""
    entries = session.entries
    if after_seq is not None:
        entries = entries.filter(seq__gt=after_seq)
    rows = list(entries[: limit + 1])
    if len(rows) <= limit:
        return rows, None
    del rows[limit:]
    return rows, rows[-1].seq
