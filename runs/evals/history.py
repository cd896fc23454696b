"""Reads of a tenant's eval runs by suite: a suite's eval runs (newest first),
to pick one to compare with, and each suite's latest, for the suites list."""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from controlplane.models import Tenant
from runs.models import Agent, AgentVersion, EvalRun, EvalSuite

__all__ = [
    "eval_agent_choices",
    "eval_run_headline",
    "eval_runs_of_suite",
    "eval_suite_latest_runs",
]


def eval_runs_of_suite(*, tenant: Tenant, suite: EvalSuite) -> QuerySet[EvalRun]:
    return (
        EvalRun.objects.filter(tenant=tenant, suite=suite)
        .select_related("suite", "agent_version__agent", "created_by")
        .order_by("-created_at", "-id")
    )


def eval_suite_latest_runs(*, tenant: Tenant) -> dict[Any, EvalRun]:
    """Each suite's newest eval run, by suite id (suites without one are absent)."""
    newest = (
        EvalRun.objects.filter(tenant=tenant, suite=OuterRef("pk"))
        .order_by("-created_at", "-id")
        .values("id")[:1]
    )
    ids = (
        EvalSuite.objects.filter(tenant=tenant)
        .annotate(latest=Subquery(newest))
        .exclude(latest=None)
        .values_list("latest", flat=True)
    )
    runs = EvalRun.objects.filter(tenant=tenant, id__in=list(ids)).select_related(
        "agent_version__agent", "created_by"
    )
    return {run.suite_id: run for run in runs}


def eval_run_identity(eval_run: EvalRun) -> dict[str, Any]:
    """Which eval run it is: what every answer naming one starts with."""
    return {
        "id": str(eval_run.id),
        "agent": eval_run.agent_name,
        "version": eval_run.version_number,
        "external": eval_run.agent_version_id is None,
        "k": eval_run.k,
        "status": eval_run.status,
        "created_at": eval_run.created_at,
        "finished_at": eval_run.finished_at,
    }


def eval_run_headline(eval_run: EvalRun) -> dict[str, Any]:
    """What a list shows of an eval run: who, what, and its figures once
    finished (None before)."""
    summary = eval_run.summary or {}
    interval = summary.get("pass_at_1_interval") or {}
    return {
        **eval_run_identity(eval_run),
        "created_by": eval_run.created_by.username if eval_run.created_by else None,
        "pass_at_1": summary.get("pass_at_1"),
        "pass_at_1_low": interval.get("low"),
        "pass_at_1_high": interval.get("high"),
        "pass_at_k": summary.get("pass_at_k"),
        "pass_hat_k": summary.get("pass_hat_k"),
        "trials": summary.get("trials"),
        "mean_cost": summary.get("mean_cost"),
    }


def eval_agent_choices(*, tenant: Tenant) -> list[dict[str, Any]]:
    """What an eval run may be started against: each agent of the tenant that
    runs here (not deleted, not OTLP-only), its current version and every
    version's number, newest first."""
    agents = (
        Agent.objects.filter(
            tenant=tenant, deleted_at__isnull=True, current_version__isnull=False
        )
        .select_related("current_version")
        .order_by("slug")
    )
    numbers: dict[Any, list[int]] = {}
    for agent_id, number in (
        AgentVersion.objects.filter(agent__in=agents)
        .order_by("agent_id", "-number")
        .values_list("agent_id", "number")
    ):
        numbers.setdefault(agent_id, []).append(number)
    return [
        {
            "slug": agent.slug,
            "name": agent.name,
            "current": agent.current_version.number if agent.current_version else None,
            "versions": numbers.get(agent.id, []),
        }
        for agent in agents
    ]
