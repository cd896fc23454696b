"""The trace crosses into real Celery worker processes (configure_tracing after
fork, traceparent in the task)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runs.services import run_start
from runs.spans import root_span_id
from tracing.models import Span


@pytest.mark.django_db(transaction=True)
def test_spans_from_a_worker_process_form_the_runs_tree(
    scripted_agent: Any, celery_worker_process: Any
) -> None:
    agent = scripted_agent(
        [
            {"tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "a"}}]},
            {"text": "done"},
        ],
        ["echo"],
    )
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_terminal:
            break
        time.sleep(0.1)
    assert run.is_terminal, celery_worker_process.output()
    # The step and root spans end just after the run's last commit.
    while time.monotonic() < deadline:
        rows = list(Span.objects.filter(run=run).order_by("started_at", "id"))
        if rows and all(r.status != "running" for r in rows):
            break
        time.sleep(0.05)
    assert [r.name for r in rows] == [
        "invoke_agent scripted", "step 0", "chat scripted", "execute_tool echo",
        "step 1", "chat scripted",
    ]  # fmt: skip
    root = rows[0]
    assert root.span_id == f"{root_span_id(run):016x}"
    assert {r.trace_id for r in rows} == {run.trace_id}
    assert rows[1].parent_span_id == rows[4].parent_span_id == root.span_id
    assert all(r.status in ("ok", "unset", "error") for r in rows)
    # Stored by the worker process, not this one.
    assert {r.worker.split(":")[0] for r in rows if r.worker} and all(
        not r.worker.endswith(f":{__import__('os').getpid()}") for r in rows
    )


@pytest.mark.django_db(transaction=True)
def test_a_slow_model_call_shows_its_span_running_while_it_works(
    tenant: Any, celery_worker_process: Any
) -> None:
    """A call still running after TRACING_SLOW_CALL_MS has its span stored at
    once (from a timer thread); a fast one's start is stored with its end."""
    from tests.agents import make_agent
    from tests.engine.test_engine_openai_adapter import MODEL, FakeProvider, completion

    provider = FakeProvider()
    provider.thread.start()
    try:
        provider.push(200, completion(content="slow answer"), delay=3.0)
        make_agent(
            tenant, "slow", kind="openai", model=MODEL, base_url=provider.base_url
        )
        run = run_start(tenant=tenant, agent_slug="slow", input="hi", started_by=None)
        deadline = time.monotonic() + 20
        running = None
        while time.monotonic() < deadline and running is None:
            running = Span.objects.filter(
                run=run, name__startswith="chat ", status="running"
            ).first()
            time.sleep(0.05)
        assert running is not None, celery_worker_process.output()
        run.refresh_from_db()
        assert not run.is_terminal  # seen while the model was still working
        while time.monotonic() < deadline and not run.is_terminal:
            time.sleep(0.1)
            run.refresh_from_db()
        assert run.is_terminal, celery_worker_process.output()
        # The step's spans are stored just after the run's last commit.
        while time.monotonic() < deadline and running.status == "running":
            time.sleep(0.05)
            running.refresh_from_db()
        assert running.status != "running" and running.ended_at is not None
        assert len(provider.requests) == 1
        # One row for the call: its end completed the row stored early.
        assert Span.objects.filter(run=run, name__startswith="chat ").count() == 1
    finally:
        provider.server.shutdown()
        provider.server.server_close()


def _settled_spans(run: Any, worker: Any, timeout: float = 30) -> list[Span]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_terminal:
            break
        time.sleep(0.1)
    assert run.is_terminal, worker.output()
    while time.monotonic() < deadline:
        rows = list(Span.objects.filter(run=run).order_by("started_at", "id"))
        if rows and all(r.status != "running" for r in rows):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"spans still running:\n{worker.output()}")


@pytest.mark.django_db(transaction=True)
def test_fast_calls_in_a_worker_keep_their_output_tokens_and_results(
    scripted_agent: Any, celery_worker_process: Any
) -> None:
    """A model that answers at once and a tool that returns at once: their spans
    are stored whole (start and end in one write) and keep what their end set."""
    from tracing.models import RunEvent, SpanPayload

    agent = scripted_agent(
        [
            {
                "text": "echoing",
                "tool_calls": [
                    {"id": "c1", "name": "echo", "arguments": {"text": "kettle"}}
                ],
                "usage": {"input_tokens": 412, "output_tokens": 31},
                "model": "scripted-2026",
            },
            {"text": "all done", "usage": {"input_tokens": 500, "output_tokens": 7}},
        ],
        ["echo"],
        default_limits={"max_steps": 10, "max_tool_calls": 5},
    )
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    rows = _settled_spans(run, celery_worker_process)
    by_name: dict[str, list[Span]] = {}
    for row in rows:
        by_name.setdefault(row.name.split(" ")[0], []).append(row)
    chats, tools, steps = by_name["chat"], by_name["execute_tool"], by_name["step"]
    assert len(chats) == 2 and len(tools) == 1 and len(steps) == 2

    def body(row: Span, key: str) -> Any:
        import json

        digest = row.payloads[key]
        payload = SpanPayload.objects.get(tenant_id=run.tenant_id, sha256=digest)
        return json.loads(payload.content)

    expected = [(412, 31, "scripted-2026", "echoing"), (500, 7, "scripted", "all done")]
    for chat, (tokens_in, tokens_out, model, text) in zip(chats, expected, strict=True):
        assert chat.attributes["gen_ai.usage.input_tokens"] == tokens_in
        assert chat.attributes["gen_ai.usage.output_tokens"] == tokens_out
        assert chat.attributes["gen_ai.response.model"] == model
        assert chat.attributes["gen_ai.response.finish_reasons"]
        assert body(chat, "gen_ai.output.messages")[0]["content"] == text
        assert "gen_ai.input.messages" in chat.payloads  # the start's are kept
    tool = tools[0]
    assert tool.attributes["cp.tool.executed"] is True
    result = body(tool, "gen_ai.tool.call.result")
    assert result["ok"] is True and result["data"] == {"text": "kettle"}
    assert body(tool, "gen_ai.tool.call.arguments") == {"text": "kettle"}
    for index, step in enumerate(steps):
        assert step.attributes["cp.step.index"] == index
        assert step.attributes["cp.run.status"] == ("running", "unverified")[index]
        assert step.attributes["cp.budget.remaining.steps"] == 10 - (index + 1)
        assert step.attributes["cp.budget.remaining.tool_calls"] == 4
    # What the stream and its replay carry is the same as the rows.
    ended = {
        e.payload["span_id"]: e.payload
        for e in RunEvent.objects.filter(run_id=run.id, type="span.ended")
    }
    for row in [*chats, *tools, *steps]:
        assert ended[row.span_id]["attributes"] == row.attributes
        assert ended[row.span_id]["payloads"] == row.payloads
