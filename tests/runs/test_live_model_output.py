"""A streamed reply's text reaches a WebSocket client of the run while the model
writes (ephemeral, throttled), and the chat span stored at the end holds it whole."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection

from controlplane.asgi import application
from controlplane.services import api_token_issue
from runs.devserver import Behaviour, ChatCompletionsServer, MessagesServer, Reply
from runs.engine.adapters.openai_compatible import OpenAIModel
from runs.engine.budget import BudgetVector
from runs.engine.step import ModelCallPlan, call_model
from runs.models import Run
from runs.services import run_start
from runs.spans import chat_span
from tests.agents import make_agent
from tests.runs.conftest import drive
from tracing.models import RunEvent, Span
from tracing.selectors import span_payloads

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = (
    "Order 4821 shipped on Monday from the Leeds warehouse; the courier expects "
    "to deliver it on Thursday before noon. I have sent you the tracking link."
)
MESSAGES = [{"role": "user", "content": "Where is order 4821?"}]


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


def communicator(path: str, secret: str) -> WebsocketCommunicator:
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"authorization", f"Bearer {secret}".encode()),
    ]
    return WebsocketCommunicator(application, path, headers=headers)


def model_call(
    run: Run, server: ChatCompletionsServer, outcome: dict[str, Any]
) -> None:
    """The model phase of a step as advance.py runs it: the chat span around a
    streamed call, its deltas going to the run's stream."""
    adapter = OpenAIModel(
        model="gpt-live", api_key="k", base_url=server.base_url, stream=True
    )
    plan = ModelCallPlan(256, 20, BudgetVector())
    with chat_span(run, messages_json=json.dumps(MESSAGES), tools=[]) as chat:
        reply = call_model(adapter, MESSAGES, [], plan, on_delta=chat.deltas())
        chat.reply(reply)
    outcome["reply"] = reply
    connection.close()  # this thread's


async def test_deltas_arrive_before_the_span_ends_and_the_span_keeps_the_whole_text(
    run: Run, secret: str
) -> None:
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await ws.connect())[0]
    await asyncio.sleep(0.2)  # in the group before the model writes

    with ChatCompletionsServer() as server:
        # ~25 pieces 40 ms apart: a reply written over about a second.
        server.push(Behaviour(reply=Reply(text=TEXT), chunk_delay=0.04))
        outcome: dict[str, Any] = {}
        worker = threading.Thread(target=model_call, args=(run, server, outcome))
        worker.start()
        deltas: list[tuple[float, dict[str, Any]]] = []
        chat_ended: float | None = None
        chat_id = ""
        deadline = time.monotonic() + 15
        while chat_ended is None and time.monotonic() < deadline:
            frame = await ws.receive_json_from(timeout=5)
            if frame["type"] == "delta":
                deltas.append((time.monotonic(), frame))
            elif frame["type"] == "event" and frame["event"]["type"] == "span.ended":
                payload = frame["event"]["payload"]
                if payload["name"].startswith("chat"):
                    chat_ended, chat_id = time.monotonic(), payload["span_id"]
        await sync_to_async(worker.join)(10)
    await ws.disconnect()

    assert chat_ended is not None, "the chat span's end never came"
    assert len(deltas) >= 3
    # Live: several batches came well before the span ended, throttled (~100 ms).
    assert deltas[0][0] < chat_ended - 0.3
    assert len(deltas) <= 16
    assert all(frame["span_id"] == chat_id for _, frame in deltas)
    offsets = [frame["offset"] for _, frame in deltas]
    text = "".join(frame["text"] for _, frame in deltas)
    assert text == TEXT
    assert offsets == sorted(offsets) and offsets[0] == 0

    # Nothing of it went to the event log: the stored span is the record.
    def stored() -> tuple[Span, dict[str, Any], int]:
        chat = Span.objects.get(run=run, span_id=chat_id)
        payloads = span_payloads(tenant=run.tenant, span=chat)
        return (
            chat,
            payloads,
            RunEvent.objects.filter(run=run, type__contains="delta").count(),
        )

    chat, payloads, delta_events = await sync_to_async(stored)()
    assert delta_events == 0
    assert json.loads(payloads["gen_ai.output.messages"])[0]["content"] == TEXT
    assert chat.attributes["cp.model.live_messages"] == len(deltas)
    assert outcome["reply"].text == TEXT


