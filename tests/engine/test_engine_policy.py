from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runs.engine.contracts import ToolContract
from runs.engine.policy import (
    PolicyAction,
    PolicyContext,
    PolicyDecision,
    decide_policy,
    default_policy,
)
from tests.engine.fakes import read_only_contract, write_contract

CONTEXT = PolicyContext(run_id="r1", tenant_id="t1")


def test_default_policy_allows_trusted_read_only_tools() -> None:
    decision = default_policy(read_only_contract(), {"order_id": "4821"}, CONTEXT)
    assert decision.action is PolicyAction.ALLOW


def test_default_policy_requires_approval_for_writes() -> None:
    decision = default_policy(write_contract(), {"order_id": "4821"}, CONTEXT)
    assert decision.action is PolicyAction.REQUIRE_APPROVAL
    assert decision.rule == "default.side_effect"


def test_default_policy_requires_approval_for_untrusted_read_only_claims() -> None:
    contract = ToolContract.from_dict(
        {
            "name": "mcp_read",
            "description": "reads",
            "effect": "read_only",
            "input_schema": {"type": "object"},
        }
    )
    decision = default_policy(contract, {}, CONTEXT)
    assert decision.action is PolicyAction.REQUIRE_APPROVAL


def test_default_policy_denies_writes_when_nobody_can_approve() -> None:
    headless = PolicyContext(run_id="r1", approver_available=False)
    decision = default_policy(write_contract(), {"order_id": "4821"}, headless)
    assert decision.action is PolicyAction.DENY
    assert decision.rule == "default.no_approver"


def test_a_hook_that_raises_denies() -> None:
    def broken(
        contract: ToolContract, args: Mapping[str, Any], ctx: PolicyContext
    ) -> PolicyDecision:
        raise RuntimeError("db down")

    decision = decide_policy(broken, read_only_contract(), {}, CONTEXT)
    assert decision.action is PolicyAction.DENY
    assert decision.rule == "hook_error"
    assert "db down" not in decision.reason


def test_a_hook_that_returns_garbage_denies() -> None:
    def sloppy(
        contract: ToolContract, args: Mapping[str, Any], ctx: PolicyContext
    ) -> Any:
        return "allow"

    decision = decide_policy(sloppy, read_only_contract(), {}, CONTEXT)
    assert decision.action is PolicyAction.DENY
    assert decision.rule == "hook_invalid_decision"


def test_policy_decision_round_trips() -> None:
    decision = PolicyDecision(
        PolicyAction.REQUIRE_APPROVAL, "refund.over_100", "big", 3600
    )
    assert PolicyDecision.from_dict(decision.to_dict()) == decision
