"""The phases of one step as small functions the host composes and persists between.

Order per step (DESIGN.md §4):
  1. `plan_model_call` (check-before-spend, output reservation) → `call_model` →
     `charge_model_call` → `record_reply` (persist the assistant turn now);
  2. for each open call, in order: `gate_tool_call` (lookup → validation → policy)
     → approval (host) → `execute_call` (tool budget → execute) → `record_result`
     (persist before the next model call);
  3. `check_progress`, then the host decides whether to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from runs.engine.actions import (
    Action,
    FinalAnswer,
    InvalidReply,
    ModelReply,
    ToolCall,
    Usage,
    decode_reply,
)
from runs.engine.adapters import DeltaSink, ModelAdapter, ModelError
from runs.engine.budget import (
    FREE,
    BudgetLimits,
    BudgetVector,
    ModelPrice,
    charge_tool_call,
    check_before_model_call,
    check_before_tool_call,
    estimate_input_tokens,
    model_call_reservation,
)
from runs.engine.disclosure import not_loaded_result
from runs.engine.enforcement import (
    NO_RETRIES,
    ContractLedger,
    RetryPolicy,
    charge_run_quota,
    may_auto_retry,
    run_quota_refusal,
)
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.observation import (
    DEFAULT_OBSERVATION_CHARS,
    Artifact,
    Observation,
    observe,
)
from runs.engine.policy import (
    PolicyAction,
    PolicyContext,
    PolicyDecision,
    PolicyHook,
    decide_policy,
)
from runs.engine.progress import ProgressTracker, step_fingerprint
from runs.engine.stop import StopReason
from runs.engine.tools import (
    SecretReader,
    Tool,
    ToolContext,
    ToolRegistry,
    execute_tool,
)
from runs.engine.transcript import Transcript
from runs.engine.validation import validate_arguments

_MAX_LISTED_TOOLS = 30


@dataclass(frozen=True)
class ModelCallPlan:
    max_output_tokens: int
    estimated_input_tokens: int
    reservation: BudgetVector  # what the host's ledger reserves before the call


def plan_model_call(
    usage: BudgetVector,
    limits: BudgetLimits,
    transcript: Transcript,
    tools: Sequence[Mapping[str, Any]],
    *,
    reserve_output_tokens: int,
    price: ModelPrice = FREE,
) -> ModelCallPlan | StopReason:
    """Check before spending; the plan's `max_output_tokens` is the reservation."""
    estimated = estimate_input_tokens(transcript.messages_json(), tools)
    refused = check_before_model_call(
        usage,
        limits,
        reserve_output_tokens=reserve_output_tokens,
        estimated_input_tokens=estimated,
        price=price,
    )
    if refused is not None:
        return refused
    reservation = model_call_reservation(
        reserve_output_tokens=reserve_output_tokens,
        estimated_input_tokens=estimated,
        price=price,
    )
    return ModelCallPlan(reserve_output_tokens, estimated, reservation)


def call_model(
    model: ModelAdapter,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    plan: ModelCallPlan,
    *,
    on_delta: DeltaSink | None = None,
) -> ModelReply | ModelError:
    """Call the adapter; any failure comes back as a `ModelError` value.
    `on_delta` sees a streamed reply's text as it comes (display only)."""
    try:
        if on_delta is not None:
            return model.complete(
                messages, tools, plan.max_output_tokens, on_delta=on_delta
            )
        return model.complete(messages, tools, plan.max_output_tokens)
    except ModelError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a broken adapter is a model_error
        return ModelError("adapter_error", type(exc).__name__)


def billable_usage(reply: ModelReply, plan: ModelCallPlan) -> Usage:
    """The reply's reported usage; the plan's estimate when the provider reported none.

    A provider (or script) that omits usage must not get around the token budget.
    """
    if reply.usage.input_tokens or reply.usage.output_tokens:
        return reply.usage
    return Usage(plan.estimated_input_tokens, plan.max_output_tokens)


def record_reply(transcript: Transcript, reply: ModelReply) -> Action:
    """Append the assistant turn (persist it before any tool runs); return the action.

    An `InvalidReply` also appends a user note telling the model what was wrong.
    """
    action = decode_reply(reply)
    if isinstance(action, FinalAnswer):
        transcript.append_assistant(action.text, ())
    elif isinstance(action, InvalidReply):
        transcript.append_assistant(reply.text, ())
        transcript.append_user_note(action.reason)
    else:
        transcript.append_assistant(action.text, action.calls)
    return action


