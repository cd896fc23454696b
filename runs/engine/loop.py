"""The whole loop in memory: the step phases composed with no persistence.

Used by unit tests and by the benchmark as the in-process baseline. The Django host
composes the same phases from `runs.engine.step`, persisting between them.
"""

from __future__ import annotations

import json
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
from runs.engine.disclosure import (
    Skill,
    remember_loaded,
    system_prompt_with_skills,
)
from runs.engine.enforcement import (
    REPEATED_ERROR_RULE,
    ContractLedger,
    Escalation,
    RetryPolicy,
    note_outcome,
)
from runs.engine.envelope import ToolResult
from runs.engine.evaluator import (
    Evaluation,
    EvaluationSubject,
    Evaluator,
    run_evaluator,
)
from runs.engine.observation import DEFAULT_OBSERVATION_CHARS, Artifact
from runs.engine.policy import (
    PolicyAction,
    PolicyContext,
    PolicyDecision,
    PolicyHook,
    default_policy,
)
from runs.engine.progress import DEFAULT_MAX_RETRIES, ProgressTracker
from runs.engine.session import SessionCursor
from runs.engine.step import (
    GateVerdict,
    ModelCallPlan,
    approval_denied_result,
    billable_usage,
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
from runs.engine.tools import SecretReader, Tool, ToolRegistry
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
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # automatic retries
    # Their index follows the system prompt; the registry holds load_skill.
    skills: tuple[Skill, ...] = ()


@dataclass
class EngineState:
    """Everything the engine needs between steps, as JSON-ready data."""

    transcript: Transcript
    usage: BudgetVector = field(default_factory=BudgetVector)
    progress: ProgressTracker = field(default_factory=ProgressTracker)
    stop_reason: StopReason | None = None
    final_text: str | None = None
    contract: ContractLedger = field(default_factory=ContractLedger)
    # The run's start checks (input guardrails, run_started and before_agent
    # hooks) ran and passed: a step taken again after a crash does not repeat
    # them (a context hook would add its text twice).
    preflight_done: bool = False
    # The deferred tools tool_search found, sent to the model from then on.
    loaded_tools: list[str] = field(default_factory=list)
    # Where the run's session log stands (runs.engine.session): the transcript
    # above is the context the log rebuilds to from `session.leaf`.
    session: SessionCursor = field(default_factory=SessionCursor)
    compactions: int = 0  # of the context so far
    # Model replies used before this run by the runs it branches from (a retry
    # or fork, runs.engine.branching): a scripted model goes on from there.
    replies_before: int = 0
    # A recovery branch (runs.services.settle): its first model call compacts
    # first, as a call that overflowed the window on the run it recovers asks.
    recover_overflow: bool = False

    @classmethod
    def start(cls, config: AgentConfig, user_input: str) -> EngineState:
        return cls(
            transcript=Transcript.start(
                system_prompt_with_skills(config.system_prompt, config.skills),
                user_input,
            ),
            progress=ProgressTracker(window=config.max_retries + 1),
        )

    def to_dict(self, *, copy: bool = True) -> dict[str, Any]:
        """`copy=False` shares the live messages, for a write that serialises
        them at once (a checkpoint)."""
        messages = self.transcript.to_list() if copy else self.transcript.messages
        data: dict[str, Any] = {
            "messages": messages,
            "usage": self.usage.to_dict(),
            "progress": self.progress.to_dict(),
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "final_text": self.final_text,
        }
        if not self.contract.empty:  # most runs count nothing here
            data["contract"] = self.contract.to_dict()
        if self.preflight_done:
            data["preflight_done"] = True
        if self.loaded_tools:
            data["loaded_tools"] = list(self.loaded_tools)
        if self.session.next_seq:
            data["session"] = self.session.to_dict()
        if self.compactions:
            data["compactions"] = self.compactions
        if self.replies_before:
            data["replies_before"] = self.replies_before
        if self.recover_overflow:
            data["recover_overflow"] = True
        return data

    def to_json(self, data: Mapping[str, Any] | None = None) -> str:
        """`to_dict()` encoded, reusing the transcript's encoded messages;
        `data`: this state's `to_dict(copy=False)`, when the caller has it."""
        data = self.to_dict(copy=False) if data is None else data
        rest = {key: value for key, value in data.items() if key != "messages"}
        return (
            '{"messages": '
            + self.transcript.messages_json()
            + ", "
            + json.dumps(rest, ensure_ascii=False)[1:]
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, copy: bool = True) -> EngineState:
        """`copy=False` adopts the messages (see `Transcript.from_list`)."""
        reason = data.get("stop_reason")
        return cls(
            transcript=Transcript.from_list(data.get("messages", []), copy=copy),
            usage=BudgetVector.from_dict(data.get("usage")),
            progress=ProgressTracker.from_dict(data.get("progress")),
            stop_reason=None if reason is None else StopReason(reason),
            final_text=data.get("final_text"),
            contract=ContractLedger.from_dict(data.get("contract")),
            preflight_done=bool(data.get("preflight_done", False)),
            loaded_tools=[str(name) for name in data.get("loaded_tools") or []],
            session=SessionCursor.from_dict(data.get("session")),
            compactions=int(data.get("compactions", 0)),
            replies_before=int(data.get("replies_before", 0)),
            recover_overflow=bool(data.get("recover_overflow", False)),
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
    secrets: SecretReader | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> LoopResult:
    """Run an agent to a stop condition in memory; never raises for run failures.

    `secrets`: the tenant's secrets by name (each tool reads only those its
    auth_scope names); `sleep`: waits between automatic retries."""
    run = _InProcessRun(
        config=config,
        model=model,
        registry=registry,
        user_input=user_input,
        limits=limits or BudgetLimits(),
        policy=policy,
        evaluator=evaluator,
        approver=approver,
        run_id=run_id,
        tenant_id=tenant_id,
        world_version=world_version,
        cancelled=cancelled,
        sandbox=sandbox,
        clock=clock,
        secrets=secrets,
        sleep=sleep,
    )
    return run.run()


@dataclass
class _InProcessRun:
    config: AgentConfig
    model: ModelAdapter
    registry: ToolRegistry
    user_input: str
    limits: BudgetLimits
    policy: PolicyHook
    evaluator: Evaluator | None
    approver: Approver | None
    run_id: str
    tenant_id: str
    world_version: Callable[[], Any] | None
    cancelled: Callable[[], bool] | None
    sandbox: Callable[..., Any] | None
    clock: Callable[[], float]
    secrets: SecretReader | None
    sleep: Callable[[float], None]
    steps: list[StepRecord] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    model_error: ModelError | None = None

    def __post_init__(self) -> None:
        self.state = EngineState.start(self.config, self.user_input)
        self.started = self.clock()
        self.policy_context = PolicyContext(
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            agent_name=self.config.name,
            approver_available=self.approver is not None,
        )

    def run(self) -> LoopResult:
        try:
            reason = self._loop()
        except Exception:  # noqa: BLE001 - a host bug ends the run, not the process
            reason = StopReason.INTERNAL_ERROR
        return self._stop(reason)

    def _tick(self) -> None:
        self.state.usage = self.state.usage.with_wall_seconds(
            self.clock() - self.started
        )

    def _is_cancelled(self) -> bool:
        return self.cancelled is not None and self.cancelled()

    def _loop(self) -> StopReason:
        state = self.state
        while True:
            self._tick()
            if self._is_cancelled():
                return StopReason.CANCELLED
            messages = state.transcript.messages
            # Each turn: the direct tools and those tool_search found so far.
            tools = self.registry.model_tools(state.loaded_tools)
            plan = plan_model_call(
                state.usage,
                self.limits,
                state.transcript,
                tools,
                reserve_output_tokens=self.config.reserve_output_tokens,
                price=self.config.price,
            )
            if not isinstance(plan, ModelCallPlan):
                return plan
            reply = call_model(self.model, messages, tools, plan)
            if isinstance(reply, ModelError):
                self.model_error = reply
                return StopReason.MODEL_ERROR
            billed = billable_usage(reply, plan)
            state.usage = charge_model_call(
                state.usage,
                billed.input_tokens,
                billed.output_tokens,
                self.config.price,
            )
            action = record_reply(state.transcript, reply)
            record = StepRecord(index=len(self.steps), reply=reply)
            self.steps.append(record)
            if isinstance(action, FinalAnswer):
                state.final_text = action.text
                return StopReason.DONE
            if not isinstance(action, InvalidReply):
                record.calls = list(action.calls)
                reason = self._run_calls(record)
                if reason is not None:
                    close_open_calls(state.transcript, f"the run stopped ({reason})")
                    return reason
            world = None if self.world_version is None else self.world_version()
            if check_progress(state.progress, action, record.results, world):
                return StopReason.NO_PROGRESS

    def _run_calls(self, record: StepRecord) -> StopReason | None:
        """Each call in order; returns a stop reason when one ends the run."""
        for call in record.calls:
            if self._is_cancelled():
                return StopReason.CANCELLED
            gate = gate_tool_call(
                call,
                self.registry,
                self.policy,
                self.policy_context,
                loaded=self.state.loaded_tools,
            )
            if gate.verdict is GateVerdict.NEEDS_APPROVAL:
                assert gate.tool is not None and gate.decision is not None
                if self.approver is None:
                    refusal = approval_denied_result(call.name, "nobody can approve it")
                    self._record(record, call, refusal)
                    return StopReason.POLICY_DENIED
                resolution = self.approver(call, gate.tool, gate.decision)
                if not resolution.approved:
                    refusal = approval_denied_result(call.name, resolution.reason)
                    self._record(record, call, refusal)
                    continue
            elif gate.verdict is not GateVerdict.EXECUTE:
                assert gate.result is not None
                self._record(record, call, gate.result)
                if gate.verdict is GateVerdict.DENY:
                    return StopReason.POLICY_DENIED
                continue
            assert gate.tool is not None
            self._tick()
            outcome = execute_call(
                gate.tool,
                call,
                self.state.usage,
                self.limits,
                run_id=self.run_id,
                tenant_id=self.tenant_id,
                sandbox=self.sandbox,
                timeout_seconds=self.config.tool_timeout_seconds,
                ledger=self.state.contract,
                retry=self.config.retry,
                secret_reader=self.secrets,
                sleep=self.sleep,
            )
            self.state.usage = outcome.usage
            if outcome.executed:
                record.executed.append(call.call_id)
                remember_loaded(self.state.loaded_tools, call.name, outcome.result)
            self._record(record, call, outcome.result)
            if outcome.stop_reason is not None:
                return outcome.stop_reason
            escalation = note_outcome(call.name, outcome.result, self.state.contract)
            if escalation is not None and not self._human_lets_go_on(
                call, gate.tool, escalation
            ):
                return StopReason.REPEATED_ERROR
        return None

    def _human_lets_go_on(
        self, call: ToolCall, tool: Tool, escalation: Escalation
    ) -> bool:
        """A repeated error the tool wants a person to see: ask the approver, if
        there is one; otherwise (or when it was not a question for a person) the
        run ends."""
        if not escalation.ask_human or self.approver is None:
            return False
        decision = PolicyDecision(
            PolicyAction.REQUIRE_APPROVAL, REPEATED_ERROR_RULE, escalation.question()
        )
        return self.approver(call, tool, decision).approved

    def _record(self, record: StepRecord, call: ToolCall, result: ToolResult) -> None:
        _, artifact = record_result(
            self.state.transcript,
            call,
            result,
            observation_chars=self.registry.observation_chars_for(
                call.name, self.config.observation_chars
            ),
        )
        record.results.append(result)
        if artifact is not None:
            self.artifacts.append(artifact)

    def _stop(self, reason: StopReason) -> LoopResult:
        state = self.state
        state.stop_reason = reason
        evaluation = None
        if reason is StopReason.DONE and self.evaluator is not None:
            subject = EvaluationSubject(
                self.run_id,
                self.user_input,
                state.final_text or "",
                state.transcript.to_list(),
            )
            evaluation = run_evaluator(self.evaluator, subject)
        return LoopResult(
            status=terminal_status(reason, evaluation),
            stop_reason=reason,
            final_text=state.final_text,
            state=state,
            steps=self.steps,
            artifacts=self.artifacts,
            evaluation=evaluation,
            model_error=self.model_error,
        )
