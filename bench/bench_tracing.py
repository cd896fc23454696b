"""Tracing benchmarks (issue 6), all in one run, on the configured database
(a fresh SQLite file unless DATABASE_URL is set) and a real Redis:

(a) span pipeline: spans/s started and ended through our processor (stored at
    start and end, logged with seqs, broadcast after commit) next to the
    OpenTelemetry SDK alone with an in-memory exporter;
(b) latency from a span starting in a separate producer process (a worker) to a
    WebSocket consumer receiving it, p50/p99, 50 concurrent runs, 50 clients on
    the real channels-redis layer (consumers in-process, no TCP socket);
(c) OTLP ingest: 20,000 spans in 200 traces sent by the real OTLP/HTTP exporter
    to a Daphne server, until all are queryable;
(d) channel layers: messages delivered out of a burst to one reader, for the
    default RedisChannelLayer and RedisPubSubChannelLayer.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.agents import scripted_agent
from bench.django_env import BASE_DIR, django_setup, percentile
from controlplane.embedded_redis import free_local_port

SPANS_A = 2000
RUNS_B = 50
SPANS_PER_RUN_B = 20
TRACES_C = 200
SPANS_PER_TRACE_C = 100
BURST_D = 5000


def _fixtures() -> tuple[Any, Any, str]:
    from django.contrib.auth import get_user_model

    from controlplane.services import api_token_issue, membership_set, tenant_create

    tenant = tenant_create(slug=f"bench-{uuid.uuid4().hex[:6]}", name="Bench")
    user = get_user_model().objects.create_user(username=f"u-{uuid.uuid4().hex[:6]}")
    membership_set(tenant=tenant, user=user, role="admin")
    agent = scripted_agent(tenant, "bench")
    return tenant, agent, api_token_issue(tenant=tenant, user=user).secret


def _runs(tenant: Any, agent: Any, count: int) -> list[Any]:
    from runs.models import Run

    return [
        Run.objects.create(
            tenant=tenant,
            agent=agent,
            agent_version=agent.current_version,
            input="bench",
            trace_id=uuid.uuid4().hex,
            status=Run.Status.SUCCEEDED,
        )  # fmt: skip
        for _ in range(count)
    ]


def _chat_attributes() -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.input.messages": json.dumps([{"role": "user", "content": "hi " * 50}]),
    }


def bench_pipeline(tenant: Any, agent: Any) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    from tracing.models import RunEvent
    from tracing.setup import configure_tracing

    attributes = _chat_attributes()
    baseline = TracerProvider()
    baseline.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracer = baseline.get_tracer("bench")
    started = time.perf_counter()
    for _ in range(SPANS_A):
        tracer.start_span("chat scripted", attributes=attributes).end()
    sdk = time.perf_counter() - started

    run = _runs(tenant, agent, 1)[0]
    ours = configure_tracing(force=True).get_tracer("bench")
    attributes = {
        **attributes,
        "cp.run.id": str(run.id),
        "cp.tenant.id": str(tenant.id),
    }
    started = time.perf_counter()
    for _ in range(SPANS_A):
        ours.start_span("chat scripted", attributes=attributes).end()
    pipeline = time.perf_counter() - started
    events = RunEvent.objects.filter(run=run).count()
    assert events == 2 * SPANS_A, events
    print(
        f"(a) span pipeline, {SPANS_A} spans: SDK + in-memory exporter "
        f"{SPANS_A / sdk:,.0f} spans/s ({sdk / SPANS_A * 1e6:.0f} us/span); ours "
        f"(row at start and end, 2 events, broadcast) {SPANS_A / pipeline:,.0f} "
        f"spans/s ({pipeline / SPANS_A * 1e6:.0f} us/span, "
        f"+{(pipeline - sdk) / SPANS_A * 1e6:.0f} us/span)"
    )


def produce(run_ids: list[str], tenant_id: str, rounds: int) -> None:
    """The producer process of (b): a worker starting and ending spans."""
    django_setup(os.environ["DATABASE_URL"])
    from tracing.setup import configure_tracing

    tracer = configure_tracing(force=True).get_tracer("bench")
    for _ in range(rounds):
        for run_id in run_ids:
            attrs = {"cp.run.id": run_id, "cp.tenant.id": tenant_id}
            tracer.start_span("execute_tool echo", attributes=attrs).end()
        time.sleep(0.02)


async def _latency_clients(
    runs: list[Any], secret: str, start_producer: Any
) -> list[float]:
    from channels.testing import WebsocketCommunicator

    from controlplane.asgi import application

    headers = [(b"origin", b"http://localhost"),
               (b"authorization", f"Bearer {secret}".encode())]  # fmt: skip
    clients = []
    for run in runs:
        ws = WebsocketCommunicator(
            application, f"/ws/runs/{run.id}/?after_seq=0", headers
        )
        connected, _ = await ws.connect(timeout=10)
        assert connected
        clients.append(ws)
    latencies: list[float] = []

    async def read(ws: WebsocketCommunicator) -> None:
        seen = 0
        while seen < SPANS_PER_RUN_B:
            frame = json.loads((await ws.receive_output(timeout=60))["text"])
            if frame["type"] != "event" or frame["event"]["type"] != "span.started":
                continue
            now = time.time()
            started = frame["event"]["payload"]["started_at"]
            from datetime import datetime

            latencies.append(now - datetime.fromisoformat(started).timestamp())
            seen += 1

    producer = start_producer()
    await asyncio.gather(*(read(ws) for ws in clients))
    producer.wait(60)
    for ws in clients:
        await ws.disconnect()
    return latencies


def bench_latency(tenant: Any, agent: Any, secret: str) -> None:
    runs = _runs(tenant, agent, RUNS_B)
    ids = [str(run.id) for run in runs]

    def start_producer() -> subprocess.Popen[bytes]:
        code = (
            "from bench.bench_tracing import produce; "
            f"produce({ids!r}, {str(tenant.id)!r}, {SPANS_PER_RUN_B})"
        )
        return subprocess.Popen([sys.executable, "-c", code], cwd=BASE_DIR,
                                env=dict(os.environ))  # fmt: skip

    latencies = asyncio.run(_latency_clients(runs, secret, start_producer))
    print(
        f"(b) span start in a worker process -> WebSocket client, {RUNS_B} runs x "
        f"{SPANS_PER_RUN_B} spans, {RUNS_B} clients: p50 "
        f"{percentile(latencies, 50) * 1000:.1f} ms, p99 "
        f"{percentile(latencies, 99) * 1000:.1f} ms (target p99 <= 100 ms)"
    )


def bench_ingest(tenant: Any, secret: str) -> None:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tracing.models import Span

    port = free_local_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "controlplane.asgi:application"],
        cwd=BASE_DIR, env=dict(os.environ), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        exporter = OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{port}/v1/traces",
            headers={"Authorization": f"Bearer {secret}"},
            compression=Compression.Gzip,
        )
        provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
        provider.add_span_processor(
            BatchSpanProcessor(exporter, max_queue_size=40_000,
                               max_export_batch_size=2000, schedule_delay_millis=50)
        )  # fmt: skip
        tracer = provider.get_tracer("elsewhere")
        attributes = _chat_attributes()
        total = TRACES_C * SPANS_PER_TRACE_C
        before = Span.objects.filter(run__tenant=tenant).count()
        started = time.perf_counter()
        for _ in range(TRACES_C):
            with tracer.start_as_current_span("agent", attributes={"agent.name": "b"}):
                for _ in range(SPANS_PER_TRACE_C - 1):
                    tracer.start_span("chat", attributes=attributes).end()
        provider.force_flush(120_000)
        while Span.objects.filter(run__tenant=tenant).count() - before < total:
            if time.perf_counter() - started > 150:
                raise RuntimeError("ingest did not finish in 150 s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        provider.shutdown()
        print(
            f"(c) OTLP ingest, {total:,} spans in {TRACES_C} traces via the real "
            f"exporter (gzip protobuf) to Daphne: {elapsed:.2f} s until queryable, "
            f"{total / elapsed:,.0f} spans/s (target >= 2,000)"
        )
    finally:
        server.terminate()
        server.wait(10)


async def _burst(backend: str, url: str) -> int:
    from channels_redis.core import RedisChannelLayer
    from channels_redis.pubsub import RedisPubSubChannelLayer

    layer: Any
    if backend == "RedisChannelLayer":
        layer = RedisChannelLayer(hosts=[url], capacity=1000, expiry=60)
    else:
        layer = RedisPubSubChannelLayer(hosts=[url])
    channel = await layer.new_channel()
    group = f"bench{uuid.uuid4().hex[:8]}"
    await layer.group_add(group, channel)
    received = 0

    async def reader() -> None:
        nonlocal received
        while True:
            await layer.receive(channel)
            received += 1

    task = asyncio.create_task(reader())
    for i in range(BURST_D):
        await layer.group_send(group, {"type": "run.event", "i": i})
    await asyncio.sleep(2)
    task.cancel()
    await layer.group_discard(group, channel)
    if hasattr(layer, "flush"):
        await layer.flush()
    return received


def bench_layers() -> None:
    url = os.environ["REDIS_URL"]
    results = {
        name: asyncio.run(_burst(name, url))
        for name in ("RedisChannelLayer", "RedisPubSubChannelLayer")
    }
    print(
        f"(d) burst of {BURST_D} group messages to one reading client: "
        + ", ".join(
            f"{name} delivered {count} ({100 * (1 - count / BURST_D):.1f}% lost)"
            for name, count in results.items()
        )
        + "; the consumer fills any gap from the log either way"
    )


def main() -> None:
    url = django_setup(os.environ.get("DATABASE_URL"))
    print(f"database: {url.split('@')[-1]}, redis: {os.environ['REDIS_URL']}")
    tenant, agent, secret = _fixtures()
    bench_pipeline(tenant, agent)
    bench_latency(tenant, agent, secret)
    bench_ingest(tenant, secret)
    bench_layers()


if __name__ == "__main__":
    main()
