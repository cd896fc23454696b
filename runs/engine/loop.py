"""The whole loop in memory: the step phases composed with no persistence.

Used by unit tests and by the benchmark as the in-process baseline. The Django host
composes the same phases from `runs.engine.step`, persisting between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runs.engine.actions import FinalAnswer, InvalidReply, ModelReply, ToolCall
from runs.engine.adapters import ModelAdapter, ModelError
from runs.engine.budget import (
    FREE,
    BudgetLimits,
    BudgetVector,
    ModelPrice,
    charge_model_call,
)
from runs.engine.envelope import ToolResult
from runs.engine.evaluator import (
    Evaluation,
    EvaluationSubject,
    Evaluator,
    run_evaluator,
)
from runs.engine.observation import DEFAULT_OBSERVATION_CHARS, Artifact
from runs.engine.policy import PolicyContext, PolicyDecision, PolicyHook, default_policy
from runs.engine.progress import DEFAULT_MAX_RETRIES, ProgressTracker
from runs.engine.step import (
    GateVerdict,
    ModelCallPlan,
    approval_denied_result,
    call_model,
    check_progress,
    close_open_calls,
    execute_call,
    gate_tool_call,
    plan_model_call,
    record_reply,
    record_result,
)
from runs.engine.stop import RunStatus, StopReason, terminal_status
from runs.engine.tools import Tool, ToolRegistry
from runs.engine.transcript import Transcript


@dataclass(frozen=True)
class AgentConfig:
    name: str
    system_prompt: str = ""
    reserve_output_tokens: int = 1024
    price: ModelPrice = FREE
    observation_chars: int = DEFAULT_OBSERVATION_CHARS
    max_retries: int = DEFAULT_MAX_RETRIES  # the no-progress window is this + 1
    tool_timeout_seconds: float | None = None  # None: each tool's own timeout


@dataclass
class EngineState:
    """Everything the engine needs between steps, as JSON-ready data."""

    transcript: Transcript
    usage: BudgetVector = field(default_factory=BudgetVector)
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    stop_reason: StopReason | None = None
    final_text: str | None = None

    @classmethod
    def start(cls, config: AgentConfig, user_input: str) -> EngineState:
        return cls(
            transcript=Transcript.start(config.system_prompt, user_input),
            progress=ProgressTracker(window=config.max_retries + 1),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": self.transcript.to_list(),
            "usage": self.usage.to_dict(),
            "progress": self.progress.to_dict(),
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "final_text": self.final_text,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineState:
        reason = data.get("stop_reason")
        return cls(
            transcript=Transcript.from_list(data.get("messages", [])),
            usage=BudgetVector.from_dict(data.get("usage")),
            progress=ProgressTracker.from_dict(data.get("progress")),
            stop_reason=None if reason is None else StopReason(reason),
            final_text=data.get("final_text"),
        )


@dataclass(frozen=True)
class ApprovalResolution:
    approved: bool
    reason: str = ""


# Decides a call that needs approval, in process (a test or a console operator).
Approver = Callable[[ToolCall, Tool, PolicyDecision], ApprovalResolution]


@dataclass
class StepRecord:
    index: int
    reply: ModelReply
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    executed: list[str] = field(default_factory=list)  # call ids whose handler ran


@dataclass
class LoopResult:
    status: RunStatus
    stop_reason: StopReason
    final_text: str | None
    state: EngineState
    steps: list[StepRecord]
    artifacts: list[Artifact]
    evaluation: Evaluation | None = None
    model_error: ModelError | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.state.transcript.messages


def run_in_process(
    config: AgentConfig,
    model: ModelAdapter,
    registry: ToolRegistry,
    *,
    user_input: str,
    limits: BudgetLimits | None = None,
    policy: PolicyHook = default_policy,
    evaluator: Evaluator | None = None,
    approver: Approver | None = None,
    run_id: str = "run-in-process",
    tenant_id: str = "",
    world_version: Callable[[], Any] | None = None,
    cancelled: Callable[[], bool] | None = None,
    sandbox: Callable[..., Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LoopResult:
    """Run an agent to a stop condition in memory; never raises for run failures."""
    limits = limits or BudgetLimits()
    state = EngineState.start(config, user_input)
    steps: list[StepRecord] = []
    artifacts: list[Artifact] = []
    started = clock()
    tools = registry.model_tools()
    policy_context = PolicyContext(
        run_id=run_id,
        tenant_id=tenant_id,
        agent_name=config.name,
        approver_available=approver is not None,
    )
    model_error: ModelError | None = None

    def stop(reason: StopReason) -> LoopResult:
        state.stop_reason = reason
        evaluation = None
        if reason is StopReason.DONE and evaluator is not None:
            subject = EvaluationSubject(
                run_id, user_input, state.final_text or "", state.transcript.to_list()
            )
            evaluation = run_evaluator(evaluator, subject)
        return LoopResult(
            terminal_status(reason, evaluation),
            reason,
            state.final_text,
            state,
            steps,
            artifacts,
            evaluation,
            model_error,
        )

    try:
        while True:
            state.usage = state.usage.with_wall_seconds(clock() - started)
            if cancelled is not None and cancelled():
                return stop(StopReason.CANCELLED)
            messages = state.transcript.messages
            plan = plan_model_call(
                state.usage,
                limits,
                messages,
                tools,
                reserve_output_tokens=config.reserve_output_tokens,
                price=config.price,
            )
            if not isinstance(plan, ModelCallPlan):
                return stop(plan)
            reply = call_model(model, messages, tools, plan)
            if isinstance(reply, ModelError):
                model_error = reply
                return stop(StopReason.MODEL_ERROR)
            state.usage = charge_model_call(
                state.usage,
                reply.usage.input_tokens,
                reply.usage.output_tokens,
                config.price,
            )
            action = record_reply(state.transcript, reply)
            record = StepRecord(index=len(steps), reply=reply)
            steps.append(record)
            if isinstance(action, FinalAnswer):
                state.final_text = action.text
                return stop(StopReason.DONE)
            if not isinstance(action, InvalidReply):
                record.calls = list(action.calls)
                reason = _run_calls(
                    state,
                    record,
                    artifacts,
                    config,
                    registry,
                    limits,
                    policy,
                    policy_context,
                    approver,
                    run_id,
                    tenant_id,
                    sandbox,
                    lambda: clock() - started,
                )
                if reason is not None:
                    close_open_calls(state.transcript, f"the run stopped ({reason})")
                    return stop(reason)
            world = None if world_version is None else world_version()
            if check_progress(state.progress, action, record.results, world):
                return stop(StopReason.NO_PROGRESS)
    except Exception:  # noqa: BLE001 - a host bug ends the run, never the process
        return stop(StopReason.INTERNAL_ERROR)


def _run_calls(
    state: EngineState,
    record: StepRecord,
    artifacts: list[Artifact],
    config: AgentConfig,
    registry: ToolRegistry,
    limits: BudgetLimits,
    policy: PolicyHook,
    policy_context: PolicyContext,
    approver: Approver | None,
    run_id: str,
    tenant_id: str,
    sandbox: Callable[..., Any] | None,
    elapsed: Callable[[], float],
) -> StopReason | None:
    """Each call in order; returns a stop reason when one ends the run."""
    for call in record.calls:
        gate = gate_tool_call(call, registry, policy, policy_context)
        result: ToolResult
        stop_reason: StopReason | None = None
        if gate.verdict is GateVerdict.NEEDS_APPROVAL:
            assert gate.tool is not None and gate.decision is not None
            if approver is None:
                gate_result = approval_denied_result(call.name, "nobody can approve it")
                _record(state, record, artifacts, config, call, gate_result)
                return StopReason.POLICY_DENIED
            resolution = approver(call, gate.tool, gate.decision)
            if not resolution.approved:
                result = approval_denied_result(call.name, resolution.reason)
                _record(state, record, artifacts, config, call, result)
                continue
        elif gate.verdict is not GateVerdict.EXECUTE:
            assert gate.result is not None
            _record(state, record, artifacts, config, call, gate.result)
            if gate.verdict is GateVerdict.DENY:
                return StopReason.POLICY_DENIED
            continue
        assert gate.tool is not None
        state.usage = state.usage.with_wall_seconds(elapsed())
        outcome = execute_call(
            gate.tool,
            call,
            state.usage,
            limits,
            run_id=run_id,
            tenant_id=tenant_id,
            sandbox=sandbox,
            timeout_seconds=config.tool_timeout_seconds,
        )
        state.usage = outcome.usage
        if outcome.executed:
            record.executed.append(call.call_id)
        result = outcome.result
        stop_reason = outcome.stop_reason
        _record(state, record, artifacts, config, call, result)
        if stop_reason is not None:
            return stop_reason
    return None


def _record(
    state: EngineState,
    record: StepRecord,
    artifacts: list[Artifact],
    config: AgentConfig,
    call: ToolCall,
    result: ToolResult,
) -> None:
    _, artifact = record_result(
        state.transcript, call, result, observation_chars=config.observation_chars
    )
    record.results.append(result)
    if artifact is not None:
        artifacts.append(artifact)
