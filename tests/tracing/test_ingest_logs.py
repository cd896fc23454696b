"""POST /v1/logs: GenAI events (log records of a span) become the span's model
input and output, whether they arrive before or after it; everything else about
the door is /v1/traces': token, limits, answers, nothing half-stored."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.test import Client
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from controlplane.models import AuditEvent
from controlplane.services import api_token_issue
from runs.models import Run
from runs.services import run_start
from tests.tracing.test_ingest import otlp_json
from tracing.ingest import log_messages_expire
from tracing.models import RunEvent, Span, SpanLogMessage
from tracing.selectors import span_payloads

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = f"{1:016x}"  # otlp_json's first span


@pytest.fixture
def native_run(scripted_agent: Any, drive_run: Any) -> Run:
    """A finished native run of kettlecraft with its spans."""
    agent = scripted_agent([{"text": "done"}], [])
    return drive_run(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
        )
    )


@pytest.fixture
def secret(admin_user: Any, tenant: Any) -> str:
    return api_token_issue(tenant=tenant, user=admin_user).secret


def bodies(tenant: Any, span: Span) -> dict[str, Any]:
    return {
        key: json.loads(text)
        for key, text in span_payloads(tenant=tenant, span=span).items()
    }


def record(
    event: str, body: Any = None, *, trace: str = TRACE, span: str = SPAN, **extra: Any
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "timeUnixNano": str(1_700_000_000_500_000_000 + extra.pop("offset", 0)),
        "traceId": trace,
        "spanId": span,
        "eventName": event,
        "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}}],
    }
    if body is not None:
        value["body"] = body
    value.update(extra)
    return value


def kv(**fields: str) -> dict[str, Any]:
    return {
        "kvlistValue": {
            "values": [
                {"key": key, "value": {"stringValue": text}}
                for key, text in fields.items()
            ]
        }
    }


def logs_json(*records: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "resourceLogs": [
                {
                    "resource": {"attributes": []},
                    "scopeLogs": [{"logRecords": list(records)}],
                }
            ]
        }
    ).encode()


def post_logs(body: bytes, *, secret: str | None, **extra: Any) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
    content_type = extra.pop("content_type", "application/json")
    return Client().post(
        "/v1/logs", body, content_type=content_type, **headers, **extra
    )


def post_traces(body: bytes, *, secret: str) -> Any:
    return Client().post(
        "/v1/traces", body, content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )  # fmt: skip


def nothing_stored() -> bool:
    return not (
        Run.objects.exists() or Span.objects.exists() or SpanLogMessage.objects.exists()
    )


@pytest.mark.django_db(transaction=True)
def test_the_official_http_exporters_put_a_details_event_on_its_span_after_it(
    live_server: Any, secret: str, tenant: Any
) -> None:
    """The newer GenAI convention: one `gen_ai.client.inference.operation.details`
    record with the messages as structured attributes, exported after the span
    (a batch processor flushed later), lands on the stored span."""
    headers = {"Authorization": f"Bearer {secret}"}
    resource = Resource.create({"service.name": "http-agent"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces", headers=headers)
        )
    )
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(
            OTLPLogExporter(endpoint=f"{live_server.url}/v1/logs", headers=headers),
            schedule_delay_millis=60_000,  # held until the flush below
        )
    )
    tracer = tracer_provider.get_tracer("agent")
    events = logger_provider.get_logger("opentelemetry.util.genai")
    with tracer.start_as_current_span(
        "chat gpt-4.1", attributes={"gen_ai.operation.name": "chat"}
    ) as chat:
        events.emit(
            event_name="gen_ai.client.inference.operation.details",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.system_instructions": json.dumps(
                    [{"type": "text", "content": "Be brief."}]
                ),
                "gen_ai.input.messages": json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": "Hi"}]}]
                ),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [{"type": "text", "content": "Hello."}],
                            "finish_reason": "stop",
                        }
                    ]
                ),
            },
        )
        trace_id = f"{chat.get_span_context().trace_id:032x}"
    tracer_provider.shutdown()
    span = Span.objects.get(run__tenant=tenant, trace_id=trace_id)
    assert span.payloads == {}  # the span came first, with no content
    events_before = RunEvent.objects.filter(run=span.run).count()
    logger_provider.shutdown()  # flushes the held record
    span.refresh_from_db()
    assert span.attributes["cp.ingest.payloads_from_logs"] == [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
    ]
    assert span.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert bodies(tenant, span) == {
        "gen_ai.system_instructions": [{"type": "text", "content": "Be brief."}],
        "gen_ai.input.messages": [
            {"role": "user", "parts": [{"type": "text", "content": "Hi"}]}
        ],
        "gen_ai.output.messages": [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "Hello."}],
                "finish_reason": "stop",
            }
        ],
    }
    # The live stream hears of it: one more event for the span.
    last = RunEvent.objects.filter(run=span.run).order_by("-seq").first()
    assert last is not None and last.seq == events_before + 1
    assert last.payload["span_id"] == span.span_id
    assert set(last.payload["payloads"]) == set(span.payloads)


@pytest.mark.django_db
def test_events_before_their_span_wait_for_it_and_other_records_are_refused(
    secret: str, tenant: Any
) -> None:
    response = post_logs(
        logs_json(
            record("gen_ai.user.message", kv(content="Where is 4821?")),
            record("app.log", {"stringValue": "GET /orders 200"}),
            record(
                "gen_ai.choice",
                {
                    "kvlistValue": {
                        "values": [
                            {"key": "index", "value": {"intValue": "0"}},
                            {"key": "finish_reason", "value": {"stringValue": "stop"}},
                            {"key": "message", "value": kv(content="Tomorrow.")},
                        ]
                    }
                },
                offset=1,
            ),  # fmt: skip
            # The same event name without a span: nothing to attach it to.
            record("gen_ai.user.message", kv(content="orphan"), span=""),
        ),
        secret=secret,
    )
    assert response.status_code == 200, response.content
    partial = response.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "2"
    assert "2 log record(s) are not GenAI events of a span" in partial["errorMessage"]
    assert not Run.objects.exists()  # waiting for the trace, no run yet
    assert SpanLogMessage.objects.filter(tenant=tenant, run=None).count() == 2
    assert (
        post_traces(json.dumps(otlp_json(2)).encode(), secret=secret).status_code == 200
    )
    span = Span.objects.get(run__tenant=tenant, span_id=SPAN)
    assert bodies(tenant, span) == {
        "gen_ai.input.messages": [{"role": "user", "content": "Where is 4821?"}],
        "gen_ai.output.messages": [
            {"role": "assistant", "content": "Tomorrow.", "finish_reason": "stop",
             "index": 0}
        ],
    }  # fmt: skip
    assert not SpanLogMessage.objects.filter(run=None).exists()
    # An exporter's retry of the span keeps what the events gave it.
    assert (
        post_traces(json.dumps(otlp_json(2)).encode(), secret=secret).status_code == 200
    )
    span.refresh_from_db()
    assert set(bodies(tenant, span)) == {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
    }
    # The second span of the trace got nothing.
    assert Span.objects.get(run__tenant=tenant, span_id=f"{2:016x}").payloads == {}


@pytest.mark.django_db
def test_content_the_span_carries_itself_wins_over_events(
    secret: str, tenant: Any
) -> None:
    spans = otlp_json(1)
    spans["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(
        {"key": "gen_ai.input.messages",
         "value": {"stringValue": json.dumps([{"role": "user", "content": "own"}])}}
    )  # fmt: skip
    assert post_traces(json.dumps(spans).encode(), secret=secret).status_code == 200
    response = post_logs(
        logs_json(record("gen_ai.user.message", kv(content="from an event"))),
        secret=secret,
    )
    assert response.status_code == 200 and response.json() == {}
    span = Span.objects.get(run__tenant=tenant, span_id=SPAN)
    assert bodies(tenant, span) == {
        "gen_ai.input.messages": [{"role": "user", "content": "own"}]
    }


@pytest.mark.django_db
def test_secrets_in_event_bodies_are_redacted_before_they_are_kept(
    secret: str, tenant: Any
) -> None:
    assert (
        post_traces(json.dumps(otlp_json(1)).encode(), secret=secret).status_code == 200
    )
    body = kv(content="use sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX", api_key="hunter2-value")
    assert (
        post_logs(
            logs_json(record("gen_ai.user.message", body)), secret=secret
        ).status_code
        == 200
    )
    stored = json.dumps(list(SpanLogMessage.objects.values_list("content", flat=True)))
    assert "sk-proj-ABCD" not in stored and "hunter2-value" not in stored
    span = Span.objects.get(run__tenant=tenant, span_id=SPAN)
    assert bodies(tenant, span)["gen_ai.input.messages"] == [
        {"role": "user", "content": "use [REDACTED]", "api_key": "[REDACTED]"}
    ]


@pytest.mark.django_db
def test_another_tenants_events_never_reach_this_tenants_span(
    secret: str, tenant: Any, other_tenant: Any, make_member: Any
) -> None:
    assert (
        post_traces(json.dumps(otlp_json(1)).encode(), secret=secret).status_code == 200
    )
    rival = make_member(other_tenant, "rival", "admin")
    rival_secret = api_token_issue(tenant=other_tenant, user=rival).secret
    response = post_logs(
        logs_json(record("gen_ai.user.message", kv(content="injected"))),
        secret=rival_secret,
    )
    assert response.status_code == 200
    span = Span.objects.get(run__tenant=tenant, span_id=SPAN)
    assert span.payloads == {}
    # The rival's record waits for a trace of the rival's own.
    kept = SpanLogMessage.objects.get()
    assert kept.tenant_id == other_tenant.id and kept.run_id is None


@pytest.mark.django_db(transaction=True)
def test_events_of_a_native_runs_trace_are_refused_and_audited(
    native_run: Run, secret: str, tenant: Any, admin_user: Any
) -> None:
    root = Span.objects.get(run=native_run, parent_span_id="")
    before = list(Span.objects.filter(run=native_run).order_by("pk").values())
    response = post_logs(
        logs_json(
            record("gen_ai.user.message", kv(content="forged"),
                   trace=native_run.trace_id, span=root.span_id)
        ),
        secret=secret,
    )  # fmt: skip
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "1"
    assert native_run.trace_id in partial["errorMessage"]
    assert list(Span.objects.filter(run=native_run).order_by("pk").values()) == before
    assert not SpanLogMessage.objects.exists()
    audit = AuditEvent.objects.get(tenant=tenant, action="otlp.logs_rejected")
    assert audit.actor == admin_user and audit.object_id == str(native_run.id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "content_type", "status", "words"),
    [
        (b"\xff\x00 garbage", "application/x-protobuf", 400, "not an OTLP protobuf"),
        (b"{not json", "application/json", 400, "not JSON"),
        (logs_json(record("gen_ai.user.message", trace="zz")), "application/json",
         400, "log record 0: traceId is neither hex nor base64"),
        (logs_json(record("gen_ai.user.message", {"stringValue": "a\u0000b"})),
         "application/json", 400, "log record 0: body contains a NUL character"),
        (logs_json(record("x", timeUnixNano="-1")), "application/json", 400,
         "log record 0: timeUnixNano is out of range"),
        (b"{}", "text/plain", 415, "Content-Type"),
    ],
    ids=["protobuf", "json", "trace-id", "nul", "time", "content-type"],
)  # fmt: skip
def test_bad_bodies_are_refused_naming_the_problem_and_nothing_is_stored(
    secret: str, body: bytes, content_type: str, status: int, words: str
) -> None:
    response = post_logs(body, secret=secret, content_type=content_type)
    assert response.status_code == status, response.content
    assert words in response.json()["error"]["message"]
    assert nothing_stored()


@pytest.mark.django_db
def test_the_door_and_limits_are_those_of_v1_traces(
    secret: str, tenant: Any, viewer_user: Any, settings: Any
) -> None:
    body = logs_json(record("gen_ai.user.message", kv(content="hi")))
    assert post_logs(body, secret=None).status_code == 401
    assert post_logs(body, secret="cp_not-a-real-token").status_code == 401
    viewer = api_token_issue(tenant=tenant, user=viewer_user).secret
    assert post_logs(body, secret=viewer).status_code == 403
    settings.OTLP_INGEST_MAX_LOG_RECORDS = 1
    two = logs_json(record("gen_ai.user.message"), record("gen_ai.choice"))
    response = post_logs(two, secret=secret)
    assert response.status_code == 413
    assert "OTLP_INGEST_MAX_LOG_RECORDS=1" in response.json()["error"]["message"]
    settings.OTLP_INGEST_MAX_BYTES = 1024
    response = post_logs(logs_json(record("x", kv(content="y" * 2000))), secret=secret)
    assert response.status_code == 413
    assert nothing_stored()


@pytest.mark.django_db
def test_messages_whose_trace_never_came_are_dropped_after_a_while(
    secret: str, tenant: Any
) -> None:
    post_logs(logs_json(record("gen_ai.user.message", kv(content="a"))), secret=secret)
    post_traces(json.dumps(otlp_json(1, trace_id="ab" * 16)).encode(), secret=secret)
    post_logs(
        logs_json(record("gen_ai.user.message", kv(content="b"), trace="ab" * 16)),
        secret=secret,
    )
    assert log_messages_expire(older_than=dt.timedelta(hours=1)) == 0
    assert log_messages_expire(older_than=dt.timedelta(0)) == 1
    # The one kept belongs to its run (and goes with it).
    assert SpanLogMessage.objects.get().run == Run.objects.get(trace_id="ab" * 16)
