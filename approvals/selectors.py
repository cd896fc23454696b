"""Reads for approvals, rules and the audit log; every one is tenant-scoped."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from approvals.models import ApprovalPolicyRule, ApprovalRequest
from controlplane.models import AuditEvent, Tenant


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


def audit_events_for(
    *,
    tenant: Tenant,
    action: str | None = None,
    object_type: str | None = None,
    object_id: str | None = None,
) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(tenant=tenant)
    if action:
        events = events.filter(action=action)
    if object_type:
        events = events.filter(object_type=object_type)
    if object_id:
        events = events.filter(object_id=object_id)
    return events.select_related("actor").order_by("-created_at", "-id")