async def test_a_dropped_stream_resets_the_live_text(run: Run, secret: str) -> None:
    ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
    assert (await ws.connect())[0]
    await asyncio.sleep(0.2)
    with ChatCompletionsServer() as server:
        server.push(
            Behaviour(
                reply=Reply(text="a first try that breaks off"),
                chunk_delay=0.06,
                drop_after=4,
            )
        )
        server.push(Behaviour(reply=Reply(text="the answer"), chunk_delay=0.06))
        outcome: dict[str, Any] = {}

        def call() -> None:
            adapter = OpenAIModel(
                model="gpt-live", api_key="k", base_url=server.base_url, stream=True,
                sleep=lambda s: None,
            )  # fmt: skip
            plan = ModelCallPlan(64, 20, BudgetVector())
            with chat_span(run, messages_json="[]", tools=[]) as chat:
                outcome["reply"] = call_model(
                    adapter, MESSAGES, [], plan, on_delta=chat.deltas()
                )
                chat.reply(outcome["reply"])

        await sync_to_async(call, thread_sensitive=False)()
        frames: list[dict[str, Any]] = []
        while not await ws.receive_nothing(timeout=0.5):
            frame = await ws.receive_json_from()
            if frame["type"] == "delta":
                frames.append(frame)
    await ws.disconnect()
    resets = [i for i, frame in enumerate(frames) if frame["reset"]]
    assert len(resets) == 1
    after = frames[resets[0] + 1 :]
    assert "".join(f["text"] for f in after) == "the answer"
    assert after[0]["offset"] == 0


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_run_on_a_streaming_endpoint_shows_its_reply_live(
    tenant: Any, admin_user: Any, kind: str
) -> None:
    """The whole path: run_advance builds the endpoint's streaming client and
    the step relays its text while the model writes, for either protocol (the
    Anthropic Messages API through its SDK)."""
    protocol = ChatCompletionsServer if kind == "openai" else MessagesServer
    with protocol() as server:
        server.push(Behaviour(reply=Reply(text=TEXT), chunk_delay=0.04))

        def prepare() -> tuple[Run, str]:
            agent = make_agent(tenant, "live", kind=kind, model="m-live",
                               base_url=server.base_url)  # fmt: skip
            run = run_start(
                tenant=tenant, agent_slug=agent.slug, input="hi", started_by=None
            )
            return run, api_token_issue(tenant=tenant, user=admin_user).secret

        run, secret = await sync_to_async(prepare)()
        ws = communicator(f"/ws/runs/{run.id}/?after_seq=0", secret)
        assert (await ws.connect())[0]
        await asyncio.sleep(0.2)

        def advance() -> None:
            try:
                drive(run)
            finally:
                connection.close()

        worker = threading.Thread(target=advance)
        worker.start()
        deltas: list[dict[str, Any]] = []
        ended_after = None
        deadline = time.monotonic() + 20
        while ended_after is None and time.monotonic() < deadline:
            frame = await ws.receive_json_from(timeout=5)
            if frame["type"] == "delta":
                deltas.append(frame)
            elif frame["type"] == "event" and _chat_ended(frame["event"]):
                ended_after = len(deltas)
        await sync_to_async(worker.join)(20)
        await ws.disconnect()
    assert ended_after is not None and ended_after >= 3
    assert "".join(frame["text"] for frame in deltas) == TEXT
    run = await sync_to_async(Run.objects.get)(id=run.id)
    assert run.final_answer == TEXT


def _chat_ended(event: dict[str, Any]) -> bool:
    return bool(
        event["type"] == "span.ended" and event["payload"]["name"].startswith("chat")
    )
