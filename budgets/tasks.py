"""Celery tasks of the budgets app (run by beat)."""

from __future__ import annotations

from celery import shared_task

from budgets.expiry import budget_reservations_expire


@shared_task
def expire_budget_reservations_task() -> int:
    """Release external reservations past `expires_at`; run by beat (no ETA)."""
    return budget_reservations_expire()
