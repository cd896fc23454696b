"""One step of a run, as the lease holder (DESIGN.md §4).

A task either resolves the open tool calls of the last assistant turn (after an
approval or a crash) or asks the model for the next action, persists it, then runs
its calls in order. Every result is on its call's row and in the transcript by the
step's next write (before the next call runs or the step ends); a call is marked
`executing` (committed) before its handler runs, so after a crash the host knows
which calls may have taken effect.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn

from django.db import Error as DatabaseError
from django.db import transaction
from django.utils import timezone

from approvals.checks import (
    approval_covers_problem,
    approval_edit_note,
    approval_outcome_for,
)
from approvals.policy import RULES_READ, policy_rules_for
from approvals.services import approval_request_open, approval_request_open_budget
from budgets.extensions import (
    ExtensionAsk,
    budget_cap_extension_ask,
    budget_period_extension_ask,
)
from budgets.periods import BudgetRefusal
from budgets.services import stop_reason_for
from controlplane import metrics
from controlplane.durability import connection_lost, recoverable_transaction
from controlplane.failpoints import failpoint
from runs.engine.actions import (
    FinalAnswer,
    InvalidReply,
    ModelReply,
    ToolCall,
    ToolCallsAction,
    decode_reply,
)
from runs.engine.adapters import ModelError
from runs.engine.budget import (
    BudgetVector,
    charge_model_call,
    check_before_tool_call,
    estimate_input_tokens,
)
from runs.engine.disclosure import remember_loaded
from runs.engine.enforcement import note_outcome
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.evaluator import EvaluationSubject, run_evaluator
from runs.engine.loop import EngineState
from runs.engine.policy import PolicyContext
from runs.engine.session import MESSAGE
from runs.engine.step import (
    CallGate,
    GateVerdict,
    ModelCallPlan,
    approval_denied_result,
    billable_usage,
    call_model,
    check_progress,
    close_open_calls,
    execute_call,
    gate_tool_call,
    pending_tool_calls,
    plan_model_call,
    record_reply,
    record_result,
)
from runs.engine.stop import StopReason, terminal_status
from runs.engine.tools import (
    ToolContext,
    idempotency_key_for,
    may_rerun_after_crash,
    unknown_outcome_result,
    unmet_precondition,
)
from runs.models import Run, Step
from runs.models import ToolCall as ToolCallRow
from runs.runtime import RunRuntime, runtime_for
from runs.services.admission import budget_run_ended
from runs.services.branches import recovery_allowed, run_recover_overflow
from runs.services.compaction import (
    CompactionFailed,
    CompactionRefused,
    context_compact,
    context_needs_compaction,
)
from runs.services.contract import (
    contract_refusal,
    repeated_error_ask,
    secret_reader_for,
)
from runs.services.dispatch import step_dispatch_on_commit
from runs.services.guards import (
    GuardStop,
    output_guardrails_check,
    run_finished_hooks,
    run_preflight,
    tool_result_hooks_apply,
)
from runs.services.lease_renewal import lease_renewer
from runs.services.lifecycle import (
    LeaseLost,
    counters_from_state,
    lease_acquire,
    lease_release,
    run_finish_fields,
    run_save,
)
from runs.services.policy import tenant_policy
from runs.services.questions import (
    is_question_call,
    question_ask,
    question_outcome_for,
)
from runs.services.session import (
    SessionWriterConflict,
    engine_state_stored,
    session_entries_append,
)
from runs.services.settle import run_settle
from runs.services.spend import (
    budget_after_model_call,
    budget_after_tool_call,
    budget_before_model_call,
    budget_before_tool_call,
    budget_run_cap_refused_event,
)
from runs.services.steering import (
    Delivery,
    steering_continue_stranded,
    steering_delivered,
    steering_queued,
    steering_take,
)
from runs.services.subagents import (
    is_subagent_call,
    subagent_call_started,
    subagent_call_step,
    subagent_run_ended,
    subagents_running,
    subagents_wait_check,
)
from runs.spans import (
    approval_span_open,
    approval_span_settle,
    chat_span,
    step_span,
    tool_span,
)
from runs.tools.elicitation import input_required_of
from tracing.processor import SpanBatch, span_batch

logger = logging.getLogger(__name__)

UNFINISHED_CALL_STATUSES = [
    ToolCallRow.Status.PENDING,
    ToolCallRow.Status.WAITING_APPROVAL,
    ToolCallRow.Status.WAITING_INPUT,
    ToolCallRow.Status.APPROVED,
]
FINAL_CALL_STATUSES = {
    ToolCallRow.Status.SUCCEEDED,
    ToolCallRow.Status.FAILED,
    ToolCallRow.Status.REFUSED,
    ToolCallRow.Status.DENIED,
    ToolCallRow.Status.UNKNOWN,
    ToolCallRow.Status.CANCELLED,
}


class DatabaseLost(Exception):
    """The step lost its database connection (PostgreSQL restarted, the network
    dropped): it wrote nothing more, and its lease stays with this delivery,
    whose retry (same task id, so the same lease owner) takes it back at once."""


class StepEnded(Exception):
    """The run stopped (finished or is waiting) inside the step."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass(frozen=True)
class ResultWrite:
    """A call's result as recorded in the transcript, for its row."""

    row_id: Any
    fields: dict[str, Any]

    def save(self) -> None:
        # A final row keeps its result: a replay writes the same, and a worker
        # that lost the lease meanwhile must not overwrite what the new holder
        # decided.
        ToolCallRow.objects.filter(id=self.row_id).exclude(
            status__in=FINAL_CALL_STATUSES
        ).update(**self.fields)