def pending_tool_calls(transcript: Transcript) -> list[ToolCall]:
    """The open calls rebuilt from the transcript alone (for a resumed step)."""
    open_ids = set(transcript.open_calls())
    return [
        ToolCall.parse(
            str(call["id"]),
            str(call["function"]["name"]),
            str(call["function"].get("arguments") or ""),
        )
        for call in transcript.last_assistant_calls()
        if str(call["id"]) in open_ids
    ]


class GateVerdict(StrEnum):
    EXECUTE = "execute"  # allowed: go on to execute_call
    REFUSE = "refuse"  # the model can fix it: record `result`, go on with the run
    NEEDS_APPROVAL = "needs_approval"  # persist an approval request and stop the task
    DENY = "deny"  # policy denied: record `result`, stop the run as policy_denied


@dataclass(frozen=True)
class CallGate:
    verdict: GateVerdict
    call: ToolCall
    tool: Tool | None = None
    result: ToolResult | None = None  # set for REFUSE and DENY
    decision: PolicyDecision | None = None  # set once policy was asked


def gate_tool_call(
    call: ToolCall,
    registry: ToolRegistry,
    policy: PolicyHook,
    context: PolicyContext,
    *,
    loaded: Collection[str] = (),
) -> CallGate:
    """Lookup (ENOTOOL) → strict validation (EINVAL) → policy (fail-safe).

    `loaded`: the deferred tools tool_search found in this run; another deferred
    tool is refused as not loaded (docs/agents.md, Tool exposure)."""
    if call.parse_error is not None:
        result = ToolResult.failure(
            ErrorCode.EINVAL, f"{call.name}: {call.parse_error}"
        )
        return CallGate(GateVerdict.REFUSE, call, result=result)
    tool = registry.get(call.name)
    if tool is not None and tool.deferred and tool.name not in loaded:
        return CallGate(GateVerdict.REFUSE, call, result=not_loaded_result(call.name))
    if tool is None:
        visible = [t.name for t in registry.visible(loaded)]
        listed = ", ".join(visible[:_MAX_LISTED_TOOLS])
        result = ToolResult.failure(
            ErrorCode.ENOTOOL, f"there is no tool named {call.name!r}; tools: {listed}"
        )
        return CallGate(GateVerdict.REFUSE, call, result=result)
    errors = validate_arguments(tool.contract.input_schema, dict(call.arguments))
    if errors:
        result = ToolResult.failure(ErrorCode.EINVAL, "; ".join(errors))
        return CallGate(GateVerdict.REFUSE, call, tool=tool, result=result)
    decision = decide_policy(policy, tool.contract, call.arguments, context)
    if decision.action is PolicyAction.ALLOW:
        return CallGate(GateVerdict.EXECUTE, call, tool=tool, decision=decision)
    if decision.action is PolicyAction.REQUIRE_APPROVAL:
        return CallGate(GateVerdict.NEEDS_APPROVAL, call, tool=tool, decision=decision)
    result = ToolResult.failure(
        ErrorCode.EPERM, f"{call.name} was blocked by policy: {decision.reason}"
    )
    return CallGate(GateVerdict.DENY, call, tool=tool, result=result, decision=decision)


def approval_denied_result(tool_name: str, reason: str) -> ToolResult:
    """What the model sees when a reviewer denies a call (the run goes on)."""
    return ToolResult.failure(
        ErrorCode.EPERM,
        f"{tool_name} was denied by a reviewer: {reason}",
        suggested_action="do_not_retry_follow_the_reason",
    )


def approval_expired_result(tool_name: str) -> ToolResult:
    return approval_denied_result(tool_name, "expired: nobody decided in time")


def cancelled_result(tool_name: str, reason: str) -> ToolResult:
    """The explicit refusal for a call left unexecuted because the run stopped."""
    return ToolResult.failure(
        ErrorCode.ECANCELED, f"{tool_name} was not executed: {reason}"
    )


@dataclass(frozen=True)
class ExecutionOutcome:
    result: ToolResult
    usage: BudgetVector
    executed: bool
    stop_reason: StopReason | None = None  # a budget cap refused the call
    attempts: int = 0  # how many times the handler ran (retries included)


