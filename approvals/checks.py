"""Reads that say whether an approval holds: who may decide a request, and the
re-check on resume (decided in time, deciders still allowed, the arguments
unchanged, the votes enough for the rule as it is now).

Like the rest of this app they never import `runs`: runs hands over its tool call
row as a `GatedCall` and acts on the answer.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from django.contrib.auth.models import User
from django.utils import timezone

from approvals.models import (
    DEFAULT_APPROVER_ROLES,
    ApprovalRequest,
    TenantApprovalSettings,
)
from approvals.policy import APPROVER_ROLE_CHOICES, RULE_PREFIX, rule_of
from controlplane.models import Membership
from controlplane.permissions import Action, role_may
from runs.engine.actions import ToolCall as EngineToolCall


@dataclass(frozen=True)
class ApprovalOutcome:
    pending: bool
    approved: bool
    reason: str = ""


class GatedCall(Protocol):
    """What approvals reads of the tool call a request gates: runs hands over its
    `runs.ToolCall` row, which this app refers to by id and never imports."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def run_id(self) -> uuid.UUID: ...
    @property
    def call_id(self) -> str: ...
    @property
    def tool_name(self) -> str: ...
    @property
    def args(self) -> Any: ...
    @property
    def args_sha256(self) -> str: ...


def approval_may_decide(role: str | None) -> bool:
    """Whether the matrix lets `role` decide approvals at all (viewers never)."""
    return role is not None and role_may(role, Action.APPROVAL_DECIDE)


def tenant_requires_deny_reason(tenant_id: Any) -> bool:
    return TenantApprovalSettings.objects.filter(
        tenant_id=tenant_id, deny_reason_required=True
    ).exists()


def may_decide(request: ApprovalRequest, user: User) -> str | None:
    """Why `user` may not decide `request`, or None when they may."""
    role = (
        Membership.objects.filter(
            tenant_id=request.tenant_id, user=user, deactivated_at__isnull=True
        )
        .values_list("role", flat=True)
        .first()
    )
    if role not in request.approver_roles or not approval_may_decide(role):
        roles = " or ".join(request.approver_roles)
        return f"deciding this approval needs the role {roles}"
    if not request.starter_may_approve and request.run.started_by_id == user.id:
        return "the user who started the run may not approve its calls"
    if not request.starter_may_approve and request.requested_by_id == user.id:
        return "the user whose agent asked may not approve its call"
    return None


def approvers_still_allowed_problem(request: ApprovalRequest) -> str | None:
    votes = request.decisions.filter(
        decision="approve", args_sha256=request.args_sha256
    ).select_related("user")
    for vote in votes:
        if vote.user is None or not vote.user.is_active:
            return "an approver's account no longer exists or is inactive"
        role = (
            Membership.objects.filter(
                tenant_id=request.tenant_id,
                user=vote.user,
                deactivated_at__isnull=True,
            )
            .values_list("role", flat=True)
            .first()
        )
        if role not in request.approver_roles or not approval_may_decide(role):
            return (
                f"approver {vote.user.get_username()} no longer holds a role that "
                f"may approve ({' or '.join(request.approver_roles)})"
            )
    return None


def approval_run_scope_grant(
    *, run_id: Any, tool_name: str, rule: str
) -> ApprovalRequest | None:
    """An earlier `scope: run` approval of this tool under this rule in this run,
    whose approvers still hold a role that may approve."""
    grants = ApprovalRequest.objects.filter(
        run_id=run_id,
        tool_name=tool_name,
        rule=rule,
        scope=ApprovalRequest.Scope.RUN,
        status=ApprovalRequest.Status.APPROVED,
    ).order_by("decided_at")
    for grant in grants:
        if approvers_still_allowed_problem(grant) is None:
            return grant
    return None