@dataclass
class StepContext:
    run: Run
    state: EngineState
    # Builds the run's model client, tools and evaluator: only once the step
    # knows it goes on (a cancelled run is ended without them, so a client that
    # cannot be built never keeps a cancel from taking effect).
    build_runtime: Callable[[], RunRuntime]
    started: float
    base_wall_seconds: float
    # Results recorded in the transcript, to be stored on their rows by the
    # step's next write (see `_record`).
    unsaved_results: list[ResultWrite] = field(default_factory=list)
    # The last write proved no cancel was requested, and nothing ran since: the
    # next call needs no read of the flag (see `_read_before_call`).
    not_cancelled: bool = False
    # Steering messages put in the transcript, marked delivered by the next
    # write (runs.services.steering): with it, or not at all.
    steering: list[Delivery] = field(default_factory=list)

    @cached_property
    def runtime(self) -> RunRuntime:
        return self.build_runtime()

    def elapsed(self) -> float:
        return self.base_wall_seconds + time.monotonic() - self.started

    def save_results(self) -> None:
        writes, self.unsaved_results = self.unsaved_results, []
        for write in writes:
            write.save()

    def charge(self, spent: BudgetVector) -> None:
        """Count a guardrail model call's use in the run's counters."""
        self.state.usage = self.state.usage + spent

    def checkpoint(self, *, heed_cancel: bool = False, **changes: Any) -> None:
        """Persist the results, engine state and counters (CAS as the lease holder).
        `heed_cancel`: see `run_save`; it sets `not_cancelled`."""
        self.state.usage = self.state.usage.with_wall_seconds(self.elapsed())
        self.save_results()
        # The transcript's new messages (and edits) become log entries, stored
        # after the CAS proved the lease: only the lease holder appends.
        session = self.state.session
        session.log_transcript(self.state.transcript)
        entries = session.take_unwritten()
        self.not_cancelled = run_save(
            self.run,
            heed_cancel=heed_cancel,
            engine_state=self.state.to_dict(copy=False),
            **counters_from_state(self.state),
            **changes,
        )
        try:
            session_entries_append(run_id=self.run.id, entries=entries)
        except SessionWriterConflict as exc:
            raise LeaseLost(str(self.run.id)) from exc
        deliveries, self.steering = self.steering, []
        steering_delivered(run=self.run, deliveries=deliveries)


def run_advance(
    *,
    run_id: str,
    step_token: str,
    owner: str,
    traceparent: str | None = None,
    worker: str = "",
) -> str:
    """Advance the run by one step; a stale or duplicate delivery is a no-op.

    Returns what happened: skipped, continued, waiting, finished or lease_lost.
    `traceparent` names the run's root span (the trace crosses into the task);
    `worker` is the Celery worker's node name, recorded with the lease.
    """
    lease = lease_acquire(
        run_id=run_id, step_token=step_token, owner=owner, worker=worker
    )
    if lease is None:
        return "skipped"
    run = lease.run
    # Decoded for this step alone: the state adopts it rather than copy it.
    state = EngineState.from_dict(run.engine_state, copy=False)
    ctx = StepContext(
        run=run,
        state=state,
        build_runtime=lambda: runtime_for(
            run,
            replies_consumed=run.steps + state.replies_before,
            budget=lease.budget,
            price=lease.price,
        ),
        started=time.monotonic(),
        base_wall_seconds=state.usage.wall_seconds,
    )
    # The lease is renewed while the step runs: a model or tool call may outlast
    # it, and recovery must not start the same step elsewhere meanwhile.
    records = ExitStack()
    records.enter_context(lease_renewer.kept(run))
    # The step span (it ends the run's root span when the run is over), its
    # children's records batched into a few commits.
    batch = records.enter_context(span_batch())
    spans = ExitStack()
    # Open calls of the last assistant turn: this task finishes that step.
    open_calls = pending_tool_calls(state.transcript)
    spans.enter_context(
        step_span(
            run,
            traceparent=traceparent,
            taken_over=lease.taken_over,
            resumes_step=run.steps - 1 if open_calls and run.steps else None,
        )
    )
    lost = False
    outcome = "continued"
    try:
        _step(ctx, open_calls)
        _continue(ctx, spans, batch)
        return outcome
    except StepEnded as ended:
        outcome = ended.outcome
        return outcome
    except LeaseLost:
        logger.warning("run %s: lease lost; this step stops here", run_id)
        return "lease_lost"
    except Exception as exc:
        if connection_lost(exc):
            # Not the step's fault, and nothing can be written now: ending the
            # run internal_error would fail too, and a lease left to expire
            # froze the run for RUN_LEASE_SECONDS while its worker's heartbeat
            # said it was alive. The task delivers the step again (runs.tasks).
            lost = True
            logger.warning(
                "run %s: the database connection was lost mid-step (%s); "
                "the step will be delivered again",
                run_id,
                exc,
            )
            raise DatabaseLost(run_id) from exc
        logger.exception("run %s: internal error in a step", run_id)
        # A write that rolled back took its log entries with it: the end is
        # written over the state (and log) as last committed, with the usage
        # spent since (the ledger has it).
        stored = engine_state_stored(run_id=run.id)
        stored.usage = ctx.state.usage
        ctx.state = stored
        ctx.steering = []  # not in the stored transcript: they stay queued
        with suppress(StepEnded, LeaseLost):
            _finish(ctx, StopReason.INTERNAL_ERROR, detail="internal error")
        outcome = "finished"
        return outcome
    finally:
        if lost:
            # The spans' last writes are lost with the connection (the retry's
            # step span takes over); the renewals stop; the lease is kept.
            with suppress(DatabaseError):
                spans.close()
            with suppress(DatabaseError):
                records.close()
        else:
            spans.close()
            records.close()
            lease_release(run)
            if outcome == "finished":
                # Once the step's spans are stored: a settled run's trace is whole.
                run_settle(run_id=run.id)


