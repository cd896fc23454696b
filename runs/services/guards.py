"""A run's guardrails and hooks, as the step meets them (docs/agents.md):

- at the start, before the first model call (`run_preflight`): `run_started`
  hooks, the input guardrails, then `before_agent` hooks (context or refusal);
- on every executed tool's result (`tool_result_hooks_apply`), before the
  model or the database sees it;
- on the final answer (`output_guardrails_check`);
- when the run has ended (`run_finished_hooks`).

Each check is a span (`guardrail <name>` / `hook <name>`: stage or event,
verdict, latency). A guardrail that trips or cannot run flags the run for
review (`RunReview`, listed in the approvals inbox). The step (runs.services.
advance) ends the run with the `GuardStop` these return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from opentelemetry.trace import Status, StatusCode

from budgets.periods import BudgetRefusal
from budgets.services import stop_reason_for
from runs.engine.actions import ToolCall
from runs.engine.adapters import ModelError
from runs.engine.budget import BudgetVector
from runs.engine.envelope import ToolResult
from runs.engine.guardrails import (
    GuardrailOutcome,
    Stage,
    Verdict,
    check_guardrail,
    guardrail_call_tokens,
)
from runs.engine.hooks import (
    HookEvent,
    HookInput,
    HookOutcome,
    HookSpec,
    HookStatus,
    HookType,
    run_hook,
    withheld_result,
)
from runs.engine.stop import StopReason
from runs.engine.transcript import Transcript
from runs.models import Run, RunReview
from runs.runtime import guardrail_model_for
from runs.services.guard_config import guardrails_of, hook_types, hooks_of
from runs.services.reviews import run_review_event
from runs.services.spend import (
    budget_after_guardrail_call,
    budget_before_guardrail_call,
)
from runs.spans import guard_span, under_run_root

__all__ = [
    "GuardStop",
    "output_guardrails_check",
    "run_finished_hooks",
    "run_finished_hooks_of_ended",
    "run_preflight",
    "tool_result_hooks_apply",
]


@dataclass(frozen=True)
class GuardStop:
    """How the run ends: the stop reason, its detail, and the answer it gives
    (a guardrail's refusal), None to keep the answer it has."""

    reason: StopReason
    detail: str
    answer: str | None = None
    # The budget refused a guardrail's model call: the step ends the run as it
    # ends one whose own model call was refused (or asks to extend).
    refusal: BudgetRefusal | None = None


# Adds a guardrail model call's use to the run's counters (the step's state).
Charge = Callable[[BudgetVector], None]


def _hooks(run: Run, event: HookEvent) -> tuple[list[HookSpec], dict[str, HookType]]:
    assert run.agent_version is not None
    hooks = [h for h in hooks_of(run.agent_version) if h.event is event]
    return hooks, (hook_types() if hooks else {})


def _hook(
    run: Run, spec: HookSpec, types: dict[str, HookType], hook_input: HookInput
) -> HookOutcome:
    attributes = {"cp.hook.type": spec.type, "cp.hook.event": str(spec.event)}
    with guard_span(run, name=f"hook {spec.label}", attributes=attributes) as span:
        outcome = run_hook(spec, types, hook_input)
        span.set_attribute("cp.hook.status", str(outcome.status))
        span.set_attribute("cp.hook.latency_ms", round(outcome.latency_ms, 3))
        if outcome.detail:
            span.set_attribute("cp.hook.detail", outcome.detail[:2000])
        if outcome.status is HookStatus.FAILED:
            # As the policy hook's (spec scenario 19): blocked, not allowed.
            span.set_attribute("cp.hook.blocked_by", "hook_error")
            span.set_status(Status(StatusCode.ERROR, "hook_error"))
    return outcome


def _hook_stop(outcome: HookOutcome, *, answer: str | None = None) -> GuardStop:
    spec = outcome.spec
    if outcome.status is HookStatus.FAILED:
        return GuardStop(
            StopReason.HOOK_FAILED,
            f"{spec.event} hook {spec.label!r} failed, so it blocks: {outcome.detail}",
        )
    return GuardStop(
        StopReason.HOOK_BLOCKED,
        f"{spec.event} hook {spec.label!r} ({spec.type}) stopped the run: "
        f"{outcome.detail}",
        answer,
    )


def _guardrails(run: Run, stage: Stage, text: str, charge: Charge) -> GuardStop | None:
    assert run.agent_version is not None
    for spec in guardrails_of(run.agent_version):
        if spec.stage is not stage:
            continue
        model = (
            guardrail_model_for(spec, tenant_id=run.tenant_id)
            if spec.endpoint
            else None
        )
        attributes = {"cp.guardrail.stage": str(stage), "cp.guardrail.kind": spec.kind}
        if spec.endpoint:
            attributes["cp.guardrail.endpoint"] = spec.endpoint
            attributes["gen_ai.request.model"] = spec.model
        with guard_span(
            run, name=f"guardrail {spec.name}", attributes=attributes
        ) as span:
            held = None
            if model is not None and not isinstance(model, ModelError):
                # Reserved before the call like every model call of the run.
                reserved = budget_before_guardrail_call(
                    run=run, model=spec.model, worst=guardrail_call_tokens(spec, text)
                )
                if isinstance(reserved, BudgetRefusal):
                    span.set_status(Status(StatusCode.ERROR, reserved.dimension))
                    return GuardStop(
                        stop_reason_for(reserved), reserved.detail, refusal=reserved
                    )
                held = reserved
            outcome = check_guardrail(spec, text, model)
            if held is not None:
                entry, price = held
                spent = budget_after_guardrail_call(
                    run=run, entry=entry, price=price, usage=outcome.usage
                )
                charge(spent)
                span.set_attribute("gen_ai.usage.input_tokens", spent.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", spent.output_tokens)
            span.set_attribute("cp.guardrail.verdict", str(outcome.verdict))
            span.set_attribute("cp.guardrail.latency_ms", round(outcome.latency_ms, 3))
            span.set_attribute("cp.guardrail.reason", outcome.reason[:2000])
            if outcome.verdict is not Verdict.PASSED:
                span.set_status(
                    Status(StatusCode.ERROR, f"guardrail_{outcome.verdict}")
                )
        if outcome.verdict is Verdict.PASSED:
            continue
        _flag_for_review(run, outcome)
        reason = (
            StopReason.GUARDRAIL_TRIPPED
            if outcome.verdict is Verdict.TRIPPED
            else StopReason.GUARDRAIL_UNAVAILABLE
        )
        detail = f"{stage} guardrail {spec.name!r} {outcome.verdict}: {outcome.reason}"
        return GuardStop(reason, detail, spec.refusal)
    return None


def _flag_for_review(run: Run, outcome: GuardrailOutcome) -> None:
    """The thread goes to the inbox's review list (once, if the step runs again)."""
    with transaction.atomic():
        review, created = RunReview.objects.get_or_create(
            run=run,
            guardrail=outcome.name,
            stage=str(outcome.stage),
            defaults={
                "tenant_id": run.tenant_id,
                "verdict": str(outcome.verdict),
                "reason": outcome.reason,
            },
        )
        if created:  # the inbox's "Flagged for review" shows it live
            run_review_event(review, "run.review_flagged")


def run_preflight(
    *, run: Run, transcript: Transcript, charge: Charge
) -> GuardStop | None:
    """The checks before the first model call; context hooks add to `transcript`;
    a guardrail model's use goes to `charge`."""
    agent = run.agent.slug
    hooks, types = _hooks(run, HookEvent.RUN_STARTED)
    for spec in hooks:
        outcome = _hook(run, spec, types, HookInput(str(run.id), agent, run.input))
        if outcome.stops:
            return _hook_stop(outcome)
    stop = _guardrails(run, Stage.INPUT, run.input, charge)
    if stop is not None:
        return stop
    hooks, types = _hooks(run, HookEvent.BEFORE_AGENT)
    for spec in hooks:
        outcome = _hook(run, spec, types, HookInput(str(run.id), agent, run.input))
        if outcome.stops:
            return _hook_stop(outcome, answer=outcome.effect.block or None)
        if outcome.effect.context:
            transcript.add_context(outcome.effect.context)
    return None


def output_guardrails_check(
    *, run: Run, answer: str, charge: Charge
) -> GuardStop | None:
    return _guardrails(run, Stage.OUTPUT, answer, charge)


def tool_result_hooks_apply(
    *, run: Run, call: ToolCall, result: ToolResult
) -> tuple[ToolResult, GuardStop | None]:
    """The result as the hooks leave it (chained, in order), and the stop one
    asked for. A failed hook withholds the result: the model never sees what a
    redaction that did not run should have hidden."""
    hooks, types = _hooks(run, HookEvent.TOOL_RESULT)
    for spec in hooks:
        hook_input = HookInput(
            str(run.id), run.agent.slug, tool_name=call.name, result=result
        )
        outcome = _hook(run, spec, types, hook_input)
        if outcome.status is HookStatus.FAILED:
            return withheld_result(call.name, outcome.detail), _hook_stop(outcome)
        if outcome.effect.result is not None:
            result = outcome.effect.result
        if outcome.stops:
            return result, _hook_stop(outcome)
    return result, None


def run_finished_hooks(*, run: Run) -> None:
    """Lifecycle hooks of an ended run: too late to block, a failure is only
    recorded on its span."""
    hooks, types = _hooks(run, HookEvent.RUN_FINISHED)
    for spec in hooks:
        hook_input = HookInput(
            str(run.id), run.agent.slug, run.input,
            status=run.status, stop_reason=run.stop_reason,
        )  # fmt: skip
        outcome = _hook(run, spec, types, hook_input)
        if outcome.status is HookStatus.OK and outcome.effect.escalate:
            _escalate(run, spec, outcome.effect.escalate)


def _escalate(run: Run, spec: HookSpec, message: str) -> None:
    """Hand the stopped run to a person: flagged for review in the inbox, and
    the customer told so when the run had no answer (spec §2.1 ch. 2)."""
    with transaction.atomic():
        review, created = RunReview.objects.get_or_create(
            run=run,
            guardrail=spec.label[:64],
            stage="finish",
            defaults={
                "tenant_id": run.tenant_id,
                "verdict": "escalated",
                "reason": f"stopped {run.stop_reason}: {run.stop_detail}"[:2000],
            },
        )
        if created:
            run_review_event(review, "run.review_flagged")
        if not run.final_answer:
            Run.objects.filter(id=run.id, final_answer="").update(final_answer=message)
            run.final_answer = message


def run_finished_hooks_of_ended(*, run_id: str) -> bool:
    """The `run_finished` hooks of a run that ended outside a step, their spans
    under its root; False when the run is gone or has not ended."""
    run = Run.objects.select_related("agent", "agent_version").filter(id=run_id).first()
    if run is None or not run.is_terminal:
        return False
    with under_run_root(run):
        run_finished_hooks(run=run)
    return True