def execute_call(
    tool: Tool,
    call: ToolCall,
    usage: BudgetVector,
    limits: BudgetLimits,
    *,
    run_id: str,
    tenant_id: str = "",
    world_id: str = "",
    end_user: str = "",
    sandbox: Callable[..., Any] | None = None,
    timeout_seconds: float | None = None,
    ledger: ContractLedger | None = None,
    retry: RetryPolicy = NO_RETRIES,
    secret_reader: SecretReader | None = None,
    sleep: Callable[[float], None] = time.sleep,
    continuation: bool = False,
) -> ExecutionOutcome:
    """Check the tool budget and the run's quota, then execute (retrying a
    transient error as `retry` allows); the usage returned includes the call.

    A budget cap's refusal carries its `stop_reason`; a quota's has none (the
    model is told, the run goes on). `ledger`: the run's contract counts (quota,
    retries), updated here. `continuation`: the call was executed and counted
    already, and runs again to complete (an MCP server's question answered):
    no cap or quota is checked or charged again.
    """
    ledger = ContractLedger() if ledger is None else ledger
    if not continuation:
        refused = check_before_tool_call(usage, limits, tool_cost=tool.money_cost)
        if refused is not None:
            result = ToolResult.failure(
                ErrorCode.EBUDGET,
                f"{call.name} was not executed: the run's {refused} budget is "
                "exhausted",
            )
            return ExecutionOutcome(result, usage, executed=False, stop_reason=refused)
        over_quota = run_quota_refusal(tool, ledger)
        if over_quota is not None:
            return ExecutionOutcome(over_quota, usage, executed=False)
        charge_run_quota(tool, ledger)
    context = ToolContext.for_call(
        run_id,
        call.call_id,
        tenant_id=tenant_id,
        world_id=world_id,
        end_user=end_user,
        sandbox=sandbox,
        allowed_secrets=tool.contract.scope.secrets,
        secret_reader=secret_reader,
    )
    attempts, started = 1, time.monotonic()
    result = execute_tool(
        tool, call.arguments, context, timeout_seconds=timeout_seconds
    )
    while may_auto_retry(tool.contract, result, ledger, retry):
        delay = retry.delay(ledger.retries.get(tool.name, 0) + 1)
        spent = time.monotonic() - started + delay
        late = check_before_tool_call(
            usage.with_wall_seconds(usage.wall_seconds + spent), limits
        )
        if spent > retry.max_call_seconds or late is not None:
            break  # the run's deadline or the call's own time is up
        ledger.retries[tool.name] = ledger.retries.get(tool.name, 0) + 1
        sleep(delay)
        attempts += 1
        result = execute_tool(
            tool, call.arguments, context, timeout_seconds=timeout_seconds
        )
    if attempts > 1:
        result = result.with_cost(attempts=attempts)
    return ExecutionOutcome(
        result,
        usage if continuation else charge_tool_call(usage, tool.money_cost),
        executed=True,
        attempts=attempts,
    )


def record_result(
    transcript: Transcript,
    call: ToolCall,
    result: ToolResult,
    *,
    observation_chars: int = DEFAULT_OBSERVATION_CHARS,
) -> tuple[Observation, Artifact | None]:
    """Bound the result, append its `tool` message; persist before the next call."""
    observation, artifact = observe(
        call.call_id, call.name, result, limit_chars=observation_chars
    )
    transcript.append_tool_message(observation.to_message())
    return observation, artifact


def close_open_calls(transcript: Transcript, reason: str) -> list[str]:
    """Give every still-open call an ECANCELED result; returns their ids."""
    closed: list[str] = []
    for call in pending_tool_calls(transcript):
        record_result(transcript, call, cancelled_result(call.name, reason))
        closed.append(call.call_id)
    return closed


def result_fingerprint_part(result: ToolResult) -> dict[str, Any]:
    """The parts of a result that say what happened (not when, not how fast)."""
    return {
        "ok": result.ok,
        "data": result.data,
        "error": None
        if result.error is None
        else [str(result.error.code), result.error.message],
    }


def check_progress(
    tracker: ProgressTracker,
    action: Action,
    results: Sequence[ToolResult],
    world_version: Any = None,
) -> StopReason | None:
    """Record this step's fingerprint; `no_progress` when the window repeats."""
    if isinstance(action, FinalAnswer):
        return None
    if isinstance(action, InvalidReply):
        action_part: Any = {"invalid": action.reason}
    else:
        action_part = [[c.name, c.raw_arguments] for c in action.calls]
    observation_part = [result_fingerprint_part(r) for r in results]
    fingerprint = step_fingerprint(action_part, observation_part, world_version)
    return StopReason.NO_PROGRESS if tracker.record(fingerprint) else None
