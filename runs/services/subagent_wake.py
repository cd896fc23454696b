"""Wake a parent run whose sub-agent runs have all ended (runs.services.subagents).

Called in the transaction that ends a child (a step's end, a cancel) and in the
one that puts the parent to wait: both lock the parent's row first, so of two
children ending together the second sees the first's end, and a child that
ended before its parent began to wait is seen by the parent."""

from __future__ import annotations

from typing import Any

from django.db.models import F

from runs.models import Run
from runs.services.dispatch import step_enqueue


def subagent_parent_wake(*, parent_id: Any) -> bool:
    """Queue the parent's next step if it waits on children and none is left
    running; True when it was queued."""
    parent = Run.objects.select_for_update().filter(id=parent_id).first()
    if parent is None or parent.status != Run.Status.WAITING_SUBAGENTS:
        return False
    live = Run.objects.filter(parent_run_id=parent_id).exclude(status__in=Run.TERMINAL)
    if live.exists():
        return False
    Run.objects.filter(id=parent_id).update(
        status=Run.Status.QUEUED, version=F("version") + 1
    )
    parent.refresh_from_db()
    step_enqueue(parent)
    return True


def subagent_child_ended(run: Run) -> None:
    """The run ended: if it is a sub-agent run, its parent may go on."""
    if run.parent_run_id is not None:
        subagent_parent_wake(parent_id=run.parent_run_id)
