"""The live streams through a real Daphne and real Redis, over time: an idle stream
stays open, and a Redis that stops answering still ends the stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from approvals.models import ApprovalRequest
from controlplane.embedded_redis import EmbeddedRedis
from controlplane.services import api_token_issue
from runs.models import Run
from runs.services import run_start
from tests.approvals.conftest import REFUND_ARGS, call, script_of
from tests.frontend.conftest import DaphneServer
from tests.runs.conftest import drive
from tracing.models import RunEvent

pytestmark = pytest.mark.django_db(transaction=True)

HEARTBEAT_SECONDS = 5
IDLE_SECONDS = 60


@pytest.fixture
def run(demo_agent: Any) -> Run:
    return run_start(
        tenant=demo_agent.tenant,
        agent_slug=demo_agent.slug,
        input="hi",
        started_by=None,
    )


@pytest.fixture
def secret(run: Run, admin_user: Any) -> str:
    return api_token_issue(tenant=run.tenant, user=admin_user).secret


@pytest.fixture
def daphne_5s(tmp_path: Path) -> Iterator[DaphneServer]:
    server = DaphneServer(
        tmp_path, env={"STREAM_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS)}
    ).start()
    yield server
    server.stop()


def connect(server: DaphneServer, path: str, secret: str) -> Any:
    return websockets.connect(
        server.url.replace("http://", "ws://") + path,
        origin=websockets.Origin(server.url),
        additional_headers={"Authorization": f"Bearer {secret}"},
        # The client's own keepalive pings would hide a silent server.
        ping_interval=None,
    )


async def collect_for(ws: ClientConnection, seconds: float) -> list[dict[str, Any]]:
    """Every frame the server sends within `seconds` (stops early if it closes)."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), left)))
        except TimeoutError:
            break
        except websockets.ConnectionClosed:
            break
    return frames


async def test_idle_run_and_tenant_streams_stay_open_for_a_minute_with_heartbeats(
    run: Run, secret: str, daphne_5s: DaphneServer
) -> None:
    async with (
        connect(daphne_5s, f"/ws/runs/{run.id}/?after_seq=0", secret) as run_ws,
        connect(daphne_5s, "/ws/tenant/", secret) as tenant_ws,
    ):
        run_frames, tenant_frames = await asyncio.gather(
            collect_for(run_ws, IDLE_SECONDS), collect_for(tenant_ws, IDLE_SECONDS)
        )
        # Still open both ways after the minute: a ping gets its pong.
        assert run_ws.close_code is None, (run_ws.close_code, daphne_5s.output())
        assert tenant_ws.close_code is None, (tenant_ws.close_code, daphne_5s.output())
        await run_ws.send(json.dumps({"type": "ping"}))
        await tenant_ws.send(json.dumps({"type": "ping"}))
        run_tail = await collect_for(run_ws, 3)
        tenant_tail = await collect_for(tenant_ws, 3)
    for frames in (run_frames, tenant_frames):
        assert frames[0]["type"] == "hello"
        assert frames[0]["heartbeat_seconds"] == HEARTBEAT_SECONDS
    minimum = IDLE_SECONDS // HEARTBEAT_SECONDS - 2
    for frames in (run_frames, tenant_frames):
        assert sum(f["type"] == "heartbeat" for f in frames) >= minimum, frames
    assert "pong" in [f["type"] for f in run_tail]
    assert "pong" in [f["type"] for f in tenant_tail]
    assert "TimeoutError" not in daphne_5s.output()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


async def test_a_redis_that_stops_answering_still_ends_an_idle_stream(
    run: Run, secret: str, tmp_path: Path, own_redis: EmbeddedRedis
) -> None:
    """A hung Redis (the process stopped, its sockets open: no reset, TCP keepalive
    still answered by the kernel) is noticed by the layer's read timeout, so the
    client is told (1011) and reconnects, instead of waiting forever."""
    daphne = DaphneServer(
        tmp_path, env={"REDIS_URL": own_redis.url, "STREAM_HEARTBEAT_SECONDS": "1"}
    ).start()
    try:
        async with connect(daphne, "/ws/tenant/", secret) as ws:
            hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert hello["type"] == "hello"
            assert own_redis.process is not None
            os.kill(own_redis.process.pid, signal.SIGSTOP)
            frames = await collect_for(ws, 90)
            assert ws.close_code == 1011, (ws.close_code, frames, daphne.output())
        # Heartbeats went on until the layer gave up: the consumer was alive.
        assert any(f["type"] == "heartbeat" for f in frames)
        assert "Timeout reading from" in daphne.output()
    finally:
        daphne.stop()


