"""Runs whose step was lost get a new one: the periodic safety net under leases.

A step is held by the message of its token in the broker's queue (a backlog,
however long, is not stalled), then by the worker that took it (the lease). It
is lost when its worker died mid-step: its heartbeat stopped (it died whole;
seen within seconds) or its lease expired; or when its message is gone with no
lease taken: the enqueue failed, Redis lost it, or a worker that died whole held
it (no ack emulation: docs/engine.md), seen RUN_ENQUEUE_GRACE_SECONDS after the
enqueue.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from budgets.ledger import budget_release_for_run
from controlplane.celery import workers_gone
from runs.models import Run, SessionBranch
from runs.services.admission import runs_start_queued
from runs.services.dispatch import ADVANCE_TASK, step_enqueue
from runs.services.guards import run_finished_hooks_of_ended
from runs.services.settle import run_settle
from runs.services.steering import steering_continue_stranded
from runs.spans import spans_abandon_of_dead_workers

logger = logging.getLogger(__name__)


def queued_step_tokens() -> set[str]:
    """The step tokens of the advance messages waiting in the broker's queue.

    Steps are published without a priority: kombu's Redis transport keeps them
    in the list named after the queue. Raises redis.RedisError if unreachable.
    """
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=5)
    try:
        raw_messages = client.lrange(settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1)
    finally:
        client.close()
    tokens = set()
    for raw in raw_messages:
        token = _step_token_of(raw)
        if token:
            tokens.add(token)
    return tokens


def _step_token_of(raw: bytes | str) -> str:
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != ADVANCE_TASK:
            return ""
        body: Any = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        return str(kwargs.get("step_token") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""  # not a message of ours


def recover_stalled_runs() -> int:
    """Re-enqueue the runs whose step was lost (see the module docstring); the
    new step token turns any late original delivery into a no-op."""
    now = timezone.now()
    lease = dt.timedelta(seconds=settings.RUN_LEASE_SECONDS)
    stale = now - lease
    grace = now - dt.timedelta(seconds=settings.RUN_ENQUEUE_GRACE_SECONDS)
    # Its worker died mid-step: the lease ran out.
    candidates = dict(
        Run.objects.filter(
            status=Run.Status.RUNNING, lease_expires_at__lt=now
        ).values_list("id", "version")
    )
    # Leased by a worker whose heartbeat stopped: it died whole mid-step. (A
    # lease renewed less than a grace ago may be a worker starting up.)
    held = (
        Run.objects.filter(
            status=Run.Status.RUNNING,
            lease_expires_at__gte=now,
            lease_expires_at__lt=grace + lease,
        )
        .exclude(lease_worker="")
        .exclude(lease_owner="")
    )
    held_by = list(held.values_list("id", "version", "lease_worker"))
    dead_holders: dict[Any, str] = {}
    if held_by:
        try:
            gone = workers_gone(worker for _, _, worker in held_by)
        except redis.RedisError:
            logger.warning("recovery: the workers' heartbeats are unreadable")
            gone = set()
        for run_id, version, worker in held_by:
            if worker in gone:
                candidates.setdefault(run_id, version)
                dead_holders[run_id] = worker
    # Enqueued a while ago and not leased since: in the queue, or lost. A queued
    # run with no step token waits for a concurrency slot, not a task.
    unleased = Run.objects.filter(
        Q(enqueued_at__lt=grace)
        # Enqueued before the enqueue was recorded.
        | Q(enqueued_at__isnull=True, updated_at__lt=stale),
        status__in=[Run.Status.QUEUED, Run.Status.RUNNING],
        lease_owner="",
        step_token__isnull=False,
    ).values_list("id", "version", "step_token")
    if unleased:
        try:
            # Read after the runs: a message taken meanwhile leaves a lease,
            # whose version change makes the compare-and-set below lose.
            queued = queued_step_tokens()
        except redis.RedisError:
            logger.warning("recovery: the broker's queue is unreadable; next pass")
        else:
            for run_id, version, token in unleased:
                if str(token) not in queued:
                    candidates.setdefault(run_id, version)
    recovered = 0
    for run_id, version in candidates.items():
        with transaction.atomic():
            # A lease renewed since it was read is alive: its step still runs
            # (renewals do not change the version). A live lease is taken only
            # from the worker whose heartbeat stopped: its renewals died with it.
            free = (
                Q(lease_owner="")
                | Q(lease_expires_at__isnull=True)
                | Q(lease_expires_at__lt=now)
            )
            if run_id in dead_holders:
                free |= Q(lease_worker=dead_holders[run_id])
            won = (
                Run.objects.filter(id=run_id, version=version)
                .filter(free)
                .update(lease_owner="", lease_expires_at=None, version=version + 1)
            )
            if won:
                run = Run.objects.get(id=run_id)
                spans_abandon_of_dead_workers(run)
                # What the crashed step reserved was never settled: give it back.
                budget_release_for_run(run_id=run_id)
                step_enqueue(run)
                recovered += 1
                logger.warning("run %s: its step was lost; enqueued it again", run_id)
    # Safety net for a finisher that died before starting the next queued run.
    waiting = Run.objects.filter(
        status=Run.Status.QUEUED, step_token__isnull=True, updated_at__lt=stale
    )
    for tenant_id in waiting.values_list("tenant_id", flat=True).distinct():
        recovered += runs_start_queued(tenant_id=tenant_id)
    return recovered


def runs_settle_stranded(*, now: dt.datetime | None = None) -> int:
    """Settle the ended runs whose worker was lost while ending them: their
    `run_finished` hooks run now (they may not have run), a message queued
    meanwhile continues the run, else it settles. A run whose recovery branch
    goes on settles with that branch, not here. Returns how many settled."""
    # Longer than a step's hooks take (each is bounded by its timeout).
    grace = dt.timedelta(seconds=settings.RUN_SETTLE_GRACE_SECONDS)
    cutoff = (now or timezone.now()) - grace
    recovering = SessionBranch.objects.filter(
        branch_of=OuterRef("pk"),
        kind=SessionBranch.Kind.RECOVERY,
        run__settled_at__isnull=True,
    )
    stranded = (
        Run.objects.filter(
            status__in=Run.TERMINAL, settled_at__isnull=True, finished_at__lt=cutoff
        )
        .filter(~Exists(recovering))
        .order_by("finished_at")[:100]
    )
    settled = 0
    for run in stranded:
        run_finished_hooks_of_ended(run_id=str(run.id))
        if not steering_continue_stranded(run=run):
            settled += run_settle(run_id=run.id)
    return settled