def approval_outcome_for(*, tool_call: GatedCall) -> ApprovalOutcome:
    """Re-check on resume: decided, not expired, deciders still allowed, and the
    arguments unchanged since the decision."""
    request = ApprovalRequest.objects.filter(tool_call_id=tool_call.id).first()
    if request is None:
        return ApprovalOutcome(
            pending=False, approved=False, reason="no approval found"
        )
    now = timezone.now()
    if request.status == ApprovalRequest.Status.PENDING:
        if request.expires_at <= now:
            return ApprovalOutcome(False, False, "expired: nobody decided in time")
        return ApprovalOutcome(pending=True, approved=False)
    if request.status == ApprovalRequest.Status.EXPIRED:
        return ApprovalOutcome(False, False, "expired: nobody decided in time")
    if request.status != ApprovalRequest.Status.APPROVED:
        return ApprovalOutcome(False, False, request.reason or str(request.status))
    if request.expires_at <= now or (
        request.decided_at is not None and request.decided_at > request.expires_at
    ):
        return ApprovalOutcome(False, False, "the approval expired before the call ran")
    problem = approvers_still_allowed_problem(request)
    if problem is not None:
        return ApprovalOutcome(False, False, problem)
    current = EngineToolCall.parse(
        tool_call.call_id, tool_call.tool_name, json.dumps(tool_call.args)
    ).arguments_sha256
    if request.args_sha256 != tool_call.args_sha256 or current != request.args_sha256:
        return ApprovalOutcome(False, False, "the arguments changed after approval")
    return ApprovalOutcome(pending=False, approved=True)


def approval_covers_problem(
    *, tool_call: GatedCall, decision: dict[str, Any]
) -> str | None:
    """Why the call's approval does not meet what the policy asks now, or None.

    On resume the policy may name another rule than the one that asked (a rule
    added or edited meanwhile): the votes on the current arguments must satisfy
    that rule as it is now (its approver roles and count, whether the run's
    starter may approve), counted with each voter's role as it is now.
    """
    request = (
        ApprovalRequest.objects.filter(tool_call_id=tool_call.id)
        .select_related("run")
        .first()
    )
    if request is None:
        return "no approval found"
    name = str(decision.get("rule", ""))
    rule = rule_of(decision)
    if rule is not None:
        label = f"rule {rule.name}"
        roles = list(rule.approver_roles)
        required, starter_may = rule.approvals_required, rule.starter_may_approve
    elif name.startswith(RULE_PREFIX):  # deleted between the decision and now
        return "the rule that decides this call no longer exists"
    else:
        label = "the default rule"
        roles, required, starter_may = list(DEFAULT_APPROVER_ROLES), 1, True
    allowed = [role for role in roles if role in APPROVER_ROLE_CHOICES]
    voters = list(
        request.decisions.filter(
            decision="approve",
            args_sha256=request.args_sha256,
            user__is_active=True,
            user__memberships__tenant_id=request.tenant_id,
            user__memberships__role__in=allowed,
            user__memberships__deactivated_at__isnull=True,
        )
        .values_list("user_id", flat=True)
        .distinct()
    )
    counted = [
        user for user in voters if starter_may or user != request.run.started_by_id
    ]
    if len(counted) >= required:
        return None
    starter = "" if starter_may else " other than the run's starter"
    return (
        f"{label} now needs {required} approval(s) from role "
        f"{' or '.join(allowed) or '(none)'}{starter}, and this call has "
        f"{len(counted)}"
    )


def approval_edit_note(*, tool_call: GatedCall) -> str | None:
    """What the model is told when a reviewer changed the arguments, if they did."""
    request = (
        ApprovalRequest.objects.filter(tool_call_id=tool_call.id)
        .select_related("args_edited_by")
        .first()
    )
    if request is None or request.original_args is None:
        return None
    who = (
        request.args_edited_by.get_username()
        if request.args_edited_by
        else "a reviewer"
    )
    return (
        f"the arguments were changed by {who} when approving: "
        f"proposed {json.dumps(request.original_args, sort_keys=True)}, "
        f"executed {json.dumps(request.args_snapshot, sort_keys=True)}"
    )