def _step(ctx: StepContext, open_calls: list[ToolCall]) -> None:
    if ctx.run.cancel_requested:  # read with the lease just now
        _finish(ctx, StopReason.CANCELLED, detail="cancelled by an operator")
    if open_calls:
        step = ctx.run.step_rows.order_by("-index").first()
        assert step is not None, "open calls without a recorded step"
        _after_calls(ctx, step, _run_calls(ctx, step, open_calls))
        return
    if ctx.run.steps == 0 and not ctx.state.preflight_done:
        _guard(
            ctx,
            run_preflight(
                run=ctx.run, transcript=ctx.state.transcript, charge=ctx.charge
            ),
        )
        ctx.state.preflight_done = True  # saved with the step's next write
    # A turn boundary: queued steering messages become the next user turns.
    ctx.steering += steering_take(run=ctx.run, state=ctx.state)
    last = ctx.state.transcript.messages[-1]
    if last["role"] == "assistant" and not last.get("tool_calls"):
        # A final answer on record: its worker died before the run's end was
        # committed. Asking the model again would answer (and bill) twice.
        answer = ctx.state.final_text = last.get("content") or ""
        _guard(
            ctx, output_guardrails_check(run=ctx.run, answer=answer, charge=ctx.charge)
        )
        _finish(ctx, StopReason.DONE)
    step, action, rows = _ask_model(ctx)
    if isinstance(action, FinalAnswer):
        ctx.state.final_text = action.text
        _guard(
            ctx,
            output_guardrails_check(run=ctx.run, answer=action.text, charge=ctx.charge),
        )
        if steering_queued(run=ctx.run):
            return  # a follow-up came during the step: the next step answers it
        _finish(ctx, StopReason.DONE)
    if isinstance(action, ToolCallsAction):
        rows = _run_calls(ctx, step, list(action.calls), rows)
    _after_calls(ctx, step, rows)


def _ask_model(ctx: StepContext) -> tuple[Step, Any, list[ToolCallRow]]:
    state, runtime = ctx.state, ctx.runtime
    state.usage = state.usage.with_wall_seconds(ctx.elapsed())
    tools = runtime.registry.model_tools(state.loaded_tools)
    recovering = state.recover_overflow
    if recovering:
        # The run this branch recovers overflowed the window here: compact
        # first (saved with the compaction's commit: a resume does not redo it).
        state.recover_overflow = False
        _compact(ctx, tools, overflowed=True)
    elif context_needs_compaction(state, runtime, tools):
        _compact(ctx, tools, overflowed=False)
    messages = state.transcript.messages
    plan = plan_model_call(
        state.usage,
        runtime.limits,
        state.transcript,
        tools,
        reserve_output_tokens=runtime.config.reserve_output_tokens,
        price=runtime.config.price,
    )
    if not isinstance(plan, ModelCallPlan):
        estimate = estimate_input_tokens(state.transcript.messages_json(), tools)
        reserve = runtime.config.reserve_output_tokens
        ask = budget_cap_extension_ask(
            run=ctx.run, reason=plan, usage=state.usage, limits=runtime.limits,
            reserve_output_tokens=reserve, estimated_input_tokens=estimate,
            call_cost=runtime.config.price.cost(estimate, reserve),
        )  # fmt: skip
        _ask_to_extend(ctx, ask)
        _finish(ctx, plan, detail=f"refused before the model call: {plan}")
    reserved = budget_before_model_call(
        run=ctx.run,
        plan=plan,
        price_known=runtime.price_known,
        step_index=ctx.run.steps,
        budget=runtime.budget,
    )
    if isinstance(reserved, BudgetRefusal):
        _finish_budget_refused(ctx, reserved)
    started_at = timezone.now()
    with chat_span(
        ctx.run, messages_json=state.transcript.messages_json(), tools=tools
    ) as chat:
        called = time.monotonic()
        reply = call_model(runtime.model, messages, tools, plan, on_delta=chat.deltas())
        metrics.model_call_observed(
            ok=isinstance(reply, ModelReply), seconds=time.monotonic() - called
        )
        chat.reply(reply)
    price = runtime.price_of(reply)  # the answering model's (a fallback's)
    budget_after_model_call(
        run=ctx.run,
        entry=reserved,
        reply=reply,
        plan=plan,
        price=price,
        usage=state.usage,
        limits=runtime.limits,
    )
    if isinstance(reply, ModelError):
        # A cancel asked while the call ran (an endless stream lasts until its
        # deadline) is the operator's word on how the run ended; the model's
        # error stays on the chat span.
        asked = Run.objects.filter(id=ctx.run.id, cancel_requested=True).exists()
        if asked:
            _finish(ctx, StopReason.CANCELLED, detail="cancelled by an operator")
        # Once per branch: a recovery branch that overflows again ends with the
        # model's error, as do runs others wait for as they are (docs/engine.md).
        if reply.is_context_overflow and not recovering and recovery_allowed(ctx.run):
            _finish_overflowed(ctx, reply)
        _finish(ctx, StopReason.MODEL_ERROR, detail=str(reply))
    assert isinstance(reply, ModelReply)
    usage = billable_usage(reply, plan)
    state.usage = charge_model_call(
        state.usage, usage.input_tokens, usage.output_tokens, price
    )
    action = record_reply(state.transcript, reply)
    step = Step(
        run=ctx.run,
        index=ctx.run.steps,
        provider=reply.provider,
        provider_request_id=reply.provider_request_id or "",
        model=reply.model,
        finish_reason=reply.finish_reason,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost=price.cost(usage.input_tokens, usage.output_tokens),
        reply=reply.to_dict(),
        action=_action_record(action),
        started_at=started_at,
        finished_at=timezone.now(),
    )
    rows: list[ToolCallRow] = []
    if isinstance(action, ToolCallsAction):
        for position, call in enumerate(action.calls):
            tool = runtime.registry.get(call.name)
            rows.append(
                ToolCallRow(
                    run=ctx.run,
                    step=step,
                    position=position,
                    call_id=call.call_id,
                    tool_name=call.name,
                    args=dict(call.arguments) if call.parse_error is None else {},
                    raw_args=call.raw_arguments,
                    args_sha256=call.arguments_sha256,
                    idempotency_key=idempotency_key_for(str(ctx.run.id), call.call_id),
                    effect=str(tool.contract.effective_effect) if tool else "",
                )
            )
    with recoverable_transaction():  # lost in a database crash: the step re-runs
        step.save(force_insert=True)
        for row in rows:
            row.step = step  # its key is known now
        # The assistant's action is on record before any tool runs; its write
        # also tells whether an operator asked to cancel meanwhile.
        ToolCallRow.objects.bulk_create(rows)
        ctx.checkpoint(heed_cancel=bool(rows))
    failpoint("after_action_persisted")
    return step, action, rows


