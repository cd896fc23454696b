"""Spans of real runs: names, parents, GenAI attributes, payloads, redaction,
export, and spans of a dead worker becoming abandoned."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from runs.services import run_start
from runs.spans import root_span_id, traceparent_for
from tracing.models import RunEvent, Span, SpanPayload
from tracing.processor import RedactingSpanExporter
from tracing.selectors import span_payloads
from tracing.setup import configure_tracing, tracer
from tracing.store import spans_abandon_expired

SECRETS = [
    "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX",
    "cp_0123456789abcdefghij",
    "AKIAABCDEFGHIJKLMNOP",
    "hunter2-db-password",
]
ARGS_WITH_SECRETS = (
    f"use {SECRETS[0]} and token {SECRETS[1]} with {SECRETS[2]}; "
    f"db postgres://app:{SECRETS[3]}@db.internal/shop; "
    "Authorization: Bearer abcdefghijklmnopqrstuvwxyz"
)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """What an OTLP exporter would receive: the redacting wrapper in front."""
    memory = InMemorySpanExporter()
    configure_tracing(
        extra_processors=[SimpleSpanProcessor(RedactingSpanExporter(memory))],
        force=True,
    )
    yield memory
    configure_tracing(force=True)


def assert_has(attributes: dict[str, Any], expected: dict[str, Any]) -> None:
    assert {key: attributes.get(key) for key in expected} == expected


def test_a_run_is_one_trace_of_named_nested_spans_with_genai_attributes(
    scripted_agent: Any, drive_run: Any, exported: InMemorySpanExporter
) -> None:
    agent = scripted_agent(
        [
            {
                "tool_calls": [
                    {"id": "c1", "name": "echo", "arguments": {"text": "x"}}
                ],
                "usage": {"input_tokens": 11, "output_tokens": 3},
            },
            {"text": "done", "usage": {"input_tokens": 20, "output_tokens": 2}},
        ],
        ["echo"],
    )
    run = drive_run(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
        )
    )
    rows = list(Span.objects.filter(run=run).order_by("started_at", "id"))
    names = [row.name for row in rows]
    assert names == [
        "invoke_agent scripted",
        "step 0",
        "chat scripted",
        "execute_tool echo",
        "step 1",
        "chat scripted",
    ]
    root, step0, chat0, tool, step1, chat1 = rows
    assert {row.trace_id for row in rows} == {run.trace_id}
    assert root.span_id == f"{root_span_id(run):016x}" and root.parent_span_id == ""
    assert step0.parent_span_id == step1.parent_span_id == root.span_id
    assert chat0.parent_span_id == tool.parent_span_id == step0.span_id
    assert chat1.parent_span_id == step1.span_id
    assert all(row.status != Span.Status.RUNNING for row in rows)
    assert_has(
        chat0.attributes,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "scripted",
            "gen_ai.request.model": "scripted",
            "gen_ai.usage.input_tokens": 11,
            "gen_ai.usage.output_tokens": 3,
            "gen_ai.response.finish_reasons": ["tool_calls"],
            "gen_ai.agent.name": "scripted",
        },
    )
    assert_has(
        tool.attributes,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "echo",
            "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.type": "function",
        },
    )
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "scripted"
    assert root.attributes["cp.run.status"] == run.status
    assert root.attributes["gen_ai.usage.input_tokens"] == 31
    assert "cp.budget.remaining.steps" in step1.attributes
    payloads = span_payloads(tenant=run.tenant, span=tool)
    assert json.loads(payloads["gen_ai.tool.call.arguments"]) == {"text": "x"}
    assert json.loads(payloads["gen_ai.tool.call.result"])["data"] == {"text": "x"}
    assert "gen_ai.input.messages" in span_payloads(tenant=run.tenant, span=chat0)

    # Every span was logged at start and at end, in seq order.
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    started = [e.payload["span_id"] for e in events if e.type == "span.started"]
    ended = [e.payload["span_id"] for e in events if e.type == "span.ended"]
    assert sorted(started) == sorted(ended) == sorted(row.span_id for row in rows)

    # The exporter saw the same tree, each span once, the root last.
    finished = exported.get_finished_spans()
    assert sorted(s.name for s in finished) == sorted(names)
    by_name = {s.name: s for s in finished}
    exported_root = by_name["invoke_agent scripted"]
    assert exported_root.context.span_id == root_span_id(run)
    assert f"{exported_root.context.trace_id:032x}" == run.trace_id
    assert by_name["execute_tool echo"].parent.span_id == int(step0.span_id, 16)


def test_secrets_never_reach_the_database_the_log_or_the_exporter(
    scripted_agent: Any, drive_run: Any, exported: InMemorySpanExporter
) -> None:
    agent = scripted_agent(
        [
            {
                "tool_calls": [
                    {
                        "id": "c1",
                        "name": "echo",
                        "arguments": {"text": ARGS_WITH_SECRETS},
                    }
                ]
            },
            {"text": f"here you go: {SECRETS[0]}"},
        ],
        ["echo"],
    )
    run = drive_run(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
        )
    )
    with tracer().start_as_current_span(
        "custom",
        attributes={
            "cp.run.id": str(run.id),
            "cp.tenant.id": str(run.tenant_id),
            "db.password": "plain-text-pass",
            "http.request.header.authorization": "anything at all",
        },
    ):
        pass
    stored = json.dumps(
        [
            list(Span.objects.filter(run=run).values()),
            list(RunEvent.objects.filter(run=run).values("payload")),
            list(SpanPayload.objects.filter(tenant=run.tenant).values("content")),
        ],
        default=str,
    )
    for secret in [*SECRETS, "plain-text-pass", "anything at all", "abcdefghijklmnop"]:
        assert secret not in stored
        for span in exported.get_finished_spans():
            assert secret not in json.dumps(dict(span.attributes or {}))
    assert "[REDACTED]" in stored
    custom = Span.objects.get(run=run, name="custom")
    assert custom.attributes["db.password"] == "[REDACTED]"
    # What is not secret is kept: the user and host of the URL.
    assert "postgres://app:[REDACTED]@db.internal/shop" in stored


def test_a_payload_over_one_megabyte_is_stored_whole_and_once(
    scripted_agent: Any, drive_run: Any
) -> None:
    big = "y" * 1_300_000
    agent = scripted_agent([{"text": big}], [])
    run = drive_run(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
        )
    )
    chat = Span.objects.get(run=run, name="chat scripted")
    output = json.loads(
        span_payloads(tenant=run.tenant, span=chat)["gen_ai.output.messages"]
    )
    assert output[0]["content"] == big
    # The root's output is the same final answer: stored once, referenced twice.
    root = Span.objects.get(run=run, name="invoke_agent scripted")
    assert (
        root.payloads["gen_ai.output.messages"]
        == chat.payloads["gen_ai.output.messages"]
    )
    assert (
        SpanPayload.objects.filter(
            tenant=run.tenant, sha256=chat.payloads["gen_ai.output.messages"]
        ).count()
        == 1
    )
    # Events carry the reference only, never the body.
    assert all(
        len(json.dumps(e.payload)) < 10_000 for e in RunEvent.objects.filter(run=run)
    )


def test_the_span_of_a_worker_that_died_becomes_abandoned(
    scripted_agent: Any, drive_run: Any
) -> None:
    agent = scripted_agent([{"text": "ok"}], [])
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    # A worker started a step span and died: the span was stored at start and
    # never ended.
    from runs.spans import _context_from_traceparent

    tracer().start_span(
        "step 0",
        context=_context_from_traceparent(traceparent_for(run)),
        attributes={"cp.run.id": str(run.id), "cp.tenant.id": str(run.tenant_id)},
    )
    orphan = Span.objects.get(run=run, name="step 0")
    assert orphan.status == Span.Status.RUNNING and orphan.lease_expires_at
    assert spans_abandon_expired() == 0  # its lease still runs
    Span.objects.filter(id=orphan.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert spans_abandon_expired() == 1
    orphan.refresh_from_db()
    assert orphan.status == Span.Status.ABANDONED and orphan.ended_at is not None
    event = RunEvent.objects.filter(run=run).order_by("-seq").first()
    assert event is not None and event.type == "span.abandoned"
    assert event.payload["span_id"] == orphan.span_id
    # The run's recovery takes over: the next step runs and the run completes.
    run = drive_run(run)
    assert run.is_terminal
    assert Span.objects.filter(run=run, status=Span.Status.RUNNING).count() == 0


def test_a_running_span_of_the_previous_lease_holder_is_abandoned_by_the_next_step(
    scripted_agent: Any, drive_run: Any
) -> None:
    agent = scripted_agent([{"text": "ok"}], [])
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    from runs.spans import _context_from_traceparent

    tracer().start_span(
        "execute_tool slow",
        context=_context_from_traceparent(traceparent_for(run)),
        attributes={"cp.run.id": str(run.id), "cp.tenant.id": str(run.tenant_id)},
    )
    drive_run(run)
    orphan = Span.objects.get(run=run, name="execute_tool slow")
    assert orphan.status == Span.Status.ABANDONED


def test_the_root_span_ends_in_its_stored_row_with_one_write(
    scripted_agent: Any, drive_run: Any
) -> None:
    """Ending the run's root starts it again with its ids only to end it: the
    row it was stored with at the run's start is completed, and the restart
    itself writes nothing (no second start, no payloads of its own)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.models import Run
    from runs.spans import run_root_end

    agent = scripted_agent([{"text": "done"}], [])
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    # The run's end, but for its root span (as a finisher that died left it).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("runs.spans.run_root_end", lambda run: None)
        run = drive_run(run)
    root_id = f"{root_span_id(run):016x}"
    assert Span.objects.get(run=run, span_id=root_id).status == Span.Status.RUNNING
    with CaptureQueriesContext(connection) as queries:
        run_root_end(Run.objects.get(pk=run.pk))
    root = Span.objects.get(run=run, span_id=root_id)
    assert root.status != Span.Status.RUNNING and root.ended_at is not None
    assert root.attributes["cp.run.status"] == run.status
    events = RunEvent.objects.filter(run=run, payload__span_id=root_id)
    assert sorted(events.values_list("type", flat=True)) == [
        "span.ended",
        "span.started",
    ]
    payload_inserts = [q for q in queries if 'INTO "tracing_spanpayload"' in q["sql"]]
    assert len(payload_inserts) == 1  # the end's; the restart wrote none


def test_step_zero_taken_again_keeps_one_root_row_and_one_start_event(
    scripted_agent: Any,
) -> None:
    """The root is stored by the run's first step without a look first; a step
    that runs step 0 again (after a crash) finds its row and logs no second start."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.spans import step_span

    agent = scripted_agent([{"text": "done"}], [])
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    root_id = f"{root_span_id(run):016x}"
    with CaptureQueriesContext(connection) as first, step_span(run):
        pass
    with step_span(run):  # step 0 again, the root already stored
        pass
    assert Span.objects.filter(run=run, span_id=root_id).count() == 1
    started = RunEvent.objects.filter(
        run=run, type="span.started", payload__span_id=root_id
    )
    assert started.count() == 1
    by_root_id = f""""tracing_span"."span_id" = '{root_id}'"""
    root_reads = [
        q for q in first if q["sql"].startswith("SELECT") and by_root_id in q["sql"]
    ]
    assert len(root_reads) == 1  # the store's get_or_create, no look before it
