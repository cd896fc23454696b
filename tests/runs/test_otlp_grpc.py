"""The OTLP/gRPC receiver: the official SDK's gRPC exporters send real spans and
real GenAI log records to a real gRPC server; garbage, a missing token and a
client that never finishes sending are refused with nothing stored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from django.conf import settings as django_settings
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
    OTLPLogExporter as GrpcLogExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from controlplane.embedded_redis import free_local_port
from controlplane.services import api_token_issue
from runs.models import Run
from runs.otlp.grpc_server import (
    LOGS_SERVICE,
    TRACE_SERVICE,
    OtlpGrpcServer,
    otlp_grpc_server,
)
from tests.conftest import BASE_DIR, database_url_for_subprocess, wait_for
from tracing.models import RunEvent, Span, SpanLogMessage
from tracing.selectors import span_payloads

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 2.0  # seconds a call has to send its request


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpGrpcServer]:
    server = otlp_grpc_server(
        host="127.0.0.1", port=0, max_workers=2, max_concurrent_rpcs=4,
        deadline=DEADLINE,
    )  # fmt: skip
    yield server
    server.stop(grace=0)


@pytest.fixture
def secret(admin_user: Any, tenant: Any) -> str:
    return api_token_issue(tenant=tenant, user=admin_user).secret


def auth(secret: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {secret}"),)


def nothing_stored() -> bool:
    return not (
        Run.objects.exists()
        or Span.objects.exists()
        or RunEvent.objects.exists()
        or SpanLogMessage.objects.exists()
    )


def emit_chat_with_events(port: int, secret: str) -> str:
    """An agent whose OpenAI calls are instrumented the openai-v2 way: the chat
    span carries no content, its messages go out as GenAI log records (events)
    of the span, each exported at once, so they arrive before the span."""
    endpoint = f"127.0.0.1:{port}"
    resource = Resource.create({"service.name": "grpc-agent"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(
            GrpcSpanExporter(endpoint=endpoint, insecure=True, headers=auth(secret))
        )
    )
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        SimpleLogRecordProcessor(
            GrpcLogExporter(endpoint=endpoint, insecure=True, headers=auth(secret))
        )
    )
    tracer = tracer_provider.get_tracer("agent")
    events = logger_provider.get_logger("opentelemetry.instrumentation.openai_v2")
    system = {"gen_ai.system": "openai"}
    with tracer.start_as_current_span("invoke_agent grpc-agent") as root:
        with tracer.start_as_current_span(
            "chat gpt-4.1-mini",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "openai",
                "gen_ai.request.model": "gpt-4.1-mini",
                "gen_ai.usage.input_tokens": 42,
                "gen_ai.usage.output_tokens": 7,
            },
        ):
            events.emit(
                event_name="gen_ai.system.message",
                body={"content": "You are a support agent."},
                attributes=system,
            )
            events.emit(
                event_name="gen_ai.user.message",
                body={"content": "My key is sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"},
                attributes=system,
            )
            events.emit(
                event_name="gen_ai.assistant.message",
                body={
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "lookup_order",
                                "arguments": '{"order": "4821"}',
                            },
                        }
                    ]
                },
                attributes=system,
            )
            events.emit(
                event_name="gen_ai.tool.message",
                body={"content": '{"status": "shipped"}', "id": "call_1"},
                attributes=system,
            )
            events.emit(
                event_name="gen_ai.choice",
                body={
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "It shipped."},
                },
                attributes=system,
            )
        trace_id = f"{root.get_span_context().trace_id:032x}"
    tracer_provider.shutdown()
    logger_provider.shutdown()
    return trace_id


def test_the_official_grpc_exporters_store_the_run_and_the_messages_of_its_span(
    receiver: OtlpGrpcServer, secret: str, tenant: Any
) -> None:
    trace_id = emit_chat_with_events(receiver.port, secret)
    run = Run.objects.get(tenant=tenant, trace_id=trace_id)
    assert run.stop_reason == "external"
    assert run.agent.slug == "external-grpc-agent"
    assert (run.input_tokens, run.output_tokens) == (42, 7)
    spans = {span.name: span for span in Span.objects.filter(run=run)}
    assert set(spans) == {"invoke_agent grpc-agent", "chat gpt-4.1-mini"}
    chat = spans["chat gpt-4.1-mini"]
    assert chat.attributes["gen_ai.request.model"] == "gpt-4.1-mini"
    # The span named none; its gen_ai.choice event did.
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    # The events came first; the span took their messages when it arrived.
    assert chat.attributes["cp.ingest.payloads_from_logs"] == [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
    ]
    bodies = {
        key: json.loads(text)
        for key, text in span_payloads(tenant=tenant, span=chat).items()
    }
    assert bodies["gen_ai.input.messages"] == [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "My key is [REDACTED]"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "lookup_order",
                        "arguments": '{"order": "4821"}',
                    },
                }
            ],
        },
        {"role": "tool", "content": '{"status": "shipped"}', "tool_call_id": "call_1"},
    ]
    assert bodies["gen_ai.output.messages"] == [
        {"role": "assistant", "content": "It shipped.", "finish_reason": "stop",
         "index": 0}
    ]  # fmt: skip
    # The stream got the span with its payload references.
    ended = RunEvent.objects.filter(run=run, type="span.ended").order_by("seq")
    assert any(
        e.payload["span_id"] == chat.span_id
        and set(e.payload["payloads"]) == set(bodies)
        for e in ended
    )


def raw_call(port: int, service: str, body: bytes, metadata: Any = ()) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(
            f"/{service}/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        return bytes(export(body, metadata=metadata, timeout=30))


def valid_request() -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    span.span_id = bytes.fromhex("b7ad6b7169203331")
    span.name = "work"
    span.start_time_unix_nano = 1_700_000_000_000_000_000
    span.end_time_unix_nano = 1_700_000_001_000_000_000
    return bytes(request.SerializeToString())


@pytest.mark.parametrize("service", [TRACE_SERVICE, LOGS_SERVICE])
@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe\xfd not protobuf at all", b"\x0a\xff\xff\xff\xff\x0f\x01"],
    ids=["bytes", "truncated"],
)
def test_garbage_is_invalid_argument_and_nothing_is_stored(
    receiver: OtlpGrpcServer, secret: str, service: str, garbage: bytes
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        raw_call(receiver.port, service, garbage, auth(secret))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an OTLP protobuf request" in refused.value.details()
    assert nothing_stored()


def test_a_bad_value_is_invalid_argument_naming_it(
    receiver: OtlpGrpcServer, secret: str
) -> None:
    request = ExportTraceServiceRequest.FromString(valid_request())
    request.resource_spans[0].scope_spans[0].spans[0].name = "nul\x00name"
    with pytest.raises(grpc.RpcError) as refused:
        raw_call(
            receiver.port, TRACE_SERVICE, request.SerializeToString(), auth(secret)
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        refused.value.details()
        == "span b7ad6b7169203331: name contains a NUL character"
    )
    assert nothing_stored()


def test_calls_without_a_live_token_are_refused_and_nothing_is_stored(
    receiver: OtlpGrpcServer, tenant: Any, viewer_user: Any
) -> None:
    viewer = api_token_issue(tenant=tenant, user=viewer_user).secret
    for metadata, code in [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        (auth("cp_not-a-real-token"), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Basic dXNlcjpwdw=="),), grpc.StatusCode.UNAUTHENTICATED),
        (auth(viewer), grpc.StatusCode.PERMISSION_DENIED),
    ]:
        for service in (TRACE_SERVICE, LOGS_SERVICE):
            with pytest.raises(grpc.RpcError) as refused:
                raw_call(receiver.port, service, valid_request(), metadata)
            assert refused.value.code() == code, metadata
            assert "cp_not-a-real-token" not in refused.value.details()
    assert nothing_stored()


def test_the_official_exporter_without_a_token_stores_nothing(
    receiver: OtlpGrpcServer, tenant: Any
) -> None:
    provider = TracerProvider()
    exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{receiver.port}", insecure=True)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("agent").start_as_current_span("unsigned"):
        pass
    provider.shutdown()
    assert nothing_stored()


def test_a_client_that_never_finishes_sending_is_cut_and_frees_its_thread(
    receiver: OtlpGrpcServer, secret: str, tenant: Any
) -> None:
    """Two calls that open the stream and never send their request hold both of
    the receiver's threads until the deadline cuts them; then an export goes
    through."""
    release = threading.Event()

    def never_ends() -> Iterator[bytes]:
        release.wait(120)  # the server cuts the call long before
        yield b""

    with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
        stream = channel.stream_unary(
            f"/{TRACE_SERVICE}/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        calls = [stream.future(never_ends(), metadata=auth(secret)) for _ in range(2)]
        try:
            for call in calls:
                with pytest.raises(grpc.RpcError) as cut:
                    call.result(timeout=60)
                assert cut.value.code() == grpc.StatusCode.CANCELLED
        finally:
            release.set()
    assert nothing_stored()
    raw_call(receiver.port, TRACE_SERVICE, valid_request(), auth(secret))
    assert Run.objects.get(tenant=tenant).trace_id == "0af7651916cd43dd8448eb211c80319c"


def test_a_request_over_the_size_limit_is_refused_before_it_is_read(
    secret: str, settings: Any
) -> None:
    settings.OTLP_INGEST_MAX_BYTES = 4096
    server = otlp_grpc_server(host="127.0.0.1", port=0, deadline=DEADLINE)
    try:
        request = ExportTraceServiceRequest.FromString(valid_request())
        request.resource_spans[0].scope_spans[0].spans[0].name = "x" * 8192
        with pytest.raises(grpc.RpcError) as refused:
            raw_call(
                server.port, TRACE_SERVICE, request.SerializeToString(), auth(secret)
            )
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.stop(grace=0)
    assert nothing_stored()


def test_too_many_spans_is_invalid_argument_naming_the_limit(
    receiver: OtlpGrpcServer, secret: str, settings: Any
) -> None:
    settings.OTLP_INGEST_MAX_SPANS = 1
    request = ExportTraceServiceRequest.FromString(valid_request())
    extra = request.resource_spans[0].scope_spans[0].spans.add()
    extra.CopyFrom(request.resource_spans[0].scope_spans[0].spans[0])
    extra.span_id = bytes.fromhex("b7ad6b7169203332")
    with pytest.raises(grpc.RpcError) as refused:
        raw_call(
            receiver.port, TRACE_SERVICE, request.SerializeToString(), auth(secret)
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "OTLP_INGEST_MAX_SPANS=1" in refused.value.details()
    assert nothing_stored()


def test_the_command_serves_until_sigterm_and_stops_cleanly(
    secret: str, tenant: Any, tmp_path: Any
) -> None:
    """`manage.py otlp_grpc` (what make run and compose start) takes an export
    from the official exporter, then stops on SIGTERM with exit status 0."""
    port = free_local_port()
    environ = dict(os.environ)
    environ.update(
        DATABASE_URL=database_url_for_subprocess(),
        REDIS_URL=django_settings.REDIS_URL,
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "otlp.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "otlp_grpc", "--port", str(port)],
            cwd=BASE_DIR, env=environ, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(
            lambda: "listening on" in log.read_text() or process.poll() is not None,
            timeout=120,
            what="the receiver to listen",
        )
        assert process.poll() is None, log.read_text()
        assert f"OTLP/gRPC receiver listening on 127.0.0.1:{port}" in log.read_text()
        provider = TracerProvider(resource=Resource.create({"service.name": "cli"}))
        provider.add_span_processor(
            SimpleSpanProcessor(
                GrpcSpanExporter(
                    endpoint=f"127.0.0.1:{port}", insecure=True, headers=auth(secret)
                )
            )
        )
        with provider.get_tracer("cli").start_as_current_span("hello"):
            pass
        provider.shutdown()
        assert Run.objects.get(tenant=tenant).agent.slug == "external-cli"
        # Still serving a moment later (it does not stop by itself).
        assert process.poll() is None, log.read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, log.read_text()
    assert "OTLP/gRPC receiver stopped." in log.read_text()
