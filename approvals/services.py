"""Open, decide and resolve approval requests; every decision is compare-and-set."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from controlplane.services import audit_record
from runs.models import Run, ToolCall


class AlreadyDecided(Exception):
    """The first decision won; carries the request as it is now."""

    def __init__(self, request: ApprovalRequest) -> None:
        super().__init__(f"the approval is already {request.status}")
        self.request = request


@dataclass(frozen=True)
class ApprovalOutcome:
    pending: bool
    approved: bool
    reason: str = ""


def approval_request_open(
    *, tool_call: ToolCall, decision: dict[str, Any]
) -> ApprovalRequest:
    """Ask for a decision on exactly these arguments (snapshot + sha256)."""
    ttl = decision.get("ttl_seconds") or settings.APPROVAL_DEFAULT_TTL_SECONDS
    request, _ = ApprovalRequest.objects.get_or_create(
        tool_call=tool_call,
        defaults={
            "tenant_id": tool_call.run.tenant_id,
            "run_id": tool_call.run_id,
            "tool_name": tool_call.tool_name,
            "rule": decision.get("rule", ""),
            "rule_reason": decision.get("reason", ""),
            "args_snapshot": tool_call.args,
            "args_sha256": tool_call.args_sha256,
            "expires_at": timezone.now() + dt.timedelta(seconds=int(ttl)),
        },
    )
    return request


@transaction.atomic
def approval_decide(
    *,
    request: ApprovalRequest,
    decided_by: User,
    approve: bool,
    reason: str = "",
) -> ApprovalRequest:
    """Record the first decision and resume the run; a later one raises."""
    status = ApprovalRequest.Status.APPROVED if approve else ApprovalRequest.Status.DENIED
    updated = ApprovalRequest.objects.filter(
        id=request.id, status=ApprovalRequest.Status.PENDING
    ).update(
        status=status, decided_by=decided_by, decided_at=timezone.now(), reason=reason
    )
    request.refresh_from_db()
    if not updated:
        raise AlreadyDecided(request)
    audit_record(
        tenant=request.tenant,
        actor=decided_by,
        action=f"approval.{status}",
        object_type="approval",
        object_id=str(request.id),
        before={"status": ApprovalRequest.Status.PENDING},
        after={"status": status, "reason": reason},
    )
    from runs.services import run_resume

    run_resume(run_id=str(request.run_id))
    return request


def approval_outcome_for(*, tool_call: ToolCall) -> ApprovalOutcome:
    """Re-check on resume: decided, not expired, and the arguments unchanged."""
    request = ApprovalRequest.objects.filter(tool_call=tool_call).first()
    if request is None:
        return ApprovalOutcome(pending=False, approved=False, reason="no approval found")
    if request.status == ApprovalRequest.Status.PENDING:
        if request.expires_at <= timezone.now():
            return ApprovalOutcome(False, False, "expired: nobody decided in time")
        return ApprovalOutcome(pending=True, approved=False)
    if request.status != ApprovalRequest.Status.APPROVED:
        return ApprovalOutcome(False, False, request.reason or str(request.status))
    if request.args_sha256 != tool_call.args_sha256:
        return ApprovalOutcome(False, False, "the arguments changed after approval")
    return ApprovalOutcome(pending=False, approved=True)


def approval_requests_cancel_for_run(*, run: Run) -> int:
    return ApprovalRequest.objects.filter(
        run=run, status=ApprovalRequest.Status.PENDING
    ).update(status=ApprovalRequest.Status.CANCELLED, decided_at=timezone.now())
