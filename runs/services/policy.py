"""The tenant's approval policy as the engine's policy hook.

The tenant's rules (approvals.policy) are applied in order and the first that
matches decides; without a match the defaults apply (read-only tools from trusted
sources run, everything else waits for a human). An earlier `scope: run` approval
of the same tool under the same rule lets the call run. Nobody who may decide →
deny. Anything that raises here is a deny (the engine's `decide_policy`).

It lives in `runs`, above `approvals`, because it reads the run: a rule that
keeps the run's starter from approving counts the approvers without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from approvals.checks import approval_run_scope_grant
from approvals.models import DEFAULT_APPROVER_ROLES, ApprovalPolicyRule, ApprovalRequest
from approvals.policy import (
    RULE_PREFIX,
    RULES_READ,
    eligible_approvers,
    policy_rules_for,
    rule_matches,
)
from runs.engine.contracts import ApprovalNeed, ToolContract
from runs.engine.policy import PolicyAction, PolicyContext, PolicyDecision
from runs.models import Run

# `PolicyContext.attributes` key: the user who asked, when it is not the run's
# starter (an external agent's gate).
REQUESTED_BY = "cp.requested_by"


def _approver_available(
    context: PolicyContext, roles: list[str], required: int, starter_may: bool
) -> bool:
    if not context.approver_available:  # headless: the host says nobody is there
        return False
    starter_id = None
    if not starter_may:
        # An external agent's call: the token user who asked is the starter.
        starter_id = context.attributes.get(REQUESTED_BY) or (
            Run.objects.filter(id=context.run_id)
            .values_list("started_by_id", flat=True)
            .first()
        )
    available = eligible_approvers(
        tenant_id=context.tenant_id, roles=roles, exclude_user_id=starter_id
    )
    return available >= required


def _run_scope_grant(
    context: PolicyContext, contract: ToolContract, rule: str
) -> ApprovalRequest | None:
    """An earlier `scope: run` approval of this tool under this rule in this run,
    whose approvers still hold a role that may approve."""
    return approval_run_scope_grant(
        run_id=context.run_id, tool_name=contract.name, rule=rule
    )


def tenant_policy(
    contract: ToolContract, arguments: Mapping[str, Any], context: PolicyContext
) -> PolicyDecision:
    """The engine's policy hook (settings.RUN_POLICY_HOOK): the first of the
    tenant's rules that matches decides, else the defaults."""
    rules = context.attributes.get(RULES_READ)
    if rules is None:
        rules = policy_rules_for(context.tenant_id)
    for rule in rules:
        if not rule_matches(rule, contract, arguments):
            continue
        name = f"{RULE_PREFIX}{rule.id}"
        if rule.action == ApprovalPolicyRule.Action.ALLOW:
            if contract.approval is ApprovalNeed.ALWAYS:
                break  # an admin wants every call of it asked about
            return PolicyDecision(PolicyAction.ALLOW, name, f"allowed by {rule.name}")
        if rule.action == ApprovalPolicyRule.Action.DENY:
            return PolicyDecision(PolicyAction.DENY, name, f"denied by {rule.name}")
        grant = _run_scope_grant(context, contract, name)
        if grant is not None:
            return PolicyDecision(
                PolicyAction.ALLOW,
                name,
                f"approved for the whole run by approval {grant.id} ({rule.name})",
            )
        if not _approver_available(
            context, rule.approver_roles, rule.approvals_required,
            rule.starter_may_approve,
        ):  # fmt: skip
            return PolicyDecision(
                PolicyAction.DENY,
                name,
                f"{rule.name} needs {rule.approvals_required} approver(s) with "
                f"role {' or '.join(rule.approver_roles)} and this tenant has none",
            )
        return PolicyDecision(
            PolicyAction.REQUIRE_APPROVAL,
            name,
            f"{contract.name} needs approval under rule {rule.name}",
            ttl_seconds=rule.ttl_seconds or settings.APPROVAL_DEFAULT_TTL_SECONDS,
        )
    return _default_decision(contract, context)


def _default_decision(contract: ToolContract, context: PolicyContext) -> PolicyDecision:
    if contract.approval is ApprovalNeed.NEVER:
        return PolicyDecision(
            PolicyAction.ALLOW,
            "tool.never_ask",
            f"an admin set {contract.name} to run without approval",
        )
    if contract.is_read_only and contract.approval is not ApprovalNeed.ALWAYS:
        return PolicyDecision(
            PolicyAction.ALLOW,
            "default.read_only",
            "read-only tool from a trusted source",
        )
    grant = _run_scope_grant(context, contract, "default.side_effect")
    if grant is not None:
        return PolicyDecision(
            PolicyAction.ALLOW,
            "default.side_effect",
            f"approved for the whole run by approval {grant.id}",
        )
    if not _approver_available(context, list(DEFAULT_APPROVER_ROLES), 1, True):
        return PolicyDecision(
            PolicyAction.DENY,
            "default.no_approver",
            f"{contract.name} has side effects and nobody in this tenant may "
            "approve it",
        )
    claim = "" if contract.trusted else " (untrusted source: its claims are ignored)"
    why = f"{contract.name} has effect {contract.effective_effect}{claim}"
    if contract.approval is ApprovalNeed.ALWAYS:
        why += "; it is set to always need approval"
    else:
        why += " and needs approval"
    return PolicyDecision(
        PolicyAction.REQUIRE_APPROVAL,
        "default.side_effect",
        why,
        ttl_seconds=settings.APPROVAL_DEFAULT_TTL_SECONDS,
    )
