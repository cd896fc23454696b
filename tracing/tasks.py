"""Periodic upkeep of spans."""

from __future__ import annotations

from celery import shared_task

from tracing.spans import spans_end_of_finished_runs
from tracing.store import spans_abandon_expired


@shared_task
def abandon_expired_spans_task() -> int:
    """Mark spans of dead workers `abandoned` (their run's recovery takes over),
    and end the root span of runs whose finisher died after the outcome."""
    return spans_abandon_expired() + spans_end_of_finished_runs()
