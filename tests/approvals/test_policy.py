"""The tenant policy hook: defaults, ordered rules, conditions, fail-safe deny."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalPolicyRule
from approvals.policy import RULES_READ, policy_rules_for
from controlplane.services import membership_set
from runs.engine.actions import ToolCall
from runs.engine.contracts import Effect, ToolContract, ToolSource
from runs.engine.policy import PolicyAction, PolicyContext, decide_policy
from runs.engine.step import GateVerdict, gate_tool_call
from runs.engine.tools import Tool, ToolRegistry
from runs.services.policy import tenant_policy
from runs.tools.registry import BUILTIN_TOOLS
from tests.wire import wire

REFUND = BUILTIN_TOOLS["refund"].contract
LOOKUP = BUILTIN_TOOLS["lookup_order"].contract


def ctx(tenant: Any) -> PolicyContext:
    return PolicyContext(
        run_id="00000000-0000-0000-0000-000000000000", tenant_id=str(tenant.id)
    )


def rule(tenant: Any, **fields: Any) -> ApprovalPolicyRule:
    fields.setdefault("name", "r")
    return ApprovalPolicyRule.objects.create(tenant=tenant, **fields)


def test_defaults_allow_trusted_read_only_and_ask_for_everything_else(
    tenant, operator_user
):
    assert tenant_policy(LOOKUP, {"order_id": "4821"}, ctx(tenant)).action == "allow"
    decision = tenant_policy(REFUND, {"amount": 5}, ctx(tenant))
    assert decision.action == PolicyAction.REQUIRE_APPROVAL
    assert decision.rule == "default.side_effect"
    assert decision.ttl_seconds and decision.ttl_seconds > 0


def test_a_tenant_nobody_may_approve_in_denies_side_effects(tenant, viewer_user):
    decision = tenant_policy(REFUND, {"amount": 5}, ctx(tenant))
    assert decision.action == PolicyAction.DENY
    assert decision.rule == "default.no_approver"
    # Read-only tools still run.
    assert tenant_policy(LOOKUP, {}, ctx(tenant)).action == PolicyAction.ALLOW


def test_rules_the_host_read_already_are_not_read_again(tenant, operator_user):
    rule(tenant, tool="lookup_*", action=ApprovalPolicyRule.Action.DENY)
    rules = policy_rules_for(str(tenant.id))
    context = PolicyContext(
        run_id=ctx(tenant).run_id,
        tenant_id=str(tenant.id),
        attributes={RULES_READ: rules},
    )
    with wire() as sent:
        decision = tenant_policy(LOOKUP, {"order_id": "4821"}, context)
    assert decision.action == PolicyAction.DENY and sent.executed == []


def test_an_untrusted_tool_claiming_read_only_still_needs_approval(
    tenant, operator_user
):
    handled: list[Any] = []
    contract = ToolContract(
        name="mcp_search",
        description="Third-party search (claims readOnlyHint).",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        effect=Effect.READ_ONLY,
        source=ToolSource.UNTRUSTED,
    )
    decision = tenant_policy(contract, {"q": "x"}, ctx(tenant))
    assert decision.action == PolicyAction.REQUIRE_APPROVAL
    assert "untrusted" in decision.reason
    # Missing facts (no declared effect, unknown source) get the same default.
    bare = ToolContract.from_dict(
        {"name": "bare", "description": "no facts", "input_schema": {"type": "object"}}
    )
    assert tenant_policy(bare, {}, ctx(tenant)).action == "require_approval"
    # Through the engine's gate the handler is never reached.
    tool = Tool(contract, lambda args, c: handled.append(args) or {})
    gate = gate_tool_call(
        ToolCall.parse("c1", "mcp_search", '{"q": "x"}'),
        ToolRegistry([tool]),
        tenant_policy,
        ctx(tenant),
    )
    assert gate.verdict is GateVerdict.NEEDS_APPROVAL
    assert handled == []


def test_first_matching_rule_decides_with_conditions_on_arguments(
    tenant, operator_user
):
    big = rule(
        tenant, name="big refunds", tool="refund", position=1,
        action="require_approval", ttl_seconds=600,
        conditions=[{"arg": "amount", "op": ">", "value": 100}],
    )  # fmt: skip
    rule(tenant, name="small refunds", tool="ref*", position=2, action="allow")
    rule(tenant, name="never", tool="*", position=3, action="deny")
    decision = tenant_policy(REFUND, {"amount": 150}, ctx(tenant))
    assert decision.action == PolicyAction.REQUIRE_APPROVAL
    assert decision.rule == f"tenant_rule:{big.id}"
    assert decision.ttl_seconds == 600
    assert tenant_policy(REFUND, {"amount": 100}, ctx(tenant)).action == "allow"
    assert tenant_policy(LOOKUP, {"order_id": "1"}, ctx(tenant)).action == "deny"


@pytest.mark.parametrize(
    ("op", "value", "amount", "matches"),
    [
        ("==", 5, 5, True),
        ("!=", 5, 5, False),
        ("<", 5, 4, True),
        ("<=", 5, 6, False),
        (">=", 5, 5, True),
        ("in", [1, 2], 2, True),
        ("not_in", [1, 2], 2, False),
    ],
)
def test_condition_operators(tenant, operator_user, op, value, amount, matches):
    rule(
        tenant, tool="refund", action="deny",
        conditions=[{"arg": "amount", "op": op, "value": value}],
    )  # fmt: skip
    decision = tenant_policy(REFUND, {"amount": amount}, ctx(tenant))
    assert (decision.action == PolicyAction.DENY) is matches


def test_effect_and_source_filters(tenant, operator_user):
    rule(tenant, tool="*", effects=["read_only"], source="untrusted", action="deny")
    # The builtin lookup is trusted: the rule does not apply.
    assert tenant_policy(LOOKUP, {}, ctx(tenant)).action == PolicyAction.ALLOW


def test_a_rule_that_raises_during_evaluation_denies_the_call(tenant, operator_user):
    # A corrupt rule (bypassing save-time validation): `>` on a string argument.
    rule(
        tenant, tool="refund", action="allow",
        conditions=[{"arg": "order_id", "op": ">", "value": 1}],
    )  # fmt: skip
    decision = decide_policy(tenant_policy, REFUND, {"order_id": "4821"}, ctx(tenant))
    assert decision.action == PolicyAction.DENY
    assert decision.rule == "hook_error"


def test_multi_approver_rule_denies_when_the_tenant_has_too_few_approvers(
    tenant, operator_user, make_member
):
    rule(tenant, tool="refund", action="require_approval", approvals_required=2)
    assert tenant_policy(REFUND, {}, ctx(tenant)).action == PolicyAction.DENY
    make_member(tenant, "olga-operator", "operator")
    assert tenant_policy(REFUND, {}, ctx(tenant)).action == "require_approval"


def test_rule_roles_limit_who_counts_as_an_approver(tenant, operator_user):
    rule(tenant, tool="refund", action="require_approval", approver_roles=["admin"])
    assert tenant_policy(REFUND, {}, ctx(tenant)).action == PolicyAction.DENY
    membership_set(tenant=tenant, user=operator_user, role="admin")
    assert tenant_policy(REFUND, {}, ctx(tenant)).action == "require_approval"
