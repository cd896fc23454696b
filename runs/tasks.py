"""Celery tasks for runs: thin, idempotent, ids in, enqueued on commit."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from celery import shared_task
from celery.signals import worker_process_init
from django.conf import settings
from django.db import InterfaceError, OperationalError

from controlplane import metrics
from controlplane.celery import worker_identity
from controlplane.failpoints import failpoint
from runs.services import DatabaseLost, recover_stalled_runs, run_advance
from runs.services.decide import approvals_expire
from runs.services.demo_scripts import demo_refund_while_waiting
from runs.services.eval_runs import eval_runs_sweep, eval_trial_after_step
from runs.services.gate_webhooks import gate_webhook_deliver, gate_webhooks_due
from runs.services.guards import run_finished_hooks_of_ended
from runs.services.mcp import mcp_stdio_listing_reply
from runs.services.questions import questions_expire
from runs.services.recovery import runs_settle_stranded
from runs.services.retention import retention_sweep
from runs.services.rollups import runs_roll_up_all
from runs.services.settle import run_settle
from runs.spans import spans_end_of_finished_runs
from tracing.ingest import log_messages_expire
from tracing.store import spans_abandon_expired

logger = logging.getLogger(__name__)


@worker_process_init.connect
def _failpoint_at_process_start(**_: object) -> None:
    failpoint("worker_process_init")  # a pool process lost as it starts


# A step that lost the database is delivered again after 1 s, then every 2 s:
# about two minutes in all, after which its lease has run out and recovery's
# pass hands the run on (a longer outage). A retry only tries to connect, and
# a longer back-off left runs waiting past the 20 s target after a restart
# (20.9 s with backing off to 10 s in the 300-run soak).
DATABASE_RETRIES = 60
DATABASE_RETRY_MAX_SECONDS = 2


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True)
def advance_run_task(  # type: ignore[no-untyped-def]
    self, *, run_id: str, step_token: str, traceparent: str | None = None
) -> str:
    """Advance the run by one step; a duplicate or stale delivery is a no-op.

    The delivery's task id is the lease owner, so the redelivery of a task whose
    worker died takes the run over at once instead of waiting out the lease.
    So does a retry (Celery keeps the task id): a step that lost the database,
    or could not reach it to take the lease, is retried until the database
    answers, and resumes from what was committed (a call marked `executing`
    is never run blindly again: docs/engine.md, Recovery).
    `traceparent` carries the run's trace into the task (W3C format).
    """
    started = time.monotonic()
    try:
        outcome = run_advance(
            run_id=run_id,
            step_token=step_token,
            owner=self.request.id or step_token,
            traceparent=traceparent,
            worker=worker_identity(self.request.hostname or ""),
        )
    except (DatabaseLost, OperationalError, InterfaceError) as exc:
        # The broken connection is dropped after the task (task_postrun), so
        # the retry gets a new one from the pool.
        countdown = min(2**self.request.retries, DATABASE_RETRY_MAX_SECONDS)
        raise self.retry(
            exc=exc, countdown=countdown, max_retries=DATABASE_RETRIES
        ) from exc
    metrics.step_observed(outcome=outcome, seconds=time.monotonic() - started)
    if outcome in ("finished", "waiting"):
        # An eval trial's approvals are decided by its case and its end graded
        # now, not at the next sweep. The step is committed: a failure here is
        # logged and left to the sweep, never a retry of the step.
        try:
            eval_trial_after_step(run_id=run_id)
        except Exception:
            logger.exception("run %s: eval trial follow-up failed", run_id)
    return outcome


@shared_task
def eval_runs_sweep_task() -> int:
    """Move on eval trials whose run ended or waits outside a step task."""
    return eval_runs_sweep()


@shared_task(acks_late=False)
def run_finished_hooks_task(*, run_id: str) -> bool:
    """The lifecycle hooks of a run that ended outside a step (they annotate,
    they cannot block); the run settles after them."""
    ran = run_finished_hooks_of_ended(run_id=run_id)
    return run_settle(run_id=run_id) if ran else False


@shared_task
def runs_settle_stranded_task() -> int:
    """Settle the ended runs whose worker was lost while ending them."""
    return runs_settle_stranded()


@shared_task
def recover_stalled_runs_task() -> int:
    """Re-enqueue runs whose worker vanished (lease expired, or enqueue lost)."""
    recovered = recover_stalled_runs()
    metrics.runs_recovered(count=recovered)
    return recovered


@shared_task
def expire_approvals_task() -> int:
    """Expire pending approvals past their time-to-live (a deny, reason `expired`)
    and questions to a person past theirs (the model is told no answer came),
    and end their runs' waits; run by beat (no countdown/ETA)."""
    return approvals_expire() + questions_expire()