def _compact(
    ctx: StepContext, tools: list[dict[str, Any]], *, overflowed: bool
) -> None:
    """Compact the context before the model call and commit it (a resume
    starts from the compacted context, and the summary is not paid twice); a
    compaction that fails ends the run `failed`, never to be tried again."""
    try:
        context_compact(
            run=ctx.run,
            state=ctx.state,
            runtime=ctx.runtime,
            tools=tools,
            overflowed=overflowed,
        )
    except CompactionRefused as refused:
        if isinstance(refused.refusal, BudgetRefusal):
            _finish_budget_refused(ctx, refused.refusal)
        _finish(ctx, refused.refusal, detail=f"refused before compaction: {refused}")
    except CompactionFailed as failed:
        _finish(
            ctx, StopReason.COMPACTION_FAILED, detail=f"compaction failed: {failed}"
        )
    with recoverable_transaction():
        ctx.checkpoint()


def _action_record(action: Any) -> dict[str, Any]:
    if isinstance(action, FinalAnswer):
        return {"type": "final_answer", "text": action.text}
    if isinstance(action, InvalidReply):
        return {"type": "invalid", "reason": action.reason}
    return {
        "type": "tool_calls",
        "text": action.text,
        "calls": [call.to_dict() for call in action.calls],
    }


def _run_calls(
    ctx: StepContext,
    step: Step,
    calls: list[ToolCall],
    known: list[ToolCallRow] | None = None,
) -> list[ToolCallRow]:
    """Each open call in order; returns the step's rows, results filled in.
    `known`: the rows just created with the action (else they are read)."""
    rows = {row.call_id: row for row in (known or step.tool_calls.all())}
    for call in calls:
        row = rows[call.call_id]
        # An approved call passes the gate again on resume: it reads the rules too.
        gated = row.status in UNFINISHED_CALL_STATUSES
        rules = _read_before_call(ctx, policy_rules=gated)
        if row.status in FINAL_CALL_STATUSES and row.result is not None:
            # Its result was stored but the transcript was not: replay, never re-run.
            stored = ToolResult.from_dict(row.result)
            remember_loaded(ctx.state.loaded_tools, call.name, stored)
            _record(ctx, row, call, stored, row.status)
            continue
        if subagent_call_started(call.name, row.status):
            _delegate(ctx, row, call)
            continue
        if row.status == ToolCallRow.Status.EXECUTING:
            _recover_interrupted(ctx, row, call)
            continue
        if row.status in (
            ToolCallRow.Status.WAITING_APPROVAL,
            ToolCallRow.Status.APPROVED,
        ):
            approval_span_settle(ctx.run, tool_call=row)
            _resume_after_approval(ctx, row, call, rules)
            continue
        if row.status == ToolCallRow.Status.WAITING_INPUT:
            _resume_after_answer(ctx, row, call)
            continue
        _gate_and_run(ctx, row, call, rules)
    if any(is_subagent_call(call.name) for call in calls):
        _wait_for_subagents(ctx)
    return list(rows.values())


def _delegate(ctx: StepContext, row: ToolCallRow, call: ToolCall) -> None:
    """A sub-agent's call that passed its gate (runs.services.subagents): its
    child starts, or the ended child's outcome (or why none could start) is
    recorded, with a reviewer's edit of the brief noted as for any call."""
    done = subagent_call_step(
        run=ctx.run, row=row, call=call,
        usage=ctx.state.usage.with_wall_seconds(ctx.elapsed()),
        limits=ctx.runtime.limits,
    )  # fmt: skip
    if done is None:  # its child works
        return
    ctx.charge(done.spent)  # the child's spend is its parent's (docs/engine.md)
    _record(ctx, row, call, done.result, done.status)
    note = approval_edit_note(tool_call=row)
    if note is not None:
        _note_on_observation(ctx, row, call, note)


