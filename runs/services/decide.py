"""Decide an approval, then end the run's wait (DESIGN.md §4, STYLE.md 21).

`approvals` records the decision (compare-and-set on the request row) and never
imports `runs`; this module calls it inside its own transaction and does what the
decision means for the waiting run: resume it (the step re-checks the approval),
or, for a budget extension, grow the cap or grant the period allowance (approved)
or end the run `budget_exhausted` (denied, expired); for an external agent's
call, finalise its gate (runs.services.gates), which its caller waits on.
Expiry by the periodic task ends the wait the same way as a deny.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.policy import rule_of
from approvals.selectors import approvals_due
from approvals.services import (
    AlreadyDecided,
    ApprovalInputError,
    ArgsEdit,
    approval_decision_record,
    approval_expire,
    extension_summary,
)
from budgets.extensions import budget_grant_create
from controlplane import metrics
from controlplane.services import audit_record
from runs.engine.actions import ToolCall as EngineToolCall
from runs.engine.policy import PolicyAction, PolicyContext, decide_policy
from runs.engine.validation import validate_arguments
from runs.services.budget_extension import run_cap_extend, run_end_budget_exhausted
from runs.services.contract import run_end_repeated_error
from runs.services.gates import gate_args_edit, gate_settle
from runs.services.lifecycle import run_resume
from runs.services.policy import tenant_policy
from runs.services.tool_call_edit import tool_call_args_replace
from runs.tools.registry import tool_contracts_for
from tracing.services import run_event_append


def approval_decide(
    *,
    request: ApprovalRequest,
    decided_by: User,
    approve: bool,
    reason: str = "",
    scope: str = ApprovalRequest.Scope.ONCE,
    args: dict[str, Any] | None = None,
    remote_addr: str | None = None,
) -> ApprovalRequest:
    """Record one decision and, once the request is final, end the run's wait.

    A decision on a request that is no longer pending (or already carries this
    user's vote) raises AlreadyDecided and writes nothing; one past its time-to-live
    expires it (committed, and the wait ends as on a deny) and raises AlreadyDecided.
    """
    with transaction.atomic():
        outcome = approval_decision_record(
            request=request, decided_by=decided_by, approve=approve, reason=reason,
            scope=scope, args=args, args_edit=_args_edit, remote_addr=remote_addr,
        )  # fmt: skip
        if isinstance(outcome, AlreadyDecided):  # it expired before this decision
            _wait_end(outcome.request, decided_by=None, remote_addr=None)
        elif outcome.status != ApprovalRequest.Status.PENDING:
            _wait_end(outcome, decided_by=decided_by, remote_addr=remote_addr)
    if isinstance(outcome, AlreadyDecided):
        raise outcome
    if outcome.status != ApprovalRequest.Status.PENDING and outcome.decided_at:
        metrics.approval_decided(
            decision=outcome.status,
            seconds=(outcome.decided_at - outcome.requested_at).total_seconds(),
        )
    return outcome


def approvals_expire(*, now: dt.datetime | None = None, limit: int = 500) -> int:
    """Expire pending requests past their time-to-live (a deny with reason
    `expired`) and end their runs' waits; returns how many."""
    now = now or timezone.now()
    expired = 0
    for request in approvals_due(now=now, limit=limit):
        with transaction.atomic():
            if approval_expire(request=request, now=now):
                _wait_end(request, decided_by=None, remote_addr=None)
                expired += 1
    return expired


def _wait_end(
    request: ApprovalRequest, *, decided_by: User | None, remote_addr: str | None
) -> None:
    """The request is final: the run waits for it no longer."""
    if request.kind == ApprovalRequest.Kind.BUDGET_EXTENSION:
        _budget_extension_settle(request, decided_by, remote_addr)
    elif request.kind == ApprovalRequest.Kind.EXTERNAL_CALL:
        gate_settle(request=request)  # no run of ours waits: the gate's caller does
    elif (
        request.kind == ApprovalRequest.Kind.TOOL_ERROR
        and request.status != ApprovalRequest.Status.APPROVED
    ):
        why = "denied" if request.status == ApprovalRequest.Status.DENIED else "expired"
        detail = f"{request.rule_reason} No: {why}"
        if request.reason and request.reason != "expired":
            detail += f" ({request.reason})"
        run_end_repeated_error(run_id=request.run_id, detail=detail)
    else:  # a tool call (the step re-checks it), or a tool error let go on
        run_resume(run_id=str(request.run_id))


# --- an approver's edit of the arguments ------------------------------------------


def _args_edit(request: ApprovalRequest, args: dict[str, Any]) -> ArgsEdit | None:
    """Check edited arguments against the tool's schema and the tenant's policy and
    write them to the waiting call; None when they are the ones asked about."""
    if request.kind == ApprovalRequest.Kind.EXTERNAL_CALL:
        return gate_args_edit(request, args)
    new_args, new_sha = _validated_edit(request, args)
    if new_sha == request.args_sha256:
        return None
    policy_changes = _policy_for_edit(request, new_args)
    assert request.tool_call is not None  # budget extensions refuse args earlier
    tool_call_args_replace(
        tool_call=request.tool_call, args=new_args, args_sha256=new_sha
    )
    return ArgsEdit(new_args, new_sha, policy_changes)


def _validated_edit(request: ApprovalRequest, args: Any) -> tuple[dict[str, Any], str]:
    if not isinstance(args, dict):
        raise ApprovalInputError("args", "args must be a JSON object")
    contract = tool_contracts_for(tenant_id=request.tenant_id).get(request.tool_name)
    if contract is None:
        raise ApprovalInputError("args", f"{request.tool_name} has no known schema")
    errors = validate_arguments(contract.input_schema, args)
    if errors:
        raise ApprovalInputError("args", "; ".join(errors))
    assert request.tool_call is not None  # budget extensions refuse args earlier
    call = EngineToolCall.parse(
        request.tool_call.call_id, request.tool_name, json.dumps(args)
    )
    return dict(call.arguments), call.arguments_sha256


def _policy_for_edit(request: ApprovalRequest, args: dict[str, Any]) -> dict[str, Any]:
    """Ask the policy about the edited arguments: an edit may not escape a stricter
    rule. A deny refuses the edit; a rule needing more approvers raises the bar."""
    contract = tool_contracts_for(tenant_id=request.tenant_id)[request.tool_name]
    context = PolicyContext(
        run_id=str(request.run_id), tenant_id=str(request.tenant_id)
    )
    decision = decide_policy(tenant_policy, contract, args, context)
    if decision.action is PolicyAction.DENY:
        raise ApprovalInputError(
            "args", f"the edited arguments are denied by policy: {decision.reason}"
        )
    if decision.action is not PolicyAction.REQUIRE_APPROVAL:
        return {}
    rule = rule_of(decision.to_dict())
    if rule is None or rule.approvals_required <= request.approvals_required:
        return {}
    return {
        "rule": decision.rule,
        "rule_ref": rule,
        "rule_reason": decision.reason,
        "approvals_required": rule.approvals_required,
        "approver_roles": rule.approver_roles,
        "starter_may_approve": rule.starter_may_approve and request.starter_may_approve,
    }


# --- a budget extension's outcome -------------------------------------------------


def _budget_extension_settle(
    request: ApprovalRequest, decided_by: User | None, remote_addr: str | None
) -> None:
    """Approved: grow the cap or grant the period allowance, audited, and resume
    the run at the refused reservation. Denied or expired: end the run."""
    extension = dict(request.extension or {})
    if request.status != ApprovalRequest.Status.APPROVED:
        why = "denied" if request.status == ApprovalRequest.Status.DENIED else "expired"
        detail = f"{extension_summary(extension)} was {why}"
        if request.reason and request.reason != "expired":
            detail += f": {request.reason}"
        run_end_budget_exhausted(
            run_id=request.run_id, stop_reason=extension["stop_reason"], detail=detail
        )
        return
    amount = Decimal(str(extension["amount"]))
    if extension["scope"] == "period":
        grant = budget_grant_create(run=request.run, ask=extension)
        granted: dict[str, Any] = {"grant": grant.pk, "granted": str(grant.amount)}
    else:
        granted = {
            "limit_extensions": run_cap_extend(
                run_id=request.run_id, cap=extension["name"], amount=amount
            )
        }
    audit_record(
        tenant=request.tenant,
        actor=decided_by,
        action="budget.extend",
        object_type="run",
        object_id=str(request.run_id),
        before={"limit": extension["limit"], "used": extension["used"]},
        after={
            "approval": str(request.id),
            "scope": extension["scope"],
            "dimension": extension["dimension"],
            "name": extension["name"],
            "period": extension["period"],
            "amount": extension["amount"],
            "limit": str(Decimal(str(extension["limit"])) + amount),
            **granted,
        },
        remote_addr=remote_addr,
    )
    run_event_append(
        run=request.run,
        type="budget.extended",
        payload={
            "approval_id": str(request.id),
            "dimension": extension["dimension"],
            "name": extension["name"],
            "amount": extension["amount"],
            "decided_by": decided_by.get_username() if decided_by else None,
        },
    )
    run_resume(run_id=str(request.run_id))
