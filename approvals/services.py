"""Open, decide, expire and resolve approval requests; every decision is CAS.

A request is bound to exact arguments (snapshot + sha256) and the rule that asked.
Deciders are serialised on the request row (an UPDATE that bumps `version` is the
first statement of the decision's transaction), so two clicks, two approvers or a
click racing the expiry task give one outcome and one resume.

This app stores; it never resumes. `runs` (runs/services/decide.py) calls these in
its own transaction and then resumes or ends the waiting run, and it hands over
the gated tool call (`GatedCall`) and the check of an edit (`ArgsEditCheck`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from approvals.models import (
    DEFAULT_APPROVER_ROLES,
    ApprovalDecision,
    ApprovalRequest,
    TenantApprovalSettings,
)
from approvals.policy import APPROVER_ROLE_CHOICES, RULE_PREFIX, rule_of
from controlplane.models import Membership, Tenant
from controlplane.permissions import Action, role_may
from controlplane.redaction import args_digest, unredact
from controlplane.services import audit_record
from runs.engine.actions import ToolCall as EngineToolCall
from tracing.services import run_event_append


class AlreadyDecided(Exception):
    """The first decision won; carries the request as it is now."""

    def __init__(self, request: ApprovalRequest, message: str = "") -> None:
        super().__init__(message or f"the approval is already {request.status}")
        self.request = request


class ApprovalForbidden(Exception):
    """This user may not decide this request (role, or started the run)."""


class ApprovalInputError(ValueError):
    """The decision is malformed; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


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


@dataclass(frozen=True)
class ArgsEdit:
    """An approver's edit of the gated arguments as the caller checked it and wrote
    it to the call row (runs owns the tool schemas, the policy and that row)."""

    args: dict[str, Any]
    args_sha256: str
    # The stricter rule the edited arguments fall under, if any: its fields.
    policy_changes: dict[str, Any] = field(default_factory=dict)


# Checks an edit of `request`'s arguments (unredacted): None when they are
# unchanged; raises ApprovalInputError when they are refused.
ArgsEditCheck = Callable[[ApprovalRequest, dict[str, Any]], ArgsEdit | None]


def _event(request: ApprovalRequest, type: str, payload: dict[str, Any]) -> None:
    run_event_append(run=request.run, type=type, payload=payload)


def approval_may_decide(role: str | None) -> bool:
    """Whether the matrix lets `role` decide approvals at all (viewers never)."""
    return role is not None and role_may(role, Action.APPROVAL_DECIDE)


@transaction.atomic
def approval_request_open(
    *, tenant_id: Any, tool_call: GatedCall, decision: dict[str, Any]
) -> ApprovalRequest:
    """Ask for a decision on exactly these arguments (snapshot + sha256)."""
    ttl = decision.get("ttl_seconds") or settings.APPROVAL_DEFAULT_TTL_SECONDS
    rule = rule_of(decision)
    request, created = ApprovalRequest.objects.get_or_create(
        tool_call_id=tool_call.id,
        defaults={
            "tenant_id": tenant_id,
            "run_id": tool_call.run_id,
            "tool_name": tool_call.tool_name,
            "rule": str(decision.get("rule", "")),
            "rule_ref": rule,
            "rule_reason": str(decision.get("reason", "")),
            "approver_roles": rule.approver_roles
            if rule
            else list(DEFAULT_APPROVER_ROLES),
            "approvals_required": rule.approvals_required if rule else 1,
            "starter_may_approve": rule.starter_may_approve if rule else True,
            "args_snapshot": tool_call.args,
            "args_sha256": tool_call.args_sha256,
            "expires_at": timezone.now() + dt.timedelta(seconds=int(ttl)),
        },
    )
    if created:
        _announce_request(request)
    return request


BUDGET_EXTENSION_RULE = "budget.on_exhausted"


def extension_summary(extension: dict[str, Any]) -> str:
    """ "extend tenant_cost_per_day by 5" / "extend max_steps by 10"."""
    return f"extend {extension['dimension']} by {extension['amount']}"


@transaction.atomic
def approval_request_open_budget(
    *, tenant_id: Any, run_id: Any, extension: dict[str, Any], detail: str
) -> ApprovalRequest:
    """Ask whether to extend the budget as `extension` says (an ExtensionAsk's
    dict, refused for `detail`) instead of ending the run; anyone whose role may
    decide approvals may decide."""
    canonical = json.dumps(extension, sort_keys=True, separators=(",", ":"))
    request = ApprovalRequest.objects.create(
        tenant_id=tenant_id,
        run_id=run_id,
        kind=ApprovalRequest.Kind.BUDGET_EXTENSION,
        tool_name="",
        rule=BUDGET_EXTENSION_RULE,
        rule_reason=f"{extension_summary(extension)}: {detail}",
        approver_roles=list(DEFAULT_APPROVER_ROLES),
        approvals_required=1,
        starter_may_approve=True,
        args_snapshot={},
        # Votes are bound to this exact extension, as tool votes are to arguments.
        args_sha256=hashlib.sha256(canonical.encode()).hexdigest(),
        extension=extension,
        expires_at=timezone.now()
        + dt.timedelta(seconds=int(settings.APPROVAL_DEFAULT_TTL_SECONDS)),
    )
    _announce_request(request)
    return request


