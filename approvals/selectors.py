"""Reads for approvals and rules; the API's are tenant-scoped."""

from __future__ import annotations

import datetime as dt
import uuid

from django.db.models import QuerySet

from approvals.models import ApprovalPolicyRule, ApprovalRequest
from controlplane.models import Tenant


def approval_list_for(
    *,
    tenant: Tenant,
    status: str | None = None,
    run_id: str | uuid.UUID | None = None,
) -> QuerySet[ApprovalRequest]:
    approvals = ApprovalRequest.objects.filter(tenant=tenant)
    if status:
        approvals = approvals.filter(status=status)
    if run_id:
        approvals = approvals.filter(run_id=run_id)
    return approvals.select_related(
        "run", "tool_call", "decided_by", "args_edited_by"
    ).order_by("-requested_at")


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
