"""Open, decide, expire and resolve approval requests; every decision is CAS.

A request is bound to exact arguments (snapshot + sha256) and the rule that asked.
Deciders are serialised on the request row (an UPDATE that bumps `version` is the
first statement of the decision's transaction), so two clicks, two approvers or a
click racing the expiry task give one outcome and one resume.

This app stores; it never resumes. `runs` (runs/services/decide.py) calls these in
its own transaction and then resumes or ends the waiting run, and it hands over
the gated tool call (`GatedCall`) and the check of an edit (`ArgsEditCheck`).
approvals/checks.py answers whether an approval holds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from approvals.checks import GatedCall, may_decide, tenant_requires_deny_reason
from approvals.models import (
    DEFAULT_APPROVER_ROLES,
    ApprovalDecision,
    ApprovalRequest,
)
from approvals.policy import rule_of
from controlplane.models import Tenant
from controlplane.redaction import args_digest, unredact
from controlplane.services import audit_record
from tracing.services import RunIds, run_event_append


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


def call_id_of(request: ApprovalRequest) -> str | None:
    """The id the request's call goes by on the trace (`gen_ai.tool.call.id` of
    its approval span): the model's call id, or for an external call the
    request's own id (its caller named none)."""
    if request.tool_call is not None:
        return request.tool_call.call_id
    if request.kind == ApprovalRequest.Kind.EXTERNAL_CALL:
        return str(request.id)
    return None


def _event(request: ApprovalRequest, type: str, payload: dict[str, Any]) -> None:
    # By ids: the log needs no run row (a new request has not loaded one).
    run = RunIds(pk=request.run_id, tenant_id=request.tenant_id)
    run_event_append(run=run, type=type, payload=payload)


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


@transaction.atomic
def approval_request_open_question(
    *,
    tenant_id: Any,
    run_id: Any,
    tool_name: str,
    rule: str,
    question: str,
    details: dict[str, Any],
) -> ApprovalRequest:
    """Ask whether the run may go on after its tool failed (kind `tool_error`):
    approve, it goes on; deny or expiry, it ends. `details` (the error's code and
    message) is what the decider is shown; anyone who may decide approvals may."""
    canonical = json.dumps(details, sort_keys=True, separators=(",", ":"))
    request = ApprovalRequest.objects.create(
        tenant_id=tenant_id,
        run_id=run_id,
        kind=ApprovalRequest.Kind.TOOL_ERROR,
        tool_name=tool_name,
        rule=rule,
        rule_reason=question,
        approver_roles=list(DEFAULT_APPROVER_ROLES),
        approvals_required=1,
        starter_may_approve=True,
        args_snapshot=details,
        args_sha256=hashlib.sha256(canonical.encode()).hexdigest(),
        expires_at=timezone.now()
        + dt.timedelta(seconds=int(settings.APPROVAL_DEFAULT_TTL_SECONDS)),
    )
    _announce_request(request)
    return request


@transaction.atomic
def approval_request_open_external(
    *,
    tenant_id: Any,
    run_id: Any,
    tool_name: str,
    args: dict[str, Any],
    args_sha256: str,
    decision: dict[str, Any],
    ttl_seconds: int,
    requested_by: User | None = None,
) -> ApprovalRequest:
    """Ask for a decision on a call an agent outside the control plane is about
    to make (kind `external_call`): bound to exactly these arguments and to the
    rule that asked, like a native call's, with no ToolCall row."""
    rule = rule_of(decision)
    request = ApprovalRequest.objects.create(
        tenant_id=tenant_id,
        run_id=run_id,
        kind=ApprovalRequest.Kind.EXTERNAL_CALL,
        tool_name=tool_name,
        rule=str(decision.get("rule", "")),
        rule_ref=rule,
        rule_reason=str(decision.get("reason", "")),
        approver_roles=rule.approver_roles if rule else list(DEFAULT_APPROVER_ROLES),
        approvals_required=rule.approvals_required if rule else 1,
        starter_may_approve=rule.starter_may_approve if rule else True,
        args_snapshot=args,
        args_sha256=args_sha256,
        expires_at=timezone.now() + dt.timedelta(seconds=int(ttl_seconds)),
        requested_by=requested_by,
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
        "tool_call_id": call_id_of(request),
        "tool": request.tool_name,
        "status": request.status,
        "rule": request.rule,
        "rule_reason": request.rule_reason,
        "args": request.args_snapshot,
        "approvals_required": request.approvals_required,
        "expires_at": request.expires_at.isoformat(),
    }


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
    if request.kind not in (
        ApprovalRequest.Kind.TOOL_CALL,
        ApprovalRequest.Kind.EXTERNAL_CALL,
    ):
        what = (
            "a budget extension"
            if request.kind == ApprovalRequest.Kind.BUDGET_EXTENSION
            else "a tool error"
        )
        if args is not None:
            raise ApprovalInputError("args", f"{what} has no arguments")
        if scope != ApprovalRequest.Scope.ONCE:
            raise ApprovalInputError("scope", f"{what} is decided once")
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