def _wait_for_subagents(ctx: StepContext) -> None:
    """Wait for the step's sub-agent runs, holding no worker; returns when none
    is running (their outcomes are recorded)."""
    if not subagents_running(run=ctx.run):
        return
    with transaction.atomic():
        ctx.checkpoint(
            status=Run.Status.WAITING_SUBAGENTS, step_token=None, lease_owner=""
        )
        subagents_wait_check(run=ctx.run)
    raise StepEnded("waiting")


def _gate_and_run(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, rules: list[Any] | None
) -> None:
    gate = _gate(ctx, call, rules)
    if gate.verdict is GateVerdict.REFUSE:
        assert gate.result is not None
        _record(ctx, row, call, gate.result, ToolCallRow.Status.REFUSED)
        return
    if gate.verdict is GateVerdict.DENY:
        assert gate.result is not None
        _record(ctx, row, call, gate.result, ToolCallRow.Status.DENIED)
        detail = gate.decision.reason if gate.decision else "denied by policy"
        _finish(ctx, StopReason.POLICY_DENIED, detail=detail)
    if gate.verdict is GateVerdict.NEEDS_APPROVAL:
        assert gate.decision is not None
        approval_span_open(ctx.run, tool_call=row, decision=gate.decision.to_dict())
        _wait_for_approval(ctx, row, call, gate.decision.to_dict())
    _execute(ctx, row, call)


def _gate(ctx: StepContext, call: ToolCall, rules: list[Any] | None) -> CallGate:
    """Lookup, validation and the tenant's policy (with `rules` if read already)."""
    runtime = ctx.runtime
    return gate_tool_call(
        call,
        runtime.registry,
        runtime.policy,
        PolicyContext(
            run_id=str(ctx.run.id),
            tenant_id=str(ctx.run.tenant_id),
            agent_name=ctx.run.agent.slug,
            attributes={} if rules is None else {RULES_READ: rules},
        ),
        loaded=ctx.state.loaded_tools,
    )


def _wait_for_approval(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, decision: dict[str, Any]
) -> None:
    with transaction.atomic():
        approval_request_open(
            tenant_id=ctx.run.tenant_id, tool_call=row, decision=decision
        )
        ToolCallRow.objects.filter(id=row.id).update(
            status=ToolCallRow.Status.WAITING_APPROVAL
        )
        # The task ends here: a waiting run holds no worker, process or sandbox.
        ctx.checkpoint(
            status=Run.Status.WAITING_APPROVAL, step_token=None, lease_owner=""
        )
    raise StepEnded("waiting")


def _wait_for_answer(
    ctx: StepContext,
    row: ToolCallRow,
    call: ToolCall,
    elicited: dict[str, Any] | None = None,
) -> NoReturn:
    """Ask a person (runs.services.questions); the run waits holding no worker."""
    with transaction.atomic():
        question_ask(run=ctx.run, row=row, call=call, elicited=elicited)
        ctx.checkpoint(status=Run.Status.WAITING_INPUT, step_token=None, lease_owner="")
    raise StepEnded("waiting")


def _resume_after_answer(ctx: StepContext, row: ToolCallRow, call: ToolCall) -> None:
    outcome = question_outcome_for(run=ctx.run, row=row)
    if outcome.pending:  # still unanswered (a duplicate delivery): wait on
        with transaction.atomic():
            ctx.checkpoint(
                status=Run.Status.WAITING_INPUT, step_token=None, lease_owner=""
            )
        raise StepEnded("waiting")
    if outcome.rerun:  # the MCP server gets its answer from the re-run call
        _execute(ctx, row, call, continuation=True)
        return
    result = outcome.result
    assert result is not None
    status = ToolCallRow.Status.SUCCEEDED if result.ok else ToolCallRow.Status.FAILED
    _record(ctx, row, call, result, status)


def _resume_after_approval(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, rules: list[Any] | None
) -> None:
    outcome = approval_outcome_for(tool_call=row)
    if outcome.pending:
        with transaction.atomic():
            ctx.checkpoint(
                status=Run.Status.WAITING_APPROVAL, step_token=None, lease_owner=""
            )
        raise StepEnded("waiting")
    if not outcome.approved:
        result = approval_denied_result(call.name, outcome.reason)
        _record(ctx, row, call, result, ToolCallRow.Status.DENIED)
        return
    # What runs is what was approved: the row's arguments (a reviewer may have
    # edited them), not the model's proposal in the transcript.
    row.refresh_from_db()
    approved = ToolCall.parse(call.call_id, call.name, json.dumps(row.args))
    why = _approved_call_gate(ctx, row, approved, rules)
    if why is not None:
        result = ToolResult.failure(
            ErrorCode.EPERM,
            f"{call.name} was approved but not executed: on resume {why}",
            suggested_action="check_the_current_state_first",
        )
        _record(ctx, row, call, result, ToolCallRow.Status.DENIED)
        return
    # A sub-agent call's result comes with its child's end: `_delegate` notes
    # an edit then.
    note = None if is_subagent_call(call.name) else approval_edit_note(tool_call=row)
    ToolCallRow.objects.filter(id=row.id).update(status=ToolCallRow.Status.APPROVED)
    _execute(ctx, row, approved)
    if note is not None:
        _note_on_observation(ctx, row, call, note)


