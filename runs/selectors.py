"""Reads for runs, always scoped to the caller's tenant."""

from __future__ import annotations

import uuid

from django.db.models import Prefetch, QuerySet

from controlplane.models import Tenant
from runs.models import Agent, Run, Step, ToolCall


def run_list_for(
    *, tenant: Tenant, status: str | None = None, agent: str | None = None
) -> QuerySet[Run]:
    runs = Run.objects.filter(tenant=tenant).select_related("agent", "started_by")
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent__slug=agent)
    return runs.order_by("-created_at")


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
