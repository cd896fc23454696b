"""Steering and follow-up messages (spec §1.3 single writer, scenario 10).

`run_message_send` queues a person's message on a run that is queued, in a
step or waiting (it never starts a second loop), or continues a run that ended
as a new turn of the same session. The run's lease holder takes the queue at
the next turn boundary (`steering_take`, before the step's model call, never
while a tool call of the last turn has no result) and the step's next write
marks the messages delivered in its own transaction (`steering_delivered`), so
a step that crashes and runs again delivers each message exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.failpoints import failpoint
from controlplane.services import audit_record
from runs.branch_selectors import run_recovery
from runs.engine.loop import EngineState
from runs.engine.steering import Steering, deliver_steering, steering_text_problem
from runs.engine.step import pending_tool_calls
from runs.models import Run, RunMessage
from runs.services.admission import run_slot_claim
from runs.services.dispatch import step_enqueue
from runs.services.lifecycle import RunConflict, RunInputError
from runs.services.spend import run_usage_against_caps
from tracing.processor import RUN_ID_KEY, TENANT_ID_KEY
from tracing.services import run_event_append, run_events_append
from tracing.setup import tracer

# Runs that ended and may take a follow-up: it continues them as a new turn.
# `budget_exhausted` (its cap is spent) and `policy_blocked` (the tenant's
# policy ended it) are refused with a 409 saying why; `cancelled` too.
CONTINUABLE = frozenset(
    {Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.UNVERIFIED}
)
# How much of a message its span shows (the message list has it whole).
SPAN_TEXT_CHARS = 2000
# The caps a continuation needs room under (a model call spends these).
_CAPS_A_TURN_NEEDS = ("steps", "input_tokens", "output_tokens", "cost", "wall_seconds")


@dataclass(frozen=True)
class Delivery:
    """A message the step put in its transcript, waiting for the step's write."""

    message_id: Any
    entry_id: str
    step_index: int


def message_event(message: RunMessage) -> dict[str, Any]:
    """A message as the run's event log and the API show it."""
    return {
        "id": str(message.id),
        "text": message.text,
        "author": message.author_name,
        "state": message.state,
        "created_at": message.created_at.isoformat(),
        "delivered_at": (
            message.delivered_at.isoformat() if message.delivered_at else None
        ),
        "delivered_before_step": message.delivered_before_step,
    }


@transaction.atomic
def run_message_send(
    *, run: Run, author: User | None, text: Any, remote_addr: str | None = None
) -> RunMessage:
    """Queue `text` for the run; continue the run if it had ended.

    Refusals write nothing: a text that is blank, not a string or longer than
    the cap is `RunInputError("text")`; a cancelled run, or an ended run that
    cannot continue (budget spent, blocked by policy, calls left without a
    result), is a `RunConflict` naming why."""
    problem = steering_text_problem(text)
    if problem:
        raise RunInputError("text", problem)
    locked = Run.objects.select_for_update().get(id=run.id)
    if locked.status == Run.Status.CANCELLED or locked.cancel_requested:
        raise RunConflict(locked, "the run was cancelled; it takes no more messages")
    continues = locked.is_terminal
    if continues:
        _continuable_or_conflict(locked)
    message = RunMessage.objects.create(
        tenant_id=locked.tenant_id,
        run=locked,
        text=text,
        author=author,
        author_name=author.get_username() if author is not None else "",
    )
    audit_record(
        tenant=locked.tenant,
        actor=author,
        action="run.message",
        object_type="run",
        object_id=str(locked.id),
        before={"status": locked.status},
        after={"message": str(message.id), "chars": len(text)},
        remote_addr=remote_addr,
    )
    run_event_append(run=locked, type="message.queued", payload=message_event(message))
    if continues:
        _continue(locked, message)
    return message


def _continuable_or_conflict(run: Run) -> None:
    if run.status == Run.Status.BUDGET_EXHAUSTED:
        raise RunConflict(
            run,
            f"the run's budget is exhausted ({run.stop_reason}); it cannot "
            "continue: start a new run",
        )
    if run.status not in CONTINUABLE:
        raise RunConflict(
            run, f"the run ended as {run.status}; it cannot continue: start a new run"
        )
    recovery = run_recovery(run_id=run.id)
    if recovery is not None:
        raise RunConflict(
            run,
            f"the run goes on in its recovery run {recovery}: send the message there",
        )
    if run.agent_version_id is None:
        raise RunConflict(run, "the run was sent over OTLP; it is not run here")
    if run.agent.disabled or run.agent.deleted_at is not None:
        raise RunConflict(
            run,
            f"agent {run.agent.slug!r} is disabled or deleted; the run cannot continue",
        )
    usage = run_usage_against_caps(run)
    for name in _CAPS_A_TURN_NEEDS:
        use = usage[name]
        if use["cap"] is not None and float(use["used"]) >= float(use["cap"]):
            raise RunConflict(
                run,
                f"the run's budget is exhausted: {name} {use['used']} of "
                f"{use['cap']}; it cannot continue",
            )
    state = EngineState.from_dict(run.engine_state)
    if pending_tool_calls(state.transcript):
        raise RunConflict(
            run, "the run ended with tool calls that have no result; it cannot continue"
        )


