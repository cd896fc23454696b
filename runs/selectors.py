"""Reads for runs, always scoped to the caller's tenant."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.db.models import Count, Prefetch, QuerySet, Sum
from django.utils import timezone

from budgets.models import PERIOD_DIMENSIONS, PERIODS, Budget
from budgets.periods import bucket_start
from budgets.selectors import budget_of
from budgets.services import budget_usage
from controlplane.models import Tenant
from runs.models import Agent, McpServer, McpTool, Run, Step, ToolCall


def run_list_for(
    *, tenant: Tenant, status: str | None = None, agent: str | None = None
) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant=tenant).select_related("agent", "started_by")
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent__slug=agent)
    return runs.order_by("-created_at")


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
        .select_related("agent", "started_by")
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
    return Agent.objects.filter(tenant=tenant).order_by("slug")


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