def _announce_request(request: ApprovalRequest) -> None:
    """Audit a new request and put `approval.requested` in the run's log."""
    audit_record(
        tenant=request.tenant,
        actor=None,
        action="approval.request",
        object_type="approval",
        object_id=str(request.id),
        after=_audit_view(request),
    )
    _event(request, "approval.requested", _event_view(request))


def _audit_view(request: ApprovalRequest) -> dict[str, Any]:
    view = {
        "status": request.status,
        "run": str(request.run_id),
        "tool": request.tool_name,
        "args_sha256": args_digest(request.args_sha256),  # as the API shows it
        "rule": request.rule,
    }
    if request.extension is not None:
        view["kind"] = request.kind
        view["extension"] = request.extension
    return view


def _event_view(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "approval_id": str(request.id),
        "kind": request.kind,
        "extension": request.extension,
        "tool_call_id": request.tool_call.call_id if request.tool_call else None,
        "tool": request.tool_name,
        "status": request.status,
        "rule": request.rule,
        "rule_reason": request.rule_reason,
        "args": request.args_snapshot,
        "approvals_required": request.approvals_required,
        "expires_at": request.expires_at.isoformat(),
    }


def tenant_requires_deny_reason(tenant_id: Any) -> bool:
    return TenantApprovalSettings.objects.filter(
        tenant_id=tenant_id, deny_reason_required=True
    ).exists()


def may_decide(request: ApprovalRequest, user: User) -> str | None:
    """Why `user` may not decide `request`, or None when they may."""
    role = (
        Membership.objects.filter(tenant_id=request.tenant_id, user=user)
        .values_list("role", flat=True)
        .first()
    )
    if role not in request.approver_roles or not approval_may_decide(role):
        roles = " or ".join(request.approver_roles)
        return f"deciding this approval needs the role {roles}"
    if not request.starter_may_approve and request.run.started_by_id == user.id:
        return "the user who started the run may not approve its calls"
    return None


@transaction.atomic(savepoint=False)
def approval_decision_record(
    *,
    request: ApprovalRequest,
    decided_by: User,
    approve: bool,
    reason: str = "",
    scope: str = ApprovalRequest.Scope.ONCE,
    args: dict[str, Any] | None = None,
    args_edit: ArgsEditCheck | None = None,
    remote_addr: str | None = None,
) -> ApprovalRequest | AlreadyDecided:
    """Record one decision; the request is final on a deny or the last approval.

    A decision on a request that is no longer pending (or already carries this
    user's vote) raises AlreadyDecided and writes nothing. One past its
    time-to-live expires it and *returns* AlreadyDecided, so the caller's
    transaction keeps the expiry. Edited `args` go through `args_edit` (the
    caller's check). The caller resumes the run when the request is final.
    """
    if scope not in ApprovalRequest.Scope.values:
        raise ApprovalInputError(
            "scope", f"scope must be one of {ApprovalRequest.Scope.values}"
        )
    if not approve and args is not None:
        raise ApprovalInputError("args", "arguments can only be edited when approving")
    if request.kind == ApprovalRequest.Kind.BUDGET_EXTENSION:
        if args is not None:
            raise ApprovalInputError("args", "a budget extension has no arguments")
        if scope != ApprovalRequest.Scope.ONCE:
            raise ApprovalInputError("scope", "a budget extension is decided once")
    # First statement: takes the row lock (PostgreSQL) / write lock (SQLite), so
    # deciders on one request run one after the other and see each other's votes.
    touched = ApprovalRequest.objects.filter(
        id=request.id, status=ApprovalRequest.Status.PENDING
    ).update(version=F("version") + 1)
    locked = ApprovalRequest.objects.select_related("run", "tool_call", "tenant").get(
        id=request.id
    )
    if not touched:
        raise AlreadyDecided(locked)
    refusal = may_decide(locked, decided_by)
    if refusal is not None:
        raise ApprovalForbidden(refusal)
    if (
        not approve
        and not reason.strip()
        and tenant_requires_deny_reason(locked.tenant_id)
    ):
        raise ApprovalInputError("reason", "this tenant requires a reason for a deny")
    now = timezone.now()
    if locked.expires_at <= now:
        approval_expire(request=locked, now=now)
        return AlreadyDecided(locked, "the approval expired before this decision")
    before = _audit_view(locked)
    if args is not None:
        if args_edit is None:
            raise ApprovalInputError("args", "arguments cannot be edited here")
        # Readers see the arguments redacted: a value sent back as it was shown
        # stands for the original it hides, so an edit keeps the real secrets.
        edit = args_edit(locked, unredact(args, locked.args_snapshot))
        if edit is not None:
            _edit_args(locked, edit, decided_by)
    try:
        with transaction.atomic():
            ApprovalDecision.objects.create(
                request=locked,
                user=decided_by,
                decision="approve" if approve else "deny",
                reason=reason,
                args_sha256=locked.args_sha256,
            )
    except IntegrityError:
        raise AlreadyDecided(locked, "you already decided on this approval") from None
    approvals = locked.decisions.filter(
        decision="approve", args_sha256=locked.args_sha256
    ).count()
    final = not approve or approvals >= locked.approvals_required
    if final:
        status = (
            ApprovalRequest.Status.APPROVED
            if approve
            else ApprovalRequest.Status.DENIED
        )
        ApprovalRequest.objects.filter(id=locked.id).update(
            status=status, decided_by=decided_by, decided_at=now, reason=reason,
            scope=scope,
        )  # fmt: skip
        locked.refresh_from_db()
    audit_record(
        tenant=locked.tenant,
        actor=decided_by,
        action="approval.approve" if approve else "approval.deny",
        object_type="approval",
        object_id=str(locked.id),
        before=before,
        after={
            **_audit_view(locked),
            "reason": reason,
            "scope": scope,
            "approvals": approvals,
            "approvals_required": locked.approvals_required,
            "args_edited": args is not None and locked.original_args is not None,
        },
        remote_addr=remote_addr,
    )
    _event(
        locked,
        "approval.decided",
        {
            **_event_view(locked),
            "decision": "approve" if approve else "deny",
            "decided_by": decided_by.get_username(),
            "reason": reason,
            "final": final,
            "approvals": approvals,
        },
    )
    return locked


