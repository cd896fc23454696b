"""Give a run its next step: a new step token, and the task once it is committed;
and the lifecycle hooks of a run that ended outside a step."""

from __future__ import annotations

import logging
import uuid

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from controlplane.celery import app as celery_app
from runs.engine.hooks import HookEvent
from runs.models import Run
from runs.services.guard_config import hooks_of
from runs.spans import traceparent_for

logger = logging.getLogger(__name__)

ADVANCE_TASK = "runs.tasks.advance_run_task"
FINISHED_HOOKS_TASK = "runs.tasks.run_finished_hooks_task"


def step_enqueue(run: Run) -> None:
    """Give the run a new step token and enqueue its next step after commit.

    The token makes a stale or duplicate delivery a no-op (it no longer matches).
    """
    token, now = uuid.uuid4(), timezone.now()
    Run.objects.filter(id=run.id).update(
        step_token=token, enqueued_at=now, version=F("version") + 1
    )
    run.step_token, run.enqueued_at = token, now
    run.version += 1
    step_dispatch_on_commit(run)


def step_dispatch_on_commit(run: Run) -> None:
    """Enqueue the task for the run's current step token once the token is committed.

    The task is named, not imported: `runs.tasks` imports the services, and a
    signature still goes through the registered task (eager mode included).
    """
    run_id, token = str(run.id), str(run.step_token)
    traceparent = traceparent_for(run) if run.trace_id else None

    def dispatch() -> None:
        try:
            # Celery's own repr of the arguments (for monitoring) cost about 0.1 ms
            # a step; the run id says what the task is about. (celery-types lacks
            # these documented options.)
            celery_app.signature(ADVANCE_TASK).apply_async(
                kwargs={
                    "run_id": run_id,
                    "step_token": token,
                    "traceparent": traceparent,
                },
                argsrepr="()",
                kwargsrepr=f"{{'run_id': '{run_id}'}}",
            )
        except BrokerUnavailable:
            # What was committed stands (the run, a decision): the caller answers
            # with it. The token is committed with `enqueued_at` and no message;
            # recovery enqueues it (recover_stalled_runs), so raising here would
            # only turn work that was done into an error, and a client's retry
            # into a second run.
            logger.warning(
                "run %s: the broker is unavailable, step not enqueued; "
                "recovery will enqueue it",
                run_id,
                exc_info=True,
            )

    transaction.on_commit(dispatch)


def finished_hooks_on_commit(run: Run) -> bool:
    """A run ended outside a step (cancelled while waiting or queued, or a person
    refused to let it go on): its `run_finished` hooks run in a worker once the
    end is committed, as a step runs them when it ends the run, and it settles
    after them. Timed hooks are no work for the request that ended it. Returns
    whether it has any (if not, the caller settles it)."""
    version = run.agent_version
    if version is None or not any(
        hook.event is HookEvent.RUN_FINISHED for hook in hooks_of(version)
    ):
        return False
    run_id = str(run.id)

    def dispatch() -> None:
        try:
            celery_app.signature(FINISHED_HOOKS_TASK).apply_async(
                kwargs={"run_id": run_id}
            )
        except BrokerUnavailable:
            # Too late to block anything: the run's end stands, unsettled
            # until the sweep runs them (runs.services.settle).
            logger.warning(
                "run %s: the broker is unavailable, its run_finished hooks wait "
                "for the settle sweep",
                run_id,
                exc_info=True,
            )

    transaction.on_commit(dispatch)
    return True
