"""Compaction of a run's context before a model call (spec §1.1, scenario 17).

When the context would pass the agent version's share of the model's window
(`compaction_threshold` of the price table's `context_window_tokens`), or the
provider said it overflowed, the step compacts in two stages: old tool outputs
are dropped from the context (`context_edit`s: the log and the billing keep
them), then, if that is not enough, the agent's model summarises everything
before the last few messages (a `compaction` entry with `firstKeptEntryId` and
`tokensBefore`). A failed compaction raises `CompactionFailed`: the run ends
`failed` and nothing tries it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from budgets.periods import BudgetRefusal
from runs.engine.actions import ModelReply
from runs.engine.adapters import ModelError
from runs.engine.budget import BudgetVector, estimate_input_tokens
from runs.engine.loop import EngineState
from runs.engine.session import (
    apply_compaction,
    drop_old_tool_outputs,
    first_kept_index,
    summary_request,
)
from runs.engine.step import ModelCallPlan, billable_usage, call_model, plan_model_call
from runs.engine.stop import StopReason
from runs.engine.transcript import Transcript
from runs.models import Run
from runs.runtime import RunRuntime
from runs.services.spend import budget_after_model_call, budget_before_model_call
from runs.spans import chat_span, compaction_span

# The output a summary may use (it replaces many thousands of tokens).
SUMMARY_OUTPUT_TOKENS = 2048


class CompactionFailed(Exception):
    """The context could not be compacted; the message says why."""


class CompactionRefused(Exception):
    """The budget refused the summary call (the run ends as for any call)."""

    def __init__(self, refusal: BudgetRefusal | StopReason) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


@dataclass(frozen=True)
class CompactionOutcome:
    tokens_before: int
    tokens_after: int
    dropped_outputs: int
    summarised: bool


def context_limit(runtime: RunRuntime) -> int | None:
    """The input tokens above which the context is compacted (None: unknown)."""
    if not runtime.context_window:
        return None
    return int(runtime.context_window * runtime.compaction_threshold)


def context_needs_compaction(
    state: EngineState, runtime: RunRuntime, tools: list[dict[str, Any]]
) -> bool:
    limit = context_limit(runtime)
    if limit is None:
        return False
    return estimate_input_tokens(state.transcript.messages_json(), tools) > limit


def context_compact(
    *,
    run: Run,
    state: EngineState,
    runtime: RunRuntime,
    tools: list[dict[str, Any]],
    overflowed: bool,
) -> CompactionOutcome:
    """Compact the context in place (transcript and log cursor); `overflowed`:
    the provider refused the last call as too long, so the summary stage runs
    even if the estimate says the context fits."""
    transcript = state.transcript
    limit = context_limit(runtime)
    before = estimate_input_tokens(transcript.messages_json(), tools)
    attributes: dict[str, Any] = {
        "cp.compaction.reason": "overflow" if overflowed else "threshold",
        "cp.compaction.tokens_before": before,
    }
    if limit is not None:
        attributes["cp.compaction.limit_tokens"] = limit
    with compaction_span(run, attributes=attributes) as span:
        dropped = drop_old_tool_outputs(transcript, state.session)
        after = estimate_input_tokens(transcript.messages_json(), tools)
        span.set_attribute("cp.compaction.dropped_outputs", dropped)
        summarised = overflowed or limit is None or after > limit
        if summarised:
            _summarise(run=run, state=state, runtime=runtime, tokens_before=before)
            after = estimate_input_tokens(transcript.messages_json(), tools)
            window = runtime.context_window
            if window is not None and after > window:
                raise CompactionFailed(
                    f"the context is still {after} tokens after compaction, more "
                    f"than the model's window of {window}"
                )
        span.set_attribute("cp.compaction.summarised", summarised)
        span.set_attribute("cp.compaction.tokens_after", after)
        span.set_attribute("cp.session.leaf", state.session.leaf or "")
    return CompactionOutcome(before, after, dropped, summarised)


def _summarise(
    *, run: Run, state: EngineState, runtime: RunRuntime, tokens_before: int
) -> None:
    """The summary stage: the agent's model summarises all but the last few
    messages, which stay verbatim."""
    transcript = state.transcript
    keep_from = first_kept_index(transcript.messages)
    if keep_from is None:
        raise CompactionFailed(
            "nothing is left to summarise: the last messages alone fill the window"
        )
    request = summary_request(transcript.messages, keep_from)
    plan = plan_model_call(
        state.usage,
        runtime.limits,
        Transcript(request),
        [],
        reserve_output_tokens=SUMMARY_OUTPUT_TOKENS,
        price=runtime.config.price,
    )
    if not isinstance(plan, ModelCallPlan):
        raise CompactionRefused(plan)
    reserved = budget_before_model_call(
        run=run,
        plan=plan,
        price_known=runtime.price_known,
        step_index=run.steps,
        budget=runtime.budget,
    )
    if isinstance(reserved, BudgetRefusal):
        raise CompactionRefused(reserved)
    request_json = Transcript(request).messages_json()
    with chat_span(run, messages_json=request_json, tools=[]) as chat:
        reply = call_model(runtime.model, request, [], plan)
        chat.reply(reply)
    price = runtime.price_of(reply)
    budget_after_model_call(
        run=run,
        entry=reserved,
        reply=reply,
        plan=plan,
        price=price,
        usage=state.usage,
        limits=runtime.limits,
    )
    if isinstance(reply, ModelError):
        raise CompactionFailed(f"the summary call failed: {reply}")
    assert isinstance(reply, ModelReply)
    # Billed like any call, but not a step of the run (max_steps counts turns).
    billed = billable_usage(reply, plan)
    state.usage = state.usage + BudgetVector(
        input_tokens=billed.input_tokens,
        output_tokens=billed.output_tokens,
        cost=price.cost(billed.input_tokens, billed.output_tokens),
    )
    summary = (reply.text or "").strip()
    if reply.tool_calls or not summary:
        raise CompactionFailed("the summary call returned no summary text")
    apply_compaction(
        transcript,
        state.session,
        summary=summary,
        keep_from=keep_from,
        tokens_before=tokens_before,
    )
    state.compactions += 1