def _edit_args(request: ApprovalRequest, edit: ArgsEdit, user: User) -> None:
    original = (
        request.original_args
        if request.original_args is not None
        else request.args_snapshot
    )
    ApprovalRequest.objects.filter(id=request.id).update(
        args_snapshot=edit.args,
        args_sha256=edit.args_sha256,
        original_args=original,
        args_edited_by=user,
        **edit.policy_changes,
    )
    request.refresh_from_db()


def approval_expire(*, request: ApprovalRequest, now: dt.datetime) -> bool:
    """Pending → expired (a deny with reason `expired`); False if already final.
    The caller ends the wait (runs resumes or ends the run)."""
    updated = ApprovalRequest.objects.filter(
        id=request.id, status=ApprovalRequest.Status.PENDING
    ).update(status=ApprovalRequest.Status.EXPIRED, decided_at=now, reason="expired")
    if not updated:
        return False
    request.refresh_from_db()
    audit_record(
        tenant=request.tenant,
        actor=None,
        action="approval.expire",
        object_type="approval",
        object_id=str(request.id),
        before={"status": ApprovalRequest.Status.PENDING},
        after=_audit_view(request),
    )
    _event(request, "approval.expired", _event_view(request))
    return True


def approvers_still_allowed_problem(request: ApprovalRequest) -> str | None:
    votes = request.decisions.filter(
        decision="approve", args_sha256=request.args_sha256
    ).select_related("user")
    for vote in votes:
        if vote.user is None or not vote.user.is_active:
            return "an approver's account no longer exists or is inactive"
        role = (
            Membership.objects.filter(tenant_id=request.tenant_id, user=vote.user)
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


def approval_requests_cancel_for_run(*, run_id: Any, tenant: Tenant) -> int:
    """Cancelling a run cancels its pending approvals (audited, no resume)."""
    pending = list(
        ApprovalRequest.objects.filter(
            run_id=run_id, status=ApprovalRequest.Status.PENDING
        )
    )
    cancelled = 0
    for request in pending:
        updated = ApprovalRequest.objects.filter(
            id=request.id, status=ApprovalRequest.Status.PENDING
        ).update(
            status=ApprovalRequest.Status.CANCELLED,
            decided_at=timezone.now(),
            reason="the run was cancelled",
        )
        if updated:
            audit_record(
                tenant=tenant,
                actor=None,
                action="approval.cancel",
                object_type="approval",
                object_id=str(request.id),
                before={"status": ApprovalRequest.Status.PENDING},
                after={"status": ApprovalRequest.Status.CANCELLED, "run": str(run_id)},
            )
        cancelled += updated
    return cancelled
