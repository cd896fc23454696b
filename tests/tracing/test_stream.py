"""The live streams against the real ASGI app and the real channels-redis layer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from controlplane.asgi import application
from controlplane.services import api_token_issue
from runs.models import Run
from runs.services import run_start
from tracing import services as tracing_services
from tracing.models import RunEvent
from tracing.services import run_event_append

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(demo_agent: Any) -> Run:
    return run_start(
        tenant=demo_agent.tenant,
        agent_slug=demo_agent.slug,
        input="hi",
        started_by=None,
    )


@pytest.fixture
def secret_for() -> Any:
    def build(user: Any, tenant: Any) -> str:
        return api_token_issue(tenant=tenant, user=user).secret

    return build


def communicator(path: str, secret: str | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if secret:
        headers.append((b"authorization", f"Bearer {secret}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def append(run: Run, n: int, type: str = "run.note") -> list[RunEvent]:
    def write() -> list[RunEvent]:
        return [
            run_event_append(run=run, type=type, payload={"i": i}) for i in range(n)
        ]

    return await sync_to_async(write)()


async def frames(ws: WebsocketCommunicator, *, until_seq: int) -> list[dict[str, Any]]:
    """Event frames until `until_seq` arrives (heartbeats and hello skipped)."""
    got: list[dict[str, Any]] = []
    while True:
        frame = await ws.receive_json_from(timeout=5)
        if frame["type"] != "event":
            continue
        got.append(frame["event"])
        if frame["event"]["seq"] >= until_seq:
            return got


async def nothing_more(ws: WebsocketCommunicator) -> bool:
    """No further event frame within a short wait (the app stays connected)."""
    while not await ws.receive_nothing(timeout=0.3):
        frame = await ws.receive_json_from()
        if frame["type"] == "event":
            return False
    return True


async def test_reconnect_after_seq_40_gets_41_to_60_once_then_live(
    run: Run, admin_user: Any, secret_for: Any
) -> None:
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    await append(run, 40)
    first = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await first.connect())[0]
    assert [f["seq"] for f in await frames(first, until_seq=40)] == list(range(1, 41))
    await first.disconnect()

    await append(run, 20)  # 41-60 while the client is away
    again = communicator(f"/ws/runs/{run.id}/", secret)
    assert (await again.connect())[0]
    await asyncio.sleep(0.2)  # joined the group; these arrive live *and* in the log
    await append(run, 5)  # 61-65
    await again.send_json_to({"type": "resume", "after_seq": 40})
    replayed = await frames(again, until_seq=65)
    assert [f["seq"] for f in replayed] == list(range(41, 66))
    await append(run, 1)  # 66, live only
    live = await frames(again, until_seq=66)
    assert [f["seq"] for f in live] == [66]
    assert live[0]["payload"] == {"i": 0}
    assert await nothing_more(again)
    await again.disconnect()


async def test_a_broadcast_lost_by_the_layer_is_filled_from_the_log(
    run: Run, admin_user: Any, secret_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await ws.connect())[0]
    await append(run, 2)
    real = tracing_services.run_event_broadcast

    def lossy(*, event: RunEvent, tenant_id: Any) -> None:
        if event.seq in (3, 4):
            return  # the layer dropped these (capacity)
        real(event=event, tenant_id=tenant_id)

    monkeypatch.setattr(tracing_services, "run_event_broadcast", lossy)
    await append(run, 3)  # 3, 4 lost; 5 arrives and shows the gap
    got = await frames(ws, until_seq=5)
    assert [f["seq"] for f in got] == [1, 2, 3, 4, 5]
    assert await nothing_more(ws)
    await ws.disconnect()


async def test_a_lost_tail_event_is_found_by_the_heartbeat(
    run: Run, admin_user: Any, secret_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    monkeypatch.setattr(settings, "STREAM_HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(tracing_services, "run_event_broadcast", lambda **kwargs: None)
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await ws.connect())[0]
    await append(run, 2)  # never broadcast
    assert [f["seq"] for f in await frames(ws, until_seq=2)] == [1, 2]
    await ws.disconnect()


async def test_another_tenants_run_closes_with_4404(
    run: Run, other_tenant: Any, make_member: Any, secret_for: Any
) -> None:
    stranger = await sync_to_async(make_member)(other_tenant, "mallory", "admin")
    secret = await sync_to_async(secret_for)(stranger, other_tenant)
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    connected, _ = await ws.connect()
    assert connected
    error = await ws.receive_json_from()
    assert error["code"] == 4404
    assert (await ws.receive_output())["code"] == 4404
    await ws.disconnect()


async def test_no_credentials_close_with_4401(run: Run) -> None:
    ws = communicator(f"/ws/runs/{run.id}/", None)
    await ws.connect()
    assert (await ws.receive_json_from())["code"] == 4401
    assert (await ws.receive_output())["code"] == 4401


async def test_tenants_never_see_each_others_events(
    run: Run,
    admin_user: Any,
    other_tenant: Any,
    make_member: Any,
    secret_for: Any,
) -> None:
    mine = await sync_to_async(secret_for)(admin_user, run.tenant)
    stranger = await sync_to_async(make_member)(other_tenant, "mallory", "admin")
    theirs = await sync_to_async(secret_for)(stranger, other_tenant)
    own_feed = communicator("/ws/tenant/?after_id=0", mine)
    other_feed = communicator("/ws/tenant/?after_id=0", theirs)
    assert (await own_feed.connect())[0]
    assert (await other_feed.connect())[0]
    events = await append(run, 3, type="run.updated")
    got = []
    while len(got) < 3:
        frame = await own_feed.receive_json_from(timeout=5)
        if frame["type"] == "event":
            got.append(frame["event"]["id"])
    assert got == [event.id for event in events]
    assert await nothing_more(other_feed)
    await own_feed.disconnect()
    await other_feed.disconnect()


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("not json", "not JSON"),
        (json.dumps({"type": "resume", "after_seq": -1}), "non-negative"),
        (json.dumps({"type": "resume", "after_seq": "x"}), "non-negative"),
        (json.dumps({"type": "resume", "run_id": "another"}), "one run"),
        (json.dumps([1, 2]), "object"),
    ],
)
async def test_a_bad_message_closes_only_its_own_connection(
    run: Run, admin_user: Any, secret_for: Any, message: str, reason: str
) -> None:
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    bystander = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    offender = communicator(f"/ws/runs/{run.id}/", secret)
    assert (await bystander.connect())[0]
    assert (await offender.connect())[0]
    before = await sync_to_async(RunEvent.objects.count)()
    await offender.send_to(text_data=message)
    frame = await offender.receive_json_from()
    while frame["type"] != "error":
        frame = await offender.receive_json_from()
    assert frame["code"] == 4400 and reason in frame["message"]
    assert (await offender.receive_output())["code"] == 4400
    assert await sync_to_async(RunEvent.objects.count)() == before
    await append(run, 1)
    assert [f["seq"] for f in await frames(bystander, until_seq=1)] == [1]
    await bystander.disconnect()


async def test_a_negative_after_seq_in_the_url_is_refused(
    run: Run, admin_user: Any, secret_for: Any
) -> None:
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=-3", secret)
    await ws.connect()
    assert (await ws.receive_json_from())["code"] == 4400


async def test_the_stream_of_a_real_run_carries_spans_with_secrets_redacted(
    scripted_agent: Any, admin_user: Any, secret_for: Any, drive_run: Any
) -> None:
    leaked = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"
    agent = await sync_to_async(scripted_agent)(
        [
            {"tool_calls": [{"id": "c1", "name": "echo",
                             "arguments": {"text": f"key {leaked}"}}]},
            {"text": "done"},
        ],
        ["echo"],
    )  # fmt: skip
    run = await sync_to_async(run_start)(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await ws.connect())[0]
    await sync_to_async(drive_run)(run)
    total = await sync_to_async(RunEvent.objects.filter(run=run).count)()
    got = await frames(ws, until_seq=total)
    assert [f["seq"] for f in got] == list(range(1, total + 1))
    assert leaked not in json.dumps(got)
    tool = [f for f in got if f["payload"].get("name") == "execute_tool echo"]
    # A fast call's span is stored complete: one event says it all.
    assert [f["type"] for f in tool] == ["span.ended"]
    assert tool[0]["payload"]["ended_at"] and tool[0]["payload"]["status"] != "running"
    stored = await sync_to_async(
        lambda: json.dumps(list(RunEvent.objects.filter(run=run).values("payload")))
    )()
    assert leaked not in stored
    await ws.disconnect()


async def test_a_client_that_does_not_drain_is_closed_with_its_last_seq(
    run: Run, admin_user: Any, secret_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    from runs.consumers import RunStreamConsumer

    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    bystander = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await bystander.connect())[0]
    monkeypatch.setattr(settings, "STREAM_QUEUE_EVENTS", 4)
    release = asyncio.Event()
    real_loop = RunStreamConsumer._send_loop

    async def stalled(self: Any) -> None:
        await release.wait()  # the client's socket takes nothing for now
        await real_loop(self)

    monkeypatch.setattr(RunStreamConsumer, "_send_loop", stalled)
    slow = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await slow.connect())[0]
    await asyncio.sleep(0.2)
    await append(run, 10)
    error = await slow.receive_json_from(timeout=5)
    assert error["code"] == 4408 and error["last_seq"] == 3  # hello + 1..3 queued
    assert (await slow.receive_output())["code"] == 4408
    # The other client got everything.
    assert [f["seq"] for f in await frames(bystander, until_seq=10)] == list(
        range(1, 11)
    )
    release.set()
    await bystander.disconnect()


async def all_frames(ws: WebsocketCommunicator) -> list[dict[str, Any]]:
    """Every frame until the connection has been quiet for a moment."""
    got = []
    while not await ws.receive_nothing(timeout=0.5):
        got.append(await ws.receive_json_from())
    return got


async def test_resuming_again_from_zero_never_resends_what_was_sent(
    run: Run, admin_user: Any, secret_for: Any
) -> None:
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    await append(run, 20)
    total = await sync_to_async(RunEvent.objects.filter(run=run).count)()
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await ws.connect())[0]
    await ws.send_json_to({"type": "resume", "after_seq": 0})
    await ws.send_json_to({"type": "resume", "after_seq": 7})
    got = [f for f in await all_frames(ws) if f["type"] != "heartbeat"]
    assert [f["type"] for f in got] == ["hello"] + ["event"] * total
    assert [f["event"]["seq"] for f in got[1:]] == list(range(1, total + 1))
    # Still following: the next event arrives once.
    await append(run, 1)
    assert [f["seq"] for f in await frames(ws, until_seq=total + 1)] == [total + 1]
    assert await nothing_more(ws)
    await ws.disconnect()


async def test_resuming_the_tenant_stream_again_never_resends_what_was_sent(
    run: Run, admin_user: Any, secret_for: Any
) -> None:
    secret = await sync_to_async(secret_for)(admin_user, run.tenant)
    events = await append(run, 20, type="run.updated")
    ws = communicator("/ws/tenant/?after_id=0", secret)
    assert (await ws.connect())[0]
    await ws.send_json_to({"type": "resume", "after_id": 0})
    got = [f for f in await all_frames(ws) if f["type"] != "heartbeat"]
    ids = [f["event"]["id"] for f in got if f["type"] == "event"]
    assert got[0]["type"] == "hello"
    assert len(ids) == len(set(ids)) == len(got) - 1
    assert ids[-20:] == [event.id for event in events]
    await ws.disconnect()
