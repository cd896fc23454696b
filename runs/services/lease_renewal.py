"""The step's lease stays alive while the step runs: a heartbeat per worker process.

Each of a step's writes sets `Run.lease_expires_at`; between them a model call (all
its retries included) or a tool call may outlast the lease, and recovery would then
hand the run to another worker, which asks the model again for the same step (a
double spend). So while a step runs, one daemon thread per process renews its
lease every quarter of `RUN_LEASE_SECONDS`, by compare-and-set on the lease owner
(never on `version`, which the step's own writes compare and set). When the step
ends its lease is dropped from the set; a lease that another worker took, or that
the step released, is no longer found and simply stops being renewed. A step that
never ends is stopped by the Celery hard time limit, whose kill also ends the
renewals, so the lease then expires and recovery takes over.

Registering is a dict insert under a lock: a step shorter than a quarter of the
lease makes no write of its own for this.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections
from django.utils import timezone

from runs.models import Run

logger = logging.getLogger(__name__)


def renewal_interval_seconds() -> float:
    """A quarter of the lease: between two renewals at most 3/8 of it passes
    (the thread looks every eighth), so the lease never runs out in between."""
    return float(settings.RUN_LEASE_SECONDS) / 4


@dataclass
class _Held:
    run_id: Any
    owner: str
    renew_at: float  # time.monotonic()


class LeaseRenewer:
    """The leases of the steps running in this process, and the thread that
    renews them (started with the first step; again in a forked child)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # In a forked child the parent's thread does not exist and its lock may
        # have been held at the fork.
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def kept(self, run: Run) -> Iterator[None]:
        """Renew `run`'s lease (as its current owner) until the block ends."""
        key = next(self._keys)
        held = _Held(
            run.id, run.lease_owner, time.monotonic() + renewal_interval_seconds()
        )
        with self._lock:
            self._held[key] = held
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="run-lease-renewal", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(key, None)

    def _loop(self) -> None:
        while True:
            time.sleep(renewal_interval_seconds() / 2)
            try:
                self.renew_due()
            except Exception:  # noqa: BLE001 - the thread must outlive a bad pass
                logger.exception("lease renewal failed; trying again")

    def renew_due(self) -> int:
        """Renew every lease due now; returns how many were renewed."""
        now = time.monotonic()
        with self._lock:
            due = [(k, held) for k, held in self._held.items() if held.renew_at <= now]
        if not due:
            return 0
        renewed = 0
        try:
            for key, held in due:
                kept = lease_renew(run_id=held.run_id, owner=held.owner)
                with self._lock:
                    if key not in self._held:
                        continue  # the step ended meanwhile
                    if kept:
                        held.renew_at = time.monotonic() + renewal_interval_seconds()
                        renewed += 1
                    else:
                        del self._held[key]
                        logger.info(
                            "run %s: lease no longer held by %s; renewal stops",
                            held.run_id,
                            held.owner,
                        )
        finally:
            # This thread's own connection: idle between renewals, not held open.
            connections.close_all()
        return renewed


def lease_renew(*, run_id: Any, owner: str) -> bool:
    """Extend the lease if `owner` still holds it (compare-and-set on the owner)."""
    if not owner:
        return False
    expires = timezone.now() + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS)
    return bool(
        Run.objects.filter(
            id=run_id, lease_owner=owner, status=Run.Status.RUNNING
        ).update(lease_expires_at=expires)
    )


lease_renewer = LeaseRenewer()
