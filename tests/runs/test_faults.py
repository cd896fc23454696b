"""Issue 24: Redis lost or restarted, workers and pool processes killed, and a
backlog that is not a fault. Real Redis servers (our own, on free ports, really
stopped), real Celery workers, really killed."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest
from controlplane.celery import app as celery_app
from controlplane.embedded_redis import EmbeddedRedis
from runs.models import Run, ToolCall
from runs.services import recover_stalled_runs, run_advance, run_start
from runs.services.decide import approval_decide
from runs.services.recovery import queued_step_tokens
from runs.spans import root_span_id
from runs.tasks import abandon_expired_spans_task
from tests.conftest import start_worker, wait_for
from tracing.models import RunEvent, Span

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LOOKUP_SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "lookup_order",
                     "arguments": {"order_id": "4821"}}]},
    {"text": "Found it."},
]  # fmt: skip
REPLACE_SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "create_replacement",
                     "arguments": {"order_id": "4821", "reason": "dented spout"}}]},
    {"text": "Replacement on its way."},
]  # fmt: skip


def settled(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.is_terminal else None


def start_runs(tenant: Any, count: int) -> list[Run]:
    return [
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
        for _ in range(count)
    ]


class OwnRedis(EmbeddedRedis):
    """A redis-server of this test alone (stopping it stops no other test), with
    the append-only file compose configures (docker-compose.yml)."""

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--appendonly")
        command[at + 1] = "yes"
        return [*command, "--appendfsync", "everysec"]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis")
    server.start(stdout=subprocess.DEVNULL)
    yield server
    server.stop()


def _switch_broker(url: str) -> None:
    # The producer pool is bound to the broker it first connected to (kombu
    # keeps one per broker: switching back finds the first one again).
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    celery_app.conf.broker_url = url
    django_settings.CELERY_BROKER_URL = url


@contextmanager
def broker_at(url: str) -> Iterator[None]:
    """This process enqueues to (and recovery reads the queue of) `url`."""
    before = celery_app.conf.broker_url
    _switch_broker(url)
    try:
        yield
    finally:
        _switch_broker(before)


def worker_on(tmp_path: Path, url: str, **kwargs: Any) -> Any:
    saved = django_settings.REDIS_URL
    django_settings.REDIS_URL = url  # what start_worker hands the worker
    try:
        return start_worker(tmp_path, **kwargs)
    finally:
        django_settings.REDIS_URL = saved


def test_enqueue_failing_after_the_commit_leaves_the_run_to_recovery(
    shop, scripted_agent, own_redis, tmp_path, settings
):
    """Item 1: the step's checkpoint commits a new step token, then the enqueue
    finds Redis gone. The run is not ended; recovery enqueues the step."""
    settings.RUN_ENQUEUE_GRACE_SECONDS = 0.5
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    with broker_at(own_redis.url):
        (run,) = start_runs(shop, 1)
        own_redis.stop()  # really gone: the next enqueue cannot connect
        outcome = run_advance(
            run_id=str(run.id), step_token=str(run.step_token), owner="test-step"
        )
        assert outcome == "continued"
        run.refresh_from_db()
        assert (run.status, run.stop_reason, run.steps) == ("running", "", 1)
        assert run.lease_owner == "" and run.step_token is not None
        own_redis.start()  # back, with the first step's (stale) message only
        assert str(run.step_token) not in queued_step_tokens()
        worker = worker_on(tmp_path, own_redis.url)
        try:
            time.sleep(0.6)  # the enqueue's grace
            assert recover_stalled_runs() == 1
            run = wait_for(lambda: settled(run))
        finally:
            worker.stop()
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert run.steps == 2
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts) == ("succeeded", 1)


def test_finisher_killed_after_the_outcome_leaves_no_running_root_span(
    shop, scripted_agent, tmp_path, settings
):
    """Item 2: the worker that commits the run's outcome dies before its step
    span ends the root. The sweep ends the root and logs its event."""
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    worker = start_worker(
        tmp_path,
        extra_env={"RUN_FAILPOINTS": "after_run_finished",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        (run,) = start_runs(shop, 1)
        run = wait_for(lambda: settled(run))
        wait_for(lambda: (tmp_path / "failpoint-after_run_finished").exists())
    finally:
        worker.stop()
    root_id = f"{root_span_id(run):016x}"
    root = Span.objects.get(trace_id=run.trace_id, span_id=root_id)
    assert root.status == "running" and root.lease_expires_at is None
    settings.TRACING_SPAN_LEASE_SECONDS = 3600.0
    abandon_expired_spans_task()
    root.refresh_from_db()
    assert root.status == "running"  # a finisher may still be closing it
    settings.TRACING_SPAN_LEASE_SECONDS = 0.0
    abandon_expired_spans_task()
    root.refresh_from_db()
    assert (root.status, root.attributes["cp.run.status"]) == ("unset", "unverified")
    assert not Span.objects.filter(run=run, status="running").exists()
    ended = RunEvent.objects.filter(run=run, type="span.ended").order_by("-seq")[0]
    assert ended.payload["span_id"] == root_id
    abandon_expired_spans_task()  # once only
    assert RunEvent.objects.filter(run=run, payload__span_id=root_id).count() == 2


def test_backlog_is_not_re_enqueued_and_a_lost_step_is(
    shop, scripted_agent, operator_user, tmp_path, settings
):
    """Item 5: runs queued behind a busy worker far longer than the lease are
    left alone, a run resumed after a long wait too; a run whose message is
    gone (a Redis without persistence lost it) is enqueued again, once."""
    settings.RUN_LEASE_SECONDS = 1.0
    settings.RUN_ENQUEUE_GRACE_SECONDS = 0.5
    scripted_agent(REPLACE_SCRIPT, ["create_replacement"], slug="approving")
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    worker = start_worker(tmp_path, pool="solo")
    group = worker.process.pid
    try:
        waiting = run_start(
            tenant=shop, agent_slug="approving", input="x", started_by=None
        )
        approval = wait_for(lambda: ApprovalRequest.objects.filter(run=waiting).first())
        wait_for(lambda: "succeeded in" in worker.output())  # its step is over
        os.killpg(group, signal.SIGSTOP)  # busy: it takes nothing more
        time.sleep(1.5)  # its blocking pop (1 s) has timed out: it holds nothing
        backlog = start_runs(shop, 12)
        time.sleep(1.2)  # older than the lease: what the old recovery re-enqueued
        approval_decide(request=approval, decided_by=operator_user, approve=True)
        waiting.refresh_from_db()  # resumed after a wait longer than the lease
        assert waiting.status == "queued"
        queued = queued_step_tokens()
        assert {str(r.step_token) for r in [*backlog, waiting]} <= queued
        time.sleep(0.6)  # the resumed run's enqueue is past its grace too
        assert recover_stalled_runs() == 0
        # One message lost: taken out of the queue as a Redis restart would.
        lost = backlog[0]
        client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
        queue = django_settings.CELERY_TASK_DEFAULT_QUEUE
        token = str(lost.step_token)
        raw = next(m for m in client.lrange(queue, 0, -1) if token in _decoded(m))
        assert client.lrem(queue, 1, raw) == 1
        old_token = lost.step_token
        assert recover_stalled_runs() == 1
        lost.refresh_from_db()
        assert lost.step_token != old_token
        assert str(lost.step_token) in queued_step_tokens()
        time.sleep(1.2)
        assert recover_stalled_runs() == 0  # recovered once, not at every pass
        os.killpg(group, signal.SIGCONT)  # the backlog drains
        for run in [*backlog, waiting]:
            wait_for(lambda run=run: settled(run))
    finally:
        os.killpg(group, signal.SIGCONT)
        worker.stop()
    assert waiting.status == "unverified", (waiting.stop_reason, waiting.stop_detail)
    for run in backlog:
        assert run.status == "unverified", (run.stop_reason, run.stop_detail)
        assert run.steps == 2


def _decoded(raw: bytes) -> str:
    return base64.b64decode(json.loads(raw)["body"]).decode()


def test_whole_worker_killed_mid_step_is_recovered_without_waiting_out_the_lease(
    shop, scripted_agent, tmp_path
):
    """Item 6: a worker dies whole (solo pool: the task's process is the
    worker) holding a 120 s lease; its heartbeat stops, and recovery hands the
    run to another worker within seconds, not a lease later."""
    assert django_settings.RUN_LEASE_SECONDS == 120
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    first = start_worker(
        tmp_path,
        pool="solo",
        extra_env={"RUN_FAILPOINTS": "after_tool_execute",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    (run,) = start_runs(shop, 1)
    wait_for(lambda: first.process.poll() is not None)  # SIGKILLed mid-step
    run.refresh_from_db()
    assert run.status == "running" and run.lease_worker.startswith("test-")
    assert run.lease_expires_at > timezone.now() + dt.timedelta(seconds=60)
    assert recover_stalled_runs() == 0  # its heartbeat has not lapsed yet
    second = start_worker(tmp_path)
    try:
        wait_for(lambda: time.sleep(1) or recover_stalled_runs(), timeout=25)
        run = wait_for(lambda: settled(run))
    finally:
        second.stop()
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert run.steps == 2
    assert ToolCall.objects.get(run=run).status == "succeeded"  # read-only: re-run


def test_worker_killed_and_restarted_under_its_name_hands_its_runs_on_soon(
    shop, scripted_agent, tmp_path
):
    """Item 6: a worker dies whole mid-step and its restart policy brings it
    back under the same node name at once. The new worker's heartbeat is not
    the dead one's: the run is handed on as soon as the dead one's heartbeat
    lapses, not when its 120 s lease runs out (124 s in the soak)."""
    assert django_settings.RUN_LEASE_SECONDS == 120
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    name = f"test-same-{os.getpid()}@%h"
    first = start_worker(
        tmp_path,
        pool="solo",
        name=name,
        extra_env={"RUN_FAILPOINTS": "after_tool_execute",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    (run,) = start_runs(shop, 1)
    wait_for(lambda: first.process.poll() is not None)  # SIGKILLed mid-step
    killed = time.monotonic()
    restarted = start_worker(tmp_path, name=name)
    try:
        run.refresh_from_db()
        assert run.status == "running"
        assert run.lease_worker.startswith(name.replace("%h", os.uname().nodename))
        wait_for(lambda: time.sleep(1) or recover_stalled_runs(), timeout=40)
        handed_on = time.monotonic() - killed
        run = wait_for(lambda: settled(run))
    finally:
        restarted.stop()
    assert handed_on < 40  # the lease had about 118 s left
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert ToolCall.objects.get(run=run).status == "succeeded"  # read-only: re-run


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="cuts PostgreSQL's connections"
)
@pytest.mark.parametrize("where", ["after_tool_execute", "inside_span_savepoint"])
def test_step_that_loses_the_database_mid_step_is_delivered_again_at_once(
    where, shop, scripted_agent, tmp_path
):
    """Item 6 (PostgreSQL restarted): a step's connection dies mid-step while
    its worker (and its heartbeat) stays alive. PostgreSQL ends every session
    of the database, as its restart does, with the step held after its tool
    ran, or inside the savepoint of its span records within a commit of the
    step (a failure tracing used to swallow, so the step's transaction rolled
    back silently and the step went on as if it had committed). The run used to fail, or
    wait out its 120 s lease (~120 s in the soak); now the step is delivered
    again at once and the run ends as it should, with no recovery pass: the
    read-only call run again, the model asked no more than its two replies."""
    assert django_settings.RUN_LEASE_SECONDS == 120
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    worker = start_worker(
        tmp_path,
        extra_env={"RUN_FAILPOINTS": where,
                   "RUN_FAILPOINT_ACTION": "pause",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        (run,) = start_runs(shop, 1)
        marker = tmp_path / f"failpoint-{where}"
        wait_for(marker.exists, what="the step to reach the failpoint")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (cut,) = cursor.fetchone()
        # The cut also ended this process's idle pooled connections: the pool
        # replaces them, or the next test would be handed a dead one.
        connection.pool.check()
        assert cut >= 1  # the step's connection at least
        (tmp_path / f"failpoint-{where}.resume").touch()
        run = wait_for(lambda: settled(run), timeout=20)
    finally:
        worker.stop()
    assert "the database connection was lost mid-step" in worker.output()
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert run.steps == 2
    assert ToolCall.objects.get(run=run).status == "succeeded"  # read-only: re-run


def test_killed_after_the_final_answer_was_recorded_ends_with_that_answer(
    shop, scripted_agent, tmp_path
):
    """Item 6 (none fails): the step that recorded the final answer dies before
    the run's end commits. The redelivered step ends the run with that answer
    instead of asking the model again (the scripted model has no second reply)."""
    scripted_agent([{"text": "All done."}], ["lookup_order"])
    worker = start_worker(
        tmp_path,
        extra_env={"RUN_FAILPOINTS": "after_action_persisted",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        (run,) = start_runs(shop, 1)
        run = wait_for(lambda: settled(run))
    finally:
        worker.stop()
    assert (tmp_path / "failpoint-after_action_persisted").exists()
    assert (run.status, run.final_answer) == ("unverified", "All done."), (
        run.stop_reason,
        run.stop_detail,
    )
    assert run.steps == 1 and run.step_rows.count() == 1


def test_pool_process_killed_as_the_worker_starts_does_not_stop_the_worker(
    shop, scripted_agent, tmp_path
):
    """Item 6: one pool process SIGKILLed right after the fork; the worker
    replaces it and serves runs."""
    worker = start_worker(
        tmp_path,
        concurrency=2,
        extra_env={"RUN_FAILPOINTS": "worker_process_init",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        assert (tmp_path / "failpoint-worker_process_init").exists()
        scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
        runs = start_runs(shop, 3)
        for run in runs:
            wait_for(lambda run=run: settled(run))
        assert worker.process.poll() is None, worker.output()
    finally:
        worker.stop()
    assert "Could not start worker processes" not in worker.output()
    assert all(run.status == "unverified" for run in runs)


@pytest.mark.parametrize("fault", ["redis_restart", "worker_killed_whole"])
def test_runs_in_flight_through_a_fault_fail_none_and_all_advance_soon(
    fault, shop, scripted_agent, own_redis, tmp_path, settings, capsys
):
    """Item 6, measured: Redis (append-only file, as in compose) restarted, or
    one of two real workers SIGKILLed whole (main and pool processes), with runs
    in flight. Beat's recovery pass is played by this test every
    RUN_RECOVERY_INTERVAL_SECONDS, with the default grace. Every run in flight
    advances again within 20 s of the fault's end; none fails."""
    scripted_agent(LOOKUP_SCRIPT, ["lookup_order"])
    interval = settings.RUN_RECOVERY_INTERVAL_SECONDS
    with broker_at(own_redis.url):
        workers = [worker_on(tmp_path, own_redis.url, concurrency=2) for _ in "ab"]
        try:
            if fault == "worker_killed_whole":
                time.sleep(10)  # Redis up for a heartbeat's life (workers_gone)
            runs = start_runs(shop, 40)
            wait_for(lambda: Run.objects.filter(steps__gte=1).count() >= 4)
            if fault == "redis_restart":
                own_redis.stop()  # clean: the append-only file is complete
            else:
                os.killpg(workers[0].process.pid, signal.SIGKILL)
            before = dict(Run.objects.values_list("id", "steps"))
            moving = Run.objects.exclude(status__in=Run.TERMINAL)
            in_flight = set(moving.values_list("id", flat=True))
            if fault == "redis_restart":
                time.sleep(2)
                own_redis.start()
            back = time.monotonic()
            advanced: dict[Any, float] = {}
            next_pass = back + interval
            while time.monotonic() < back + 90:
                if time.monotonic() >= next_pass:
                    recover_stalled_runs()
                    next_pass += interval
                for run_id, steps, status in Run.objects.filter(
                    id__in=in_flight - advanced.keys()
                ).values_list("id", "steps", "status"):
                    if steps > before[run_id] or status in Run.TERMINAL:
                        advanced[run_id] = time.monotonic() - back
                if advanced.keys() == in_flight and all(settled(r) for r in runs):
                    break
                time.sleep(0.1)
        finally:
            for worker in workers:
                worker.stop()
    statuses = {settled(run) and run.status for run in runs}
    failed = [(r.stop_reason, r.stop_detail) for r in runs if r.status != "unverified"]
    assert statuses == {"unverified"}, failed
    assert in_flight and advanced.keys() == in_flight
    figures = sorted(advanced.values())
    with capsys.disabled():
        print(
            f"\n{fault}: {len(in_flight)} runs in flight; advanced again after "
            f"p50 {figures[len(figures) // 2]:.1f} s, max {figures[-1]:.1f} s"
        )
    assert figures[-1] <= 20.0
