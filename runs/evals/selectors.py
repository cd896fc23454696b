"""Reads of evaluation suites, always scoped to the caller's tenant."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, QuerySet

from controlplane.models import Tenant
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


def eval_case_document(case: EvalCase) -> dict[str, Any]:
    """A case in its file's shape."""
    return {
        "slug": case.slug,
        "input": case.input,
        "world": case.world,
        "approvals": case.approvals,
        "graders": case.graders,
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