def _continue(run: Run, message: RunMessage) -> None:
    """Reopen the ended run: queued again, its end cleared (the next end writes
    it anew); it takes a concurrency slot or waits for one like a new run."""
    state = EngineState.from_dict(run.engine_state)
    before = {"status": run.status, "stop_reason": run.stop_reason}
    state.stop_reason = None
    state.final_text = None
    Run.objects.filter(id=run.id).update(
        status=Run.Status.QUEUED,
        stop_reason="",
        stop_detail="",
        evaluation=None,
        finished_at=None,
        settled_at=None,
        step_token=None,
        engine_state=state.to_dict(),
        version=F("version") + 1,
    )
    run.refresh_from_db()
    run_event_append(
        run=run,
        type="run.continued",
        payload={**before, "message": str(message.id)},
    )
    if run_slot_claim(run=run):
        step_enqueue(run)
    # Else it waits queued with no step token until a slot frees.


def steering_take(*, run: Run, state: EngineState) -> list[Delivery]:
    """Put the run's queued messages in the transcript, oldest first, as the
    next user turns (call it at a turn boundary: it takes nothing while a call
    of the last turn has no result). The step's next write must record them
    with `steering_delivered`."""
    if pending_tool_calls(state.transcript):
        return []
    queued = RunMessage.objects.filter(run_id=run.id, state=RunMessage.State.QUEUED)
    deliveries: list[Delivery] = []
    for row in queued.order_by("created_at", "id"):
        entry = deliver_steering(
            state.transcript,
            state.session,
            Steering(message_id=str(row.id), author=row.author_name, text=row.text),
        )
        deliveries.append(Delivery(row.id, entry.entry_id, run.steps))
        _steering_span(run, row, entry.entry_id)
    if deliveries:
        failpoint("after_steering_taken")  # in the transcript, not yet written
    return deliveries


def _steering_span(run: Run, row: RunMessage, entry_id: str) -> None:
    """`steering message`: an instant span in the step that delivers it (the
    trace shows each turn's messages where the model first saw them)."""
    if len(run.trace_id) != 32:
        return  # not traced (a run sent over OTLP)
    attributes: dict[str, str | int] = {
        RUN_ID_KEY: str(run.id),
        TENANT_ID_KEY: str(run.tenant_id),
        "cp.message.id": str(row.id),
        "cp.message.author": row.author_name,
        "cp.message.text": row.text[:SPAN_TEXT_CHARS],
        "cp.session.entry_id": entry_id,
        "cp.step.index": run.steps,
    }
    with tracer().start_as_current_span("steering message", attributes=attributes):
        pass


def steering_delivered(*, run: Run, deliveries: Sequence[Delivery]) -> None:
    """Mark the messages delivered: call it in the transaction that stores the
    engine state carrying them (the lease holder's write)."""
    if not deliveries:
        return
    now = timezone.now()
    events: list[tuple[str, dict[str, Any]]] = []
    for delivery in deliveries:
        updated = RunMessage.objects.filter(
            id=delivery.message_id, state=RunMessage.State.QUEUED
        ).update(
            state=RunMessage.State.DELIVERED,
            delivered_at=now,
            delivered_before_step=delivery.step_index,
            entry_id=delivery.entry_id,
        )
        if updated:
            row = RunMessage.objects.get(id=delivery.message_id)
            events.append(("message.delivered", message_event(row)))
    if events:
        run_events_append(run=run, events=events)


def steering_queued(*, run: Run) -> bool:
    """Whether a message waits for the run (a follow-up sent during its step)."""
    return RunMessage.objects.filter(
        run_id=run.id, state=RunMessage.State.QUEUED
    ).exists()


@transaction.atomic
def steering_continue_stranded(*, run: Run) -> bool:
    """A message sent while the run's last step was finishing found it running
    and was queued; the step then ended the run. Continue the run for it (once:
    under the row lock, and only if it ended and can continue). Returns whether
    it did."""
    locked = Run.objects.select_for_update().get(id=run.id)
    if not locked.is_terminal or locked.status not in CONTINUABLE:
        return False
    if locked.cancel_requested:
        return False
    message = (
        RunMessage.objects.filter(run_id=locked.id, state=RunMessage.State.QUEUED)
        .order_by("created_at", "id")
        .first()
    )
    if message is None:
        return False
    try:
        _continuable_or_conflict(locked)
    except RunConflict:
        return False
    _continue(locked, message)
    return True