async def _hello(server: DaphneServer, path: str, secret: str) -> dict[str, Any]:
    """The first frame of a new stream: a handshake that failed raises."""
    async with connect(server, path, secret) as ws:
        return dict(json.loads(await asyncio.wait_for(ws.recv(), 15)))


def _post(server: DaphneServer, path: str, secret: str, body: Any) -> int:
    request = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {secret}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as reply:
        return int(reply.status)


@pytest.fixture
def approval(
    shop: Any, scripted_agent: Any, admin_user: Any
) -> tuple[ApprovalRequest, int]:
    """A run driven in this process to its approval wait (a refund), and the
    last seq of its event log then."""
    agent = scripted_agent(
        script_of(call("refund", REFUND_ARGS)),
        ["lookup_order", "refund"],
        slug="refunder",
    )
    waiting = drive(
        run_start(tenant=shop, agent_slug=agent.slug, input="help", started_by=None)
    )
    assert waiting.status == Run.Status.WAITING_APPROVAL, waiting.stop_detail
    pending = ApprovalRequest.objects.get(run=waiting, status="pending")
    seqs = RunEvent.objects.filter(run=waiting).values_list("seq", flat=True)
    return pending, max(seqs, default=0)


async def test_after_a_redis_restart_handshakes_succeed_and_streams_deliver_events(
    approval: tuple[ApprovalRequest, int],
    secret: str,
    tmp_path: Path,
    own_redis: EmbeddedRedis,
) -> None:
    """Every pooled connection of the layer dies with a Redis restart; each was
    used once more and failed ("Connection lost"), failing a handshake long after
    Redis was back. The layer reconnects instead, and live events flow again."""
    # Nothing is appended to the run's log before the decision below.
    pending, last_seq = approval
    run_id = pending.run_id
    daphne = DaphneServer(
        tmp_path,
        # Heartbeats (which also refill from the log) stay out of the way: an
        # event seen below came through the layer.
        env={"REDIS_URL": own_redis.url, "STREAM_HEARTBEAT_SECONDS": "120"},
    ).start()
    streams = [f"/ws/runs/{run_id}/?after_seq=0", "/ws/tenant/"]
    try:
        # Concurrent streams: the layer's pool holds several connections.
        hellos = await asyncio.gather(
            *(_hello(daphne, streams[n % 2], secret) for n in range(12))
        )
        assert {frame["type"] for frame in hellos} == {"hello"}
        own_redis.stop()
        own_redis.start()  # the same port
        for n in range(24):
            hello = await _hello(daphne, streams[n % 2], secret)
            assert hello["type"] == "hello", (n, hello, daphne.output())
        after = await asyncio.gather(
            *(_hello(daphne, streams[n % 2], secret) for n in range(12))
        )
        assert {frame["type"] for frame in after} == {"hello"}, after
        async with connect(
            daphne, f"/ws/runs/{run_id}/?after_seq={last_seq}", secret
        ) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 15))["type"] == "hello"
            # Daphne records the decision and broadcasts its event.
            status = await asyncio.to_thread(
                _post,
                daphne,
                f"/api/v1/approvals/{pending.id}/decide/",
                secret,
                {"decision": "deny", "reason": "not today"},
            )
            assert status == 200
            frames = await collect_for(ws, 15)
        events = [f["event"] for f in frames if f["type"] == "event"]
        assert events, (frames, daphne.output())
        assert events[0]["seq"] == last_seq + 1
        assert "Connection lost" not in daphne.output()
    finally:
        daphne.stop()