def _approved_call_gate(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, rules: list[Any] | None
) -> str | None:
    """The whole gate again, on the tenant's policy and the world as they are now;
    why the approved call may not run, or None. An approval covers what its voters
    were asked, not a rule added or a state changed while the call waited."""
    gate = _gate(ctx, call, rules)
    if gate.verdict in (GateVerdict.REFUSE, GateVerdict.DENY):
        assert gate.result is not None and gate.result.error is not None
        return gate.result.error.message
    if gate.verdict is GateVerdict.NEEDS_APPROVAL:
        assert gate.decision is not None
        problem = approval_covers_problem(
            tool_call=row, decision=gate.decision.to_dict()
        )
        if problem is not None:
            return f"the tenant's policy asks for a new approval: {problem}"
    unmet = _precondition_now(ctx, call)
    if unmet is not None:
        return f"its precondition no longer holds: {unmet}"
    return None


def _world_of(run: Run) -> str:
    """The world the run's tools act in ("" for the tenant's real one)."""
    return "" if run.world_id is None else str(run.world_id)


def _precondition_now(ctx: StepContext, call: ToolCall) -> str | None:
    """The tool's preconditions on the world as it is now (fail-safe)."""
    tool = ctx.runtime.registry.get(call.name)
    if tool is None:
        return f"there is no tool named {call.name!r} any more"
    context = ToolContext.for_call(
        str(ctx.run.id),
        call.call_id,
        tenant_id=str(ctx.run.tenant_id),
        world_id=_world_of(ctx.run),
    )
    return unmet_precondition(tool, call.arguments, context)


def _note_on_observation(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, note: str
) -> None:
    """Tell the model, inside this call's result, that a reviewer changed the args."""
    content = ctx.state.transcript.note_on_result(call.call_id, note)
    if content is None:
        return
    # The call just ran: its result waits for the step's next write (`_record`),
    # so the note goes into the observation that write stores, with no re-read
    # and second update of the row.
    pending = next(w for w in ctx.unsaved_results if w.row_id == row.id)
    pending.fields["observation"] = {
        **pending.fields["observation"],
        "content": content,
    }
    with recoverable_transaction():
        ctx.checkpoint()


def _recover_interrupted(ctx: StepContext, row: ToolCallRow, call: ToolCall) -> None:
    """A call was `executing` when its worker died: re-run only what is safe."""
    tool = ctx.runtime.registry.get(call.name)
    if tool is not None and may_rerun_after_crash(tool.contract):
        logger.info("run %s: re-running %s after a crash", ctx.run.id, call.name)
        _execute(ctx, row, call)
        return
    _record(
        ctx, row, call, unknown_outcome_result(call.name), ToolCallRow.Status.UNKNOWN
    )


def _execute(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, *, continuation: bool = False
) -> None:
    """Run the call under its caps, contract and budget, and record it.
    `continuation`: the call ran and was counted already; it runs again to
    complete (an MCP server's question answered), counted once in all."""
    if is_subagent_call(call.name):  # a child run does the work: nothing executes
        _delegate(ctx, row, call)
        return
    tool = ctx.runtime.registry.get(call.name)
    assert tool is not None
    if is_question_call(tool):  # a person answers it: nothing executes
        _wait_for_answer(ctx, row, call)
    usage = ctx.state.usage.with_wall_seconds(ctx.elapsed())
    capped = None
    if not continuation:
        capped = check_before_tool_call(
            usage, ctx.runtime.limits, tool_cost=tool.money_cost
        )
    if capped is not None:  # a run cap refuses it: ask first if the tenant wants
        ask = budget_cap_extension_ask(
            run=ctx.run, reason=capped, usage=usage, limits=ctx.runtime.limits,
            call_cost=tool.money_cost,
        )  # fmt: skip
        _ask_to_extend(ctx, ask)
    if ctx.unsaved_results:  # an earlier call's result goes first
        with recoverable_transaction():
            ctx.save_results()
    refused = contract_refusal(
        run=ctx.run,
        tool=tool,
        ledger=ctx.state.contract,
        first_attempt=not row.attempts,
        continuation=continuation,
    )
    if refused is not None:  # a permission or quota: not executed, the run goes on
        _record(ctx, row, call, refused, ToolCallRow.Status.REFUSED)
        _escalate_if_repeated(ctx, call.name, refused)
        return
    reserved = None
    if not continuation:  # its declared cost was reserved and settled once
        reserved = budget_before_tool_call(run=ctx.run, tool=tool, call_id=call.call_id)
    if isinstance(reserved, BudgetRefusal):
        _finish_budget_refused(ctx, reserved)
    row.attempts += 1
    row.started_at = timezone.now()
    if not tool.contract.is_read_only:
        # Committed before the handler runs: after a crash this says "may have
        # happened". A read-only call left `pending` simply runs again.
        ToolCallRow.objects.filter(id=row.id).update(
            status=ToolCallRow.Status.EXECUTING,
            started_at=row.started_at,
            attempts=row.attempts,
        )
    failpoint("before_tool_execute")
    ctx.state.usage = ctx.state.usage.with_wall_seconds(ctx.elapsed())
    with tool_span(ctx.run, call=call, effect=row.effect) as span:
        outcome = execute_call(
            tool,
            call,
            ctx.state.usage,
            ctx.runtime.limits,
            run_id=str(ctx.run.id),
            tenant_id=str(ctx.run.tenant_id),
            world_id=_world_of(ctx.run),
            end_user=ctx.run.end_user,
            timeout_seconds=ctx.runtime.config.tool_timeout_seconds,
            ledger=ctx.state.contract,
            retry=ctx.runtime.config.retry,
            secret_reader=secret_reader_for(
                tenant_id=ctx.run.tenant_id, names=tool.contract.scope.secrets
            ),
            continuation=continuation,
        )
        result, stop = outcome.result, None
        if outcome.executed:  # hooks see (and may change) what the tool returned
            result, stop = tool_result_hooks_apply(
                run=ctx.run, call=call, result=result
            )
        span.result(result, executed=outcome.executed)
        # tool_search's finds are sent from the next turn on (checkpointed).
        span.tools_loaded(remember_loaded(ctx.state.loaded_tools, call.name, result))
    failpoint("after_tool_execute")
    ctx.state.usage = outcome.usage
    budget_after_tool_call(
        run=ctx.run,
        entry=reserved,
        tool=tool,
        executed=outcome.executed and not continuation,
        usage=outcome.usage,
        limits=ctx.runtime.limits,
    )
    if not outcome.executed:
        _record(ctx, row, call, outcome.result, ToolCallRow.Status.REFUSED)
        assert outcome.stop_reason is not None
        _finish(ctx, outcome.stop_reason, detail=f"refused before {call.name}")
    row.attempts += outcome.attempts - 1  # automatic retries
    elicited = input_required_of(result)
    if elicited is not None:  # an MCP server asks a person first
        _wait_for_answer(ctx, row, call, elicited)
    status = ToolCallRow.Status.SUCCEEDED if result.ok else ToolCallRow.Status.FAILED
    _record(ctx, row, call, result, status)
    _guard(ctx, stop)
    _escalate_if_repeated(ctx, call.name, result)


