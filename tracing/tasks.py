"""Periodic upkeep of spans."""

from __future__ import annotations

from celery import shared_task

from tracing.store import spans_abandon_expired


@shared_task
def abandon_expired_spans_task() -> int:
    """Mark spans of dead workers `abandoned` (their run's recovery takes over)."""
    return spans_abandon_expired()
