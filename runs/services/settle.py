"""Settling: when an ended run is completely finished (spec §1.4 `agent_settled`,
scenario 16).

A run's end (`finished_at`) is not the last thing that happens for it: its
`run_finished` hooks run after the end commits, a follow-up message queued
while its last step was ending continues it, and a run whose model call
overflowed the window goes on in a recovery branch. A run is settled once none
of that is left: its hooks ran, no message waits for it, and its recovery branch
(if any) settled. The API and the run page report it "complete" only then.

A run whose ending lost its worker before it settled (hooks not run, the
settle not written) is settled by recovery's sweep (`runs_settle_stranded`),
which runs its hooks then: `run_finished` hooks run at least once.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.utils import timezone

from runs.branch_selectors import run_recovered
from runs.models import Run, SessionBranch
from tracing.services import run_event_append

__all__ = ["run_settle"]


def run_settle(*, run_id: uuid.UUID | str) -> bool:
    """Mark the ended run settled unless its recovery branch still goes on,
    then the run it recovers (which settles with it, in the same transaction:
    no reader sees a recovery complete and the run it recovers still going).
    The caller has run its hooks and continued it for a queued message if it
    could. Returns whether it is settled."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or not run.is_terminal:
            return False
        if run.settled_at is None:
            if _recovery_pending(run):
                return False
            run.settled_at = timezone.now()
            Run.objects.filter(id=run.id).update(settled_at=run.settled_at)
            run_event_append(
                run=run,
                type="run.settled",
                payload={"status": run.status, "stop_reason": run.stop_reason},
            )
        recovered = run_recovered(run_id=run.id)
        if recovered is not None:
            run_settle(run_id=recovered)
    return True


def _recovery_pending(run: Run) -> bool:
    return SessionBranch.objects.filter(
        branch_of=run, kind=SessionBranch.Kind.RECOVERY, run__settled_at__isnull=True
    ).exists()
