"""What the control plane answers: gates, reservations, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GATE_FINAL = frozenset({"allowed", "denied", "approved", "expired", "cancelled"})
GATE_PASSED = frozenset({"allowed", "approved"})


@dataclass(frozen=True)
class Gate:
    """A tool call put to the tenant's policy (POST /api/v1/gates/).

    `arguments` are the ones to execute with: an approver's edit replaces the
    asked ones. `status` is final once `final` is true."""

    id: str
    run_id: str
    trace_id: str
    tool: str
    arguments: dict[str, Any]
    decision: str
    status: str
    final: bool
    rule: str | None = None
    reason: str | None = None
    approval_id: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    expires_at: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """Final and the call may go ahead (allowed by policy or approved)."""
        return self.final and self.status in GATE_PASSED

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Gate:
        arguments = body.get("arguments")
        return cls(
            id=str(body["id"]),
            run_id=str(body.get("run_id") or ""),
            trace_id=str(body.get("trace_id") or ""),
            tool=str(body.get("tool") or ""),
            arguments=dict(arguments) if isinstance(arguments, dict) else {},
            decision=str(body.get("decision") or ""),
            status=str(body["status"]),
            final=bool(body.get("final", body["status"] in GATE_FINAL)),
            rule=_optional(body.get("rule")),
            reason=_optional(body.get("reason")),
            approval_id=_optional(body.get("approval_id")),
            decided_by=_optional(body.get("decided_by")),
            decided_at=_optional(body.get("decided_at")),
            expires_at=_optional(body.get("expires_at")),
            raw=body,
        )


@dataclass(frozen=True)
class Reservation:
    """Spend reserved against the tenant's budget for an external run
    (POST /api/v1/budget/reservations/). Amounts as the API gives them: tokens
    as ints, cost as a decimal string."""

    id: str
    run_id: str
    trace_id: str
    kind: str
    status: str  # reserved | settled | released
    reserved: dict[str, Any]
    actual: dict[str, Any] | None
    expires_at: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Reservation:
        actual = body.get("actual")
        return cls(
            id=str(body["id"]),
            run_id=str(body.get("run_id") or ""),
            trace_id=str(body.get("trace_id") or ""),
            kind=str(body.get("kind") or ""),
            status=str(body["status"]),
            reserved=dict(body.get("reserved") or {}),
            actual=dict(actual) if isinstance(actual, dict) else None,
            expires_at=str(body.get("expires_at") or ""),
            raw=body,
        )


def _optional(value: Any) -> str | None:
    return None if value is None else str(value)


class ControlPlaneError(Exception):
    """An error answer: `status` (HTTP), `code` and `message` from the body's
    `{"error": {...}}`, and the whole `error` object in `detail`."""

    def __init__(
        self, status: int, code: str, message: str, detail: dict[str, Any]
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail


class BudgetExhausted(ControlPlaneError):
    """409 budget_exhausted: the reservation would cross a period limit;
    `dimension` (e.g. tenant_cost_per_day) and `period` say which."""

    @property
    def dimension(self) -> str:
        return str(self.detail.get("dimension", ""))

    @property
    def period(self) -> str:
        return str(self.detail.get("period", ""))


class GateDenied(Exception):
    """The gated call may not run: denied by policy or a person, expired or
    cancelled. `gate` is the final gate (its `reason` says why)."""

    def __init__(self, gate: Gate) -> None:
        why = f": {gate.reason}" if gate.reason else ""
        super().__init__(f"{gate.tool} was {gate.status}{why}")
        self.gate = gate


class GateTimeout(Exception):
    """The gate was still pending when the caller's own wait ran out."""

    def __init__(self, gate: Gate) -> None:
        super().__init__(f"gate {gate.id} for {gate.tool} is still {gate.status}")
        self.gate = gate
