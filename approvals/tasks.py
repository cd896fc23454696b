"""Celery tasks for approvals: thin, idempotent, run by beat (no countdown/ETA)."""

from __future__ import annotations

from celery import shared_task

from approvals.services import approvals_expire


@shared_task
def expire_approvals_task() -> int:
    """Expire pending approvals past their time-to-live (a deny, reason `expired`)."""
    return approvals_expire()
