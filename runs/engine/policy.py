"""Policy decisions for a proposed tool call: allow, require approval, or deny.

The approvals app supplies its own hook; until then `default_policy` applies. A hook
is untrusted code too: if it raises or returns something else, the call is denied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from runs.engine.contracts import ApprovalNeed, ToolContract


class PolicyAction(StrEnum):
    ALLOW = "allow"
    REQUIRE_APPROVAL = "require_approval"
    DENY = "deny"


@dataclass(frozen=True)
class PolicyDecision:
    action: PolicyAction
    rule: str  # which rule decided, recorded on the approval request and the span
    reason: str
    ttl_seconds: int | None = None  # how long an approval request may wait

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": str(self.action),
            "rule": self.rule,
            "reason": self.reason,
            "ttl_seconds": self.ttl_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyDecision:
        ttl = data.get("ttl_seconds")
        return cls(
            action=PolicyAction(data["action"]),
            rule=str(data["rule"]),
            reason=str(data["reason"]),
            ttl_seconds=None if ttl is None else int(ttl),
        )


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may know about the call besides the contract and arguments."""

    run_id: str
    tenant_id: str = ""
    agent_name: str = ""
    approver_available: bool = True  # False when headless or nobody may approve
    attributes: Mapping[str, Any] = field(default_factory=dict)


class PolicyHook(Protocol):
    def __call__(
        self,
        contract: ToolContract,
        arguments: Mapping[str, Any],
        context: PolicyContext,
    ) -> PolicyDecision: ...


def default_policy(
    contract: ToolContract, arguments: Mapping[str, Any], context: PolicyContext
) -> PolicyDecision:
    """Allow read-only tools from a trusted source; everything else needs a human
    (a tool an admin set to `always` or `never` ask is asked about, or not)."""
    if contract.approval is ApprovalNeed.NEVER:
        return PolicyDecision(
            PolicyAction.ALLOW, "tool.never_ask", "an admin set it to run unasked"
        )
    if contract.is_read_only and contract.approval is not ApprovalNeed.ALWAYS:
        return PolicyDecision(
            PolicyAction.ALLOW,
            "default.read_only",
            "read-only tool from a trusted source",
        )
    if not context.approver_available:
        return PolicyDecision(
            PolicyAction.DENY,
            "default.no_approver",
            f"{contract.name} has side effects and nobody can approve it",
        )
    return PolicyDecision(
        PolicyAction.REQUIRE_APPROVAL,
        "default.side_effect",
        f"{contract.name} has effect {contract.effective_effect} and needs approval",
    )


def decide_policy(
    hook: PolicyHook,
    contract: ToolContract,
    arguments: Mapping[str, Any],
    context: PolicyContext,
) -> PolicyDecision:
    """Ask the hook; fail safe: an exception or a non-decision is a deny."""
    try:
        decision = hook(contract, arguments, context)
    except Exception as exc:  # noqa: BLE001 - any hook failure must deny
        return PolicyDecision(
            PolicyAction.DENY,
            "hook_error",
            f"policy hook failed ({type(exc).__name__}); the call is blocked",
        )
    if not isinstance(decision, PolicyDecision) or not isinstance(
        decision.action, PolicyAction
    ):
        return PolicyDecision(
            PolicyAction.DENY,
            "hook_invalid_decision",
            "policy hook returned no valid decision; the call is blocked",
        )
    return decision
