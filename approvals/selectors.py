"""Reads for approvals and rules; the API's are tenant-scoped."""

from __future__ import annotations

import datetime as dt
import uuid

from django.db.models import F, QuerySet

from approvals.models import ApprovalPolicyRule, ApprovalRequest, Question
from controlplane.models import Tenant

# A pseudo-status of the list: every request that is no longer pending.
DECIDED = "decided"


def approval_list_for(
    *,
    tenant: Tenant,
    status: str | None = None,
    run_id: str | uuid.UUID | None = None,
    decided_by: str | None = None,
) -> QuerySet[ApprovalRequest]:
    """The tenant's requests, newest first; `decided` ones last decided first."""
    approvals = ApprovalRequest.objects.filter(tenant=tenant)
    if status == DECIDED:
        approvals = approvals.exclude(status=ApprovalRequest.Status.PENDING)
    elif status:
        approvals = approvals.filter(status=status)
    if run_id:
        approvals = approvals.filter(run_id=run_id)
    if decided_by:
        approvals = approvals.filter(decided_by__username=decided_by)
    newest = F("requested_at").desc()
    order = (
        [F("decided_at").desc(nulls_last=True), newest]
        if status == DECIDED
        else [newest]
    )
    return approvals.select_related(
        "run", "run__agent", "tool_call", "tool_call__step", "decided_by",
        "args_edited_by",
    ).order_by(*order)  # fmt: skip


def approval_rules_for(*, tenant: Tenant) -> QuerySet[ApprovalPolicyRule]:
    return ApprovalPolicyRule.objects.filter(tenant=tenant).order_by(
        "position", "created_at"
    )


def approvals_due(*, now: dt.datetime, limit: int) -> list[ApprovalRequest]:
    """Pending requests past their time-to-live, oldest deadline first (every
    tenant's: for the expiry task)."""
    return list(
        ApprovalRequest.objects.filter(
            status=ApprovalRequest.Status.PENDING, expires_at__lte=now
        )
        .select_related("run", "tenant", "tool_call")
        .order_by("expires_at")[:limit]
    )


def question_list_for(
    *, tenant: Tenant, status: str | None = None, run_id: str | uuid.UUID | None = None
) -> QuerySet[Question]:
    """The tenant's questions, newest first."""
    questions = Question.objects.filter(tenant=tenant)
    if status:
        questions = questions.filter(status=status)
    if run_id:
        questions = questions.filter(run_id=run_id)
    return questions.select_related(
        "run", "run__agent", "tool_call", "answered_by"
    ).order_by("-asked_at")


def questions_due(*, now: dt.datetime, limit: int) -> list[Question]:
    """Pending questions past their time-to-live (every tenant's: for the sweep)."""
    return list(
        Question.objects.filter(status=Question.Status.PENDING, expires_at__lte=now)
        .select_related("run", "tenant", "tool_call")
        .order_by("expires_at")[:limit]
    )
