"""One phase per fault: start runs, inject the fault while they are in flight,
measure recovery, wait for every run to end, then check against the database.
Imported after django.setup() (see soak/__main__.py)."""

from __future__ import annotations

import argparse
import functools
import math
import threading
import time
from collections.abc import Callable

from django.utils import timezone

from soak.checks import (
    PhaseResult,
    advanced_since,
    check_re_enqueues,
    check_runs,
    check_streams,
    check_tally,
    re_enqueues_logged,
    stored_seqs,
    terminal_of,
)
from soak.topology import Topology
from soak.traffic import Driver, Follower, RunRecord, Streams, Tally, db_retry

POLL_SECONDS = 0.5
WS_CATCH_UP_SECONDS = 45.0  # two 20 s heartbeats: the stream fills a lost tail


def injector(topology: Topology, fault: str, outage: float) -> Callable[[], str]:
    """The fault, ready to strike: whatever it aims at (the busiest worker or
    pool child) is chosen now, so that the moment of the fault is the moment
    the returned callable is called."""
    if fault == "worker-kill":
        worker = topology.busiest_worker()
        return lambda: topology.worker_kill(worker)
    if fault == "child-kill":
        worker, pid = topology.busiest_pool_child()
        return lambda: topology.pool_child_kill(worker, pid)
    if fault == "redis-restart":
        return lambda: topology.redis_restart(outage)
    if fault == "postgres-restart":
        return lambda: topology.postgres_restart(outage)
    if fault == "daphne-restart":
        return topology.daphne_restart
    raise ValueError(fault)


class Soak:
    def __init__(
        self,
        topology: Topology,
        args: argparse.Namespace,
        *,
        operator_token: str,
        admin_token: str,
        say: Callable[[str], None],
    ) -> None:
        self.topology = topology
        self.args = args
        self.say = say
        self.driver = Driver(
            base_url=topology.base_url,
            operator_token=operator_token,
            admin_token=admin_token,
            tally=Tally(),
        )
        self.streams = Streams(topology.base_url, admin_token)
        self.every_run: list[str] = []

    def close(self) -> None:
        self.driver.close()
        self.streams.close()

    def run(self, faults: list[str]) -> list[PhaseResult]:
        self.driver.start_deciding()
        return [self.phase(fault) for fault in faults]

    def _tick(self, result: PhaseResult) -> None:
        for restarted in self.topology.supervise():
            result.details.append(f"restarted after an unexpected exit: {restarted}")

    def phase(self, fault: str) -> PhaseResult:
        args = self.args
        result = PhaseResult(fault)
        self.driver.tally = tally = Tally()
        since = timezone.now()
        first = len(self.driver.records)
        followers: list[Follower] = []
        lock = threading.Lock()

        def follow(record: RunRecord) -> None:
            with lock:
                if len(followers) < args.clients:
                    followers.append(self.streams.follow(record.run_id))

        self.driver.on_started = follow
        submitted_before = self.driver.submitted
        began = time.monotonic()
        self.driver.start_runs(
            fault, args.runs_per_fault, rate=args.rate, deny_every=args.deny_every
        )
        records = self.driver.records[first:]

        def submitted() -> int:
            return self.driver.submitted - submitted_before

        # The fault lands once half the runs were asked for.
        while submitted() < max(1, args.runs_per_fault // 2):
            self._tick(result)
            time.sleep(POLL_SECONDS / 5)
        pending: list[str] = []
        fault_at = time.monotonic()
        fault_moment = timezone.now()
        if fault != "none":
            strike = injector(self.topology, fault, args.outage)
            started = [r.run_id for r in records if r.run_id]
            pending = [i for i, ended in terminal_of(started).items() if not ended]
            result.in_flight = len(pending)
            fault_at, fault_moment = time.monotonic(), timezone.now()
            result.fault_note = strike()
            result.recovery = 0.0
            self.say(
                f"  {fault} at +{fault_at - began:.1f} s with {len(pending)} runs "
                f"in flight: {result.fault_note}"
            )
        deadline = fault_at + args.settle_timeout
        next_full_check = 0.0
        while time.monotonic() < deadline:
            self._tick(result)
            now = time.monotonic()
            if pending:
                for run_id, moment in advanced_since(pending, fault_moment).items():
                    pending.remove(run_id)
                    took = (moment - fault_moment).total_seconds()
                    assert result.recovery is not None
                    result.recovery = max(result.recovery, took)
            if now >= next_full_check and submitted() >= args.runs_per_fault:
                next_full_check = now + 2.0
                ids = [r.run_id for r in records if r.run_id]
                if not pending and all(terminal_of(ids).values()):
                    break
            time.sleep(POLL_SECONDS)
        if pending:
            result.recovery = math.inf
            result.details.append(
                f"{len(pending)} of {result.in_flight} in-flight runs never advanced "
                f"within {args.settle_timeout:.0f} s"
            )
        self.say(
            f"  {fault}: runs settled after {time.monotonic() - began:.1f} s; "
            "waiting for the WebSocket clients"
        )
        self._catch_up(followers)
        self.streams.stop(followers)
        records = self.driver.records[first:]
        self.every_run.extend(r.run_id for r in records if r.run_id)
        check_runs(result, records, since=since, every_run=self.every_run)
        check_streams(result, followers)
        check_tally(result, tally)
        ids = [r.run_id for r in records if r.run_id]
        logs = sorted(self.topology.logs.glob("*.log"))
        check_re_enqueues(result, re_enqueues_logged(logs, ids), ids)
        return result

    def _catch_up(self, followers: list[Follower]) -> None:
        """Wait until each client holds as far as the log (heartbeats fill a
        tail the layer lost), at most WS_CATCH_UP_SECONDS."""
        deadline = time.monotonic() + WS_CATCH_UP_SECONDS
        while time.monotonic() < deadline:
            behind = 0
            for follower in followers:
                stored = db_retry(functools.partial(stored_seqs, follower.run_id))
                if (follower.seqs[-1] if follower.seqs else 0) < max(stored, default=0):
                    behind += 1
            if not behind:
                return
            time.sleep(1.0)