def _escalate_if_repeated(ctx: StepContext, tool_name: str, result: ToolResult) -> None:
    """A non-retryable error the second time in a row: as the tool's suggested
    action says, ask a person whether the run may go on (it waits, holding
    nothing), or end the run `repeated_error`. Returns when nothing repeated."""
    escalation = note_outcome(tool_name, result, ctx.state.contract)
    if escalation is None:
        return
    if not escalation.ask_human:
        _finish(ctx, StopReason.REPEATED_ERROR, detail=escalation.detail())
    with transaction.atomic():
        repeated_error_ask(run=ctx.run, escalation=escalation)
        ctx.checkpoint(
            status=Run.Status.WAITING_APPROVAL, step_token=None, lease_owner=""
        )
    raise StepEnded("waiting")


def _record(
    ctx: StepContext, row: ToolCallRow, call: ToolCall, result: ToolResult, status: str
) -> None:
    """Bound the result into the transcript; its row is written with the step's
    next write (the one that ends the step, opens a wait, or precedes the next
    call), together with the transcript. A crash before that loses nothing the
    host relies on: a read-only call runs again, any other becomes `unknown`.
    """
    observation, artifact = record_result(
        ctx.state.transcript,
        call,
        result,
        observation_chars=ctx.runtime.registry.observation_chars_for(
            call.name, ctx.runtime.config.observation_chars
        ),
    )
    sandbox = next(
        (ref["result"] for ref in result.refs if ref.get("kind") == "sandbox_result"),
        None,
    )
    fields = {
        "status": status,
        "result": result.to_dict(),
        "observation": {
            "content": observation.content,
            "truncated": observation.truncated,
            "full_size_bytes": observation.full_size_bytes,
            "sha256": observation.sha256,
            "trust": observation.trust,
        },
        "artifact": None
        if artifact is None
        else {
            "sha256": artifact.sha256,
            "size_bytes": artifact.size_bytes,
            "media_type": artifact.media_type,
            "content": artifact.content.decode("utf-8", "replace"),
        },
        "sandbox_result": sandbox,
        "attempts": row.attempts,
        "started_at": row.started_at,
        "finished_at": timezone.now(),
    }
    ctx.unsaved_results.append(ResultWrite(row.id, fields))
    row.status = status
    row.result = result.to_dict()
    metrics.tool_call_ended(
        tool=call.name,
        status=status,
        code=str(result.error.code) if result.error else None,
    )


def _after_calls(ctx: StepContext, step: Step, rows: list[ToolCallRow]) -> None:
    action = decode_reply(ModelReply.from_dict(step.reply))
    results = [ToolResult.from_dict(row.result) for row in rows if row.result]
    reason = check_progress(ctx.state.progress, action, results)
    if reason is not None:
        _finish(ctx, reason, detail="the same action and observation repeated")


def _read_before_call(ctx: StepContext, *, policy_rules: bool) -> list[Any] | None:
    """Read now, not from the run the step holds: an operator may have asked to
    cancel, or changed the tenant's approval rules. With `policy_rules` (and the
    tenant's policy as the hook) the rules are read here, for the gate. The
    cancel flag is not read again when the write of the action just proved it
    unset (`StepContext.not_cancelled`): a cancel asked since is seen at the next
    boundary, as one asked just after this read would be."""
    not_cancelled, ctx.not_cancelled = ctx.not_cancelled, False  # one call's worth
    if not not_cancelled:
        cancel = Run.objects.filter(id=ctx.run.id).values_list("cancel_requested")
        if cancel.first() == (True,):
            _finish(ctx, StopReason.CANCELLED, detail="cancelled by an operator")
    if policy_rules and ctx.runtime.policy is tenant_policy:
        return policy_rules_for(ctx.run.tenant_id)
    return None


