"""Reads of evaluation suites, always scoped to the caller's tenant."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet

from controlplane.models import Tenant
from runs.evals.definitions import APPROVAL_KEYS, GRADER_KINDS, ORDER_KEYS
from runs.models import EvalCase, EvalSuite


def eval_suite_list_for(*, tenant: Tenant) -> QuerySet[EvalSuite]:
    return (
        EvalSuite.objects.filter(tenant=tenant)
        .annotate(case_count=Count("cases"))
        .order_by("slug")
    )


def eval_suite_get_for(*, tenant: Tenant, slug: str) -> EvalSuite | None:
    return eval_suite_list_for(tenant=tenant).filter(slug=slug).first()


def eval_cases_of(*, suite: EvalSuite) -> QuerySet[EvalCase]:
    return EvalCase.objects.filter(suite=suite).order_by("position", "slug")


def eval_case_get(*, suite: EvalSuite, slug: str) -> EvalCase | None:
    return eval_cases_of(suite=suite).filter(slug=slug).first()


def _ordered(data: Any, keys: tuple[str, ...]) -> Any:
    """`data` with its keys in the schema's order: PostgreSQL's jsonb keeps
    an object's keys in an order of its own, and an export must read as the
    file that was imported."""
    if not isinstance(data, dict):
        return data
    return {
        **{key: data[key] for key in keys if key in data},
        **{key: value for key, value in data.items() if key not in keys},
    }


def _grader_document(grader: Any) -> Any:
    kind = (
        GRADER_KINDS.get(str(grader.get("kind"))) if isinstance(grader, dict) else None
    )
    return _ordered(grader, ("kind", *kind.keys) if kind else ("kind",))


def _world_document(world: Any) -> Any:
    if not isinstance(world, dict) or not isinstance(world.get("orders"), list):
        return world
    return {**world, "orders": [_ordered(o, ORDER_KEYS) for o in world["orders"]]}


def eval_case_document(case: EvalCase) -> dict[str, Any]:
    """A case in its file's shape."""
    return {
        "slug": case.slug,
        "input": case.input,
        "world": _world_document(case.world),
        "approvals": [_ordered(a, APPROVAL_KEYS) for a in case.approvals],
        "graders": [_grader_document(g) for g in case.graders],
    }


def eval_suite_document(*, suite: EvalSuite) -> dict[str, Any]:
    """A suite in its file's shape (what export writes and import reads)."""
    return {
        "slug": suite.slug,
        "name": suite.name,
        "description": suite.description,
        "agent": suite.default_agent,
        "cases": [eval_case_document(c) for c in eval_cases_of(suite=suite)],
    }
