"""The trace crosses into real Celery worker processes (configure_tracing after
fork, traceparent in the task)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from runs.services import run_start
from tracing.models import Span
from tracing.spans import root_span_id


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


@pytest.fixture
def model_key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """An API key variable the worker started next inherits."""
    monkeypatch.setenv("CP_TEST_MODEL_KEY", "test-key")
    return "CP_TEST_MODEL_KEY"


@pytest.mark.django_db(transaction=True)
def test_a_slow_model_call_shows_its_span_running_while_it_works(
    tenant: Any, model_key_env: str, celery_worker_process: Any
) -> None:
    """A call still running after TRACING_SLOW_CALL_MS has its span stored at
    once (from a timer thread); a fast one's start is stored with its end."""
    from runs.models import Agent
    from tests.engine.test_engine_openai_adapter import MODEL, FakeProvider, completion

    provider = FakeProvider()
    provider.thread.start()
    try:
        provider.push(200, completion(content="slow answer"), delay=3.0)
        Agent.objects.create(
            tenant=tenant, slug="slow", name="slow", model_adapter="openai",
            model=MODEL, base_url=provider.base_url, api_key_env=model_key_env,
            tool_names=[],
        )  # fmt: skip
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