def _finish_overflowed(ctx: StepContext, reply: ModelError) -> NoReturn:
    """The model call was longer than the window (the provider counts better
    than the estimate): this run ends `failed` with the attempt on its log, and
    a recovery branch that hides the attempt (a `context_edit`) compacts and
    asks again (spec scenario 16). The run settles when that branch does."""
    attempt = ctx.state.session.append(
        MESSAGE, {"message": {"role": "assistant", "content": "", "error": str(reply)}}
    )
    _finish(
        ctx,
        StopReason.CONTEXT_OVERFLOW,
        detail=str(reply),
        recover_hiding=attempt.entry_id,
    )


def _finish(
    ctx: StepContext,
    reason: StopReason,
    *,
    detail: str = "",
    dimension: str = "",
    recover_hiding: str | None = None,
) -> NoReturn:
    """End the run with the host's verdict; never returns. `recover_hiding`:
    the entry of a call that overflowed, which a recovery branch started in the
    same commit hides from its context."""
    state = ctx.state
    evaluation = None
    if reason is StopReason.DONE and ctx.runtime.evaluator is not None:
        subject = EvaluationSubject(
            str(ctx.run.id),
            ctx.run.input,
            state.final_text or "",
            state.transcript.to_list(),
        )
        evaluation = run_evaluator(ctx.runtime.evaluator, subject)
    if reason is not StopReason.DONE:
        close_open_calls(state.transcript, f"the run stopped ({reason})")
    status = str(terminal_status(reason, evaluation))
    state.usage = state.usage.with_wall_seconds(ctx.elapsed())
    with transaction.atomic():
        ctx.save_results()  # recorded results are not "unfinished"
        ToolCallRow.objects.filter(
            run=ctx.run, status__in=UNFINISHED_CALL_STATUSES
        ).update(status=ToolCallRow.Status.CANCELLED, finished_at=timezone.now())
        ctx.checkpoint(
            step_token=None,
            lease_owner="",
            **run_finish_fields(
                state,
                reason,
                status,
                detail=detail,
                evaluation=None if evaluation is None else evaluation.to_dict(),
            ),
        )
        if dimension:  # the exact tenant budget dimension, not the engine's nearest
            run_save(ctx.run, stop_reason=dimension)
        # Releases what the run still reserves and frees its concurrency slot,
        # with the outcome: a worker lost after this commit leaks nothing (its
        # root span is ended by tracing's sweep, spans_end_of_finished_runs).
        budget_run_ended(run=ctx.run, reason=reason, dimension=dimension, detail=detail)
        subagent_run_ended(ctx.run)
        if recover_hiding is not None:
            run_recover_overflow(run=ctx.run, hide=recover_hiding)
    failpoint("after_run_finished")
    run_finished_hooks(run=ctx.run)
    # A message queued while this step was ending it continues the run; else
    # it settles once the step's spans are stored (run_advance).
    steering_continue_stranded(run=ctx.run)
    raise StepEnded("finished")


def _guard(ctx: StepContext, stop: GuardStop | None) -> None:
    """End the run as a guardrail or hook said (with its answer); returns when
    nothing stops it."""
    if stop is None:
        return
    if stop.refusal is not None:
        _finish_budget_refused(ctx, stop.refusal)
    if stop.answer is not None:
        ctx.state.final_text = stop.answer
    _finish(ctx, stop.reason, detail=stop.detail)


def _ask_to_extend(ctx: StepContext, ask: ExtensionAsk | None) -> None:
    """The tenant chose to be asked: instead of ending the run, wait for an
    approval "extend <dimension> by X" (holding no worker). Approved, the step
    runs again from the refused reservation; denied, the run ends (approvals).
    Returns only when there is nothing to ask (the run then ends as before)."""
    if ask is None:
        return
    with transaction.atomic():
        if ask.scope == "run_cap":  # the ledger says so for a tenant limit
            budget_run_cap_refused_event(run=ctx.run, ask=ask)
        approval_request_open_budget(
            tenant_id=ctx.run.tenant_id,
            run_id=ctx.run.id,
            extension=ask.to_dict(),
            detail=ask.detail,
        )
        ctx.checkpoint(
            status=Run.Status.WAITING_APPROVAL, step_token=None, lease_owner=""
        )
    raise StepEnded("waiting")


def _finish_budget_refused(ctx: StepContext, refusal: BudgetRefusal) -> NoReturn:
    """A reservation was refused before the call: end as budget_exhausted (or,
    if the tenant chose so, ask to extend the budget)."""
    _ask_to_extend(ctx, budget_period_extension_ask(run=ctx.run, refusal=refusal))
    _finish(
        ctx,
        stop_reason_for(refusal),
        detail=refusal.detail,
        dimension=refusal.dimension,
    )


def _continue(ctx: StepContext, spans: ExitStack, batch: SpanBatch) -> None:
    """Release the lease and enqueue the next step in one commit, which also
    stores the step's last span records (before the next step's can start)."""
    # The step span's end reports the run's counters as the checkpoint writes them.
    for name, value in counters_from_state(ctx.state).items():
        setattr(ctx.run, name, value)
    spans.close()
    # Taken from the batch now, so that a rolled-back commit can store them again.
    prepared = batch.prepare()
    try:
        with recoverable_transaction():  # lost: recovery enqueues the step again
            ctx.checkpoint(
                lease_owner="",
                lease_expires_at=None,
                step_token=uuid.uuid4(),
                enqueued_at=timezone.now(),
            )
            # Its commit hook runs first: the next step is enqueued before the
            # span events are handed to the broadcast thread, which would
            # compete with the enqueue for the interpreter.
            step_dispatch_on_commit(ctx.run)
            batch.store(prepared)
    except BaseException:
        batch.store(prepared)  # the step's spans outlive a lost lease
        raise
