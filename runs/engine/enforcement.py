"""The host-only contract fields acting on calls (spec/loop-tools-protocol.md §1.3–1.5).

- `cost.quota` per run: counted in the run's `ContractLedger` (engine state) and
  checked before execution; a refused call is an EBUDGET observation, not executed.
  Per-tenant periods are counted by the host in its database.
- `retryable` drives automatic retries, bounded: only a transient error the tool
  marks retryable, only where a repeat cannot do harm (a read, or a write the tool
  deduplicates by key or that is idempotent by nature), never EPERM/EACCES, at most
  `RetryPolicy.max_per_tool` retries per tool per run (the run's retry budget),
  with exponential backoff and jitter.
- `suggested_action` escalates a non-retryable error repeated twice by the same
  tool with the same code: `stop_and_request_human` asks a person whether the run
  may go on; anything else ends the run `repeated_error`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runs.engine.contracts import QuotaLimit, ToolContract
from runs.engine.envelope import ErrorCode, SuggestedAction, ToolResult
from runs.engine.tools import Tool, may_rerun_after_crash

# The rule name a repeated error's question to a person goes under.
REPEATED_ERROR_RULE = "contract.repeated_error"
# A non-retryable error this many times in a row (same tool, same code) escalates.
REPEATED_ERROR_LIMIT = 2

# Codes the host never repeats on its own: the model must change something (its
# arguments, its tool), a person must (permissions, budget), or the outcome of
# the first attempt is not known.
_NEVER_AUTO_RETRIED = frozenset(
    {
        ErrorCode.EINVAL,
        ErrorCode.ENOTOOL,
        ErrorCode.EPATH,
        ErrorCode.EOUTPUT,
        ErrorCode.EPERM,
        ErrorCode.EACCES,
        ErrorCode.EBUDGET,
        ErrorCode.EUNKNOWN,
        ErrorCode.ECANCELED,
    }
)

# Errors that say nothing about the tool: the run stopping, an unknown outcome.
_NOT_COUNTED = frozenset({ErrorCode.ECANCELED, ErrorCode.EUNKNOWN})


@dataclass(frozen=True)
class RetryPolicy:
    max_per_tool: int = 3  # per tool per run (spec §1.3: "单工具 ≤ 3 次")
    backoff_seconds: float = 0.5  # the first retry's delay; doubles each time
    max_backoff_seconds: float = 8.0
    # No retry starts once a call has taken this long, attempts and waits
    # included: a step must end well within its worker's time limit.
    max_call_seconds: float = 30.0

    def delay(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Exponential backoff with full jitter in [0.5, 1.5) of the step."""
        base = min(
            self.max_backoff_seconds, self.backoff_seconds * 2 ** (retry_number - 1)
        )
        draw = random.random() if rng is None else rng.random()
        return float(base * (0.5 + draw))


NO_RETRIES = RetryPolicy(max_per_tool=0)


@dataclass(frozen=True)
class Escalation:
    """A non-retryable error repeated: ask a person, or end the run."""

    tool_name: str
    code: str
    message: str
    ask_human: bool

    def question(self) -> str:
        return (
            f"{self.tool_name} failed {REPEATED_ERROR_LIMIT} times in a row with "
            f"{self.code}: {self.message}. Let the run go on?"
        )

    def detail(self) -> str:
        return (
            f"{self.tool_name} failed {REPEATED_ERROR_LIMIT} times in a row with "
            f"{self.code}: {self.message}"
        )


@dataclass
class ContractLedger:
    """What the contract counts over a run, as JSON-ready data in the engine state."""

    quota_used: dict[str, int] = field(default_factory=dict)  # per-run bucket → calls
    retries: dict[str, int] = field(default_factory=dict)  # tool → automatic retries
    # tool → [code, times in a row] of its last non-retryable error
    errors: dict[str, list[Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "quota_used": dict(self.quota_used),
            "retries": dict(self.retries),
            "errors": {name: list(v) for name, v in self.errors.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ContractLedger:
        data = data or {}
        return cls(
            quota_used={k: int(v) for k, v in (data.get("quota_used") or {}).items()},
            retries={k: int(v) for k, v in (data.get("retries") or {}).items()},
            errors={k: list(v) for k, v in (data.get("errors") or {}).items()},
        )

    @property
    def empty(self) -> bool:
        return not (self.quota_used or self.retries or self.errors)


def quota_refused_result(tool_name: str, limit: QuotaLimit) -> ToolResult:
    """A call a quota refused: not executed; the model should not insist."""
    if limit.per_run:
        return ToolResult.failure(
            ErrorCode.EBUDGET,
            f"{tool_name} was not executed: its quota of {limit.describe()} is used "
            "up in this run",
            retryable=False,
            suggested_action=str(SuggestedAction.DO_NOT_RETRY),
        )
    return ToolResult.failure(
        ErrorCode.EBUDGET,
        f"{tool_name} was not executed: the tenant's quota of {limit.describe()} "
        "is used up for now",
        retryable=False,
        suggested_action=str(SuggestedAction.RETRY_LATER),
    )


def run_quota_refusal(tool: Tool, ledger: ContractLedger) -> ToolResult | None:
    """The refusal when a per-run quota of the tool is used up, else None."""
    for limit in tool.contract.quotas:
        if limit.per_run and ledger.quota_used.get(limit.bucket, 0) >= limit.limit:
            return quota_refused_result(tool.name, limit)
    return None


def charge_run_quota(tool: Tool, ledger: ContractLedger) -> None:
    for bucket in {limit.bucket for limit in tool.contract.quotas if limit.per_run}:
        ledger.quota_used[bucket] = ledger.quota_used.get(bucket, 0) + 1


def may_auto_retry(
    contract: ToolContract,
    result: ToolResult,
    ledger: ContractLedger,
    policy: RetryPolicy,
) -> bool:
    """Whether the host repeats the call itself (spec §1.3 retry rules)."""
    error = result.error
    if error is None or not error.retryable or error.code in _NEVER_AUTO_RETRIED:
        return False
    if not may_rerun_after_crash(contract):  # an irreversible or unkeyed write
        return False
    return ledger.retries.get(contract.name, 0) < policy.max_per_tool


def note_outcome(
    tool_name: str, result: ToolResult, ledger: ContractLedger
) -> Escalation | None:
    """Count the tool's non-retryable errors in a row; an Escalation when the same
    code came `REPEATED_ERROR_LIMIT` times (the count starts over after it)."""
    error = result.error
    if error is None:
        ledger.errors.pop(tool_name, None)
        return None
    if error.retryable or error.code in _NOT_COUNTED:
        return None
    code = str(error.code)
    last = ledger.errors.get(tool_name)
    times = last[1] + 1 if last and last[0] == code else 1
    if times < REPEATED_ERROR_LIMIT:
        ledger.errors[tool_name] = [code, times]
        return None
    ledger.errors.pop(tool_name, None)
    return Escalation(
        tool_name=tool_name,
        code=code,
        message=error.message,
        ask_human=error.suggested_action == SuggestedAction.STOP_AND_REQUEST_HUMAN,
    )
