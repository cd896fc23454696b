"""Runs whose worker vanished get a new step: the periodic safety net under leases."""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.budget_services import budget_release_run, runs_start_queued
from runs.models import Run
from runs.services.lifecycle import step_enqueue
from tracing.spans import spans_abandon_of_dead_workers

logger = logging.getLogger(__name__)


def recover_stalled_runs() -> int:
    """Re-enqueue running runs with an expired lease and queued runs whose task was
    lost; the new step token turns any late original delivery into a no-op."""
    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.RUN_LEASE_SECONDS)
    candidates = Run.objects.filter(
        Q(status=Run.Status.RUNNING, lease_expires_at__lt=now)
        | Q(status=Run.Status.RUNNING, lease_owner="", updated_at__lt=stale)
        # A queued run with no step token waits for a concurrency slot, not a task.
        | Q(status=Run.Status.QUEUED, updated_at__lt=stale, step_token__isnull=False)
    ).values_list("id", "version")
    recovered = 0
    for run_id, version in candidates:
        with transaction.atomic():
            # A lease renewed since it was read is alive: its step still runs.
            won = (
                Run.objects.filter(id=run_id, version=version)
                .filter(
                    Q(lease_owner="")
                    | Q(lease_expires_at__isnull=True)
                    | Q(lease_expires_at__lt=now)
                )
                .update(lease_owner="", lease_expires_at=None, version=version + 1)
            )
            if won:
                run = Run.objects.get(id=run_id)
                spans_abandon_of_dead_workers(run)
                # What the crashed step reserved was never settled: give it back.
                budget_release_run(run_id=run_id)
                step_enqueue(run)
                recovered += 1
                logger.warning("run %s: no live worker; enqueued its next step", run_id)
    # Safety net for a finisher that died before starting the next queued run.
    waiting = Run.objects.filter(
        status=Run.Status.QUEUED, step_token__isnull=True, updated_at__lt=stale
    )
    for tenant_id in waiting.values_list("tenant_id", flat=True).distinct():
        recovered += runs_start_queued(tenant_id=tenant_id)
    return recovered
