"""Celery tasks of the ground floor: thin, ids in."""

from __future__ import annotations

from celery import shared_task

from controlplane.idempotency import idempotency_keys_purge


@shared_task
def idempotency_keys_purge_task() -> int:
    """Delete Idempotency-Keys past their time-to-live."""
    return idempotency_keys_purge()
