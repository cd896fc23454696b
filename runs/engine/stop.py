"""Stop reasons and the run status each ends in; the host decides, never the model."""

from __future__ import annotations

from enum import StrEnum

from runs.engine.evaluator import Evaluation, Verdict


class StopReason(StrEnum):
    DONE = "done"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_TOKENS = "max_tokens"
    MAX_COST = "max_cost"
    DEADLINE = "deadline"
    NO_PROGRESS = "no_progress"
    POLICY_DENIED = "policy_denied"
    # A tool failed with the same non-retryable error twice in a row and its
    # suggested action did not ask for a person (or the person said stop).
    REPEATED_ERROR = "repeated_error"
    CANCELLED = "cancelled"
    # An input or output guardrail tripped (the run answers with its refusal),
    # or could not run (its model unreachable): it fails closed.
    GUARDRAIL_TRIPPED = "guardrail_tripped"
    GUARDRAIL_UNAVAILABLE = "guardrail_unavailable"
    # A hook refused the run or stopped it; or failed, which blocks too.
    HOOK_BLOCKED = "hook_blocked"
    HOOK_FAILED = "hook_failed"
    MODEL_ERROR = "model_error"
    # The model call was too long for the window: this run ends `failed`, and a
    # recovery branch compacts the context and asks again (spec scenario 16).
    CONTEXT_OVERFLOW = "context_overflow"
    # The context had to be compacted and the compaction failed (it is never
    # tried again: a failing summary call would fail again, and bill again).
    COMPACTION_FAILED = "compaction_failed"
    INTERNAL_ERROR = "internal_error"


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_INPUT = "waiting_input"  # a question to a person (ask_human, MCP)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNVERIFIED = "unverified"
    BUDGET_EXHAUSTED = "budget_exhausted"
    POLICY_BLOCKED = "policy_blocked"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.UNVERIFIED,
        RunStatus.BUDGET_EXHAUSTED,
        RunStatus.POLICY_BLOCKED,
        RunStatus.CANCELLED,
    }
)

BUDGET_STOP_REASONS = frozenset(
    {
        StopReason.MAX_STEPS,
        StopReason.MAX_TOOL_CALLS,
        StopReason.MAX_TOKENS,
        StopReason.MAX_COST,
        StopReason.DEADLINE,
    }
)

# A safety layer said no (a guardrail or hook failing is `failed`: nobody said no).
BLOCKED_STOP_REASONS = frozenset(
    {StopReason.POLICY_DENIED, StopReason.GUARDRAIL_TRIPPED, StopReason.HOOK_BLOCKED}
)


def terminal_status(reason: StopReason, evaluation: Evaluation | None) -> RunStatus:
    """The run status for a stop reason; `done` needs the evaluator's verdict.

    `done` without an evaluation is `unverified`: the model saying it finished is
    never enough for `succeeded`.
    """
    if reason is StopReason.DONE:
        if evaluation is None:
            return RunStatus.UNVERIFIED
        if evaluation.verdict is Verdict.PASSED:
            return RunStatus.SUCCEEDED
        return RunStatus.FAILED
    if reason in BUDGET_STOP_REASONS:
        return RunStatus.BUDGET_EXHAUSTED
    if reason in BLOCKED_STOP_REASONS:
        return RunStatus.POLICY_BLOCKED
    if reason is StopReason.CANCELLED:
        return RunStatus.CANCELLED
    return RunStatus.FAILED