@shared_task(acks_late=False)
def gate_webhook_deliver_task(*, gate_id: str) -> str:
    """One delivery attempt of a final gate's webhook; a failed one is retried
    by `gate_webhooks_due_task` at its back-off time (nothing waits here)."""
    return gate_webhook_deliver(gate_id=gate_id)


@shared_task
def gate_webhooks_due_task() -> int:
    """Enqueue the gate webhooks whose retry time came (or whose first enqueue
    was lost); run by beat."""
    due = gate_webhooks_due()
    for gate_id in due:
        gate_webhook_deliver_task.delay(gate_id=gate_id)
    return len(due)


@shared_task
def sandbox_janitor_task() -> int:
    """Kill and remove sandboxes whose owner is gone (e.g. a hard time limit)."""
    from runs.sandbox import sandbox_janitor_sweep
    from runs.tools.run_code import sandbox_settings

    report = sandbox_janitor_sweep(sandbox_settings())
    return len(report.removed_cgroups) + len(report.removed_workspaces)


@shared_task
def retention_sweep_task() -> int:
    """Delete terminal runs past their tenant's retention, in bounded batches."""
    return sum(report.deleted.runs for report in retention_sweep())


@shared_task
def runs_roll_up_task() -> int:
    """Count ended runs into the overview's hourly rollups."""
    return runs_roll_up_all()


@shared_task
def abandon_expired_spans_task() -> int:
    """Mark spans of dead workers `abandoned` (their run's recovery takes over),
    and end the root span of runs whose finisher died after the outcome."""
    return spans_abandon_expired() + spans_end_of_finished_runs()


@shared_task
def expire_pending_log_messages_task() -> int:
    """Drop GenAI messages sent as log records whose trace never arrived."""
    return log_messages_expire(
        older_than=dt.timedelta(hours=settings.OTLP_LOG_PENDING_HOURS)
    )


@shared_task(acks_late=False)
def mcp_stdio_list_task(
    *,
    reply_key: str,
    tenant_id: str,
    slug: str,
    command: list[str],
    network: list[str],
    credentials: dict[str, Any] | None = None,
) -> None:
    """List a stdio MCP server's tools in a worker (the sandbox needs the worker's
    privileges) and leave the answer in the cache for the web request waiting."""
    mcp_stdio_listing_reply(
        reply_key=reply_key,
        tenant_id=tenant_id,
        slug=slug,
        command=command,
        network=network,
        credentials=credentials,
    )


# The late-approval demo asks every half second for two minutes whether its
# run waits on the replacement's approval yet (it does within a step or two).
DEMO_REFUND_RETRIES = 240


@shared_task(bind=True, max_retries=DEMO_REFUND_RETRIES)
def demo_refund_while_waiting_task(self, *, run_id: str) -> str:  # type: ignore[no-untyped-def]
    """The late-approval demo's "meanwhile": refund the order once the run waits."""
    outcome = demo_refund_while_waiting(run_id=run_id)
    if outcome == "waiting":
        raise self.retry(countdown=0.5)
    return outcome
