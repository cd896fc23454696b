"""Reads for runs, always scoped to the caller's tenant."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.db.models import Count, Prefetch, QuerySet, Sum
from django.utils import timezone

from budgets.models import PERIOD_DIMENSIONS, PERIODS, Budget
from budgets.periods import bucket_start
from budgets.selectors import budget_of
from budgets.services import budget_usage
from controlplane.models import Tenant
from runs.models import (
    Agent,
    AgentVersion,
    McpServer,
    McpTool,
    ModelEndpoint,
    Run,
    Step,
    ToolCall,
)
from runs.services.agent_validation import version_config_of


def run_list_for(
    *,
    tenant: Tenant,
    status: str | None = None,
    agent: str | None = None,
    trace_id: str | None = None,
) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant=tenant).select_related(
        "agent", "agent_version", "started_by"
    )
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent__slug=agent)
    if trace_id:
        runs = runs.filter(trace_id=trace_id)
    return runs.order_by("-created_at")


def run_id_for_trace(*, tenant: Tenant, trace_id: str) -> uuid.UUID | None:
    """The id of the tenant's run of this trace (a trace id names one run in a
    tenant), or None: none yet, or another tenant's."""
    found: uuid.UUID | None = (
        Run.objects.filter(tenant=tenant, trace_id=trace_id.lower())
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
