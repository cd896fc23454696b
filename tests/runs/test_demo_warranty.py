"""`seed_demo --with-mcp` defines the demo's second agent through the API (an
OpenAI-compatible endpoint served by the local scripted model, an MCP stdio server
in the sandbox), and a run of it goes end to end through a real Celery worker: the
MCP tool's output in its tool span, the model's streamed answer in the chat span,
judged passed. Re-seeding changes nothing."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from controlplane.celery import app as celery_app
from controlplane.models import ApiToken, AuditEvent
from runs.demo_warranty import (
    DEMO_ENDPOINT_SLUG,
    DEMO_MCP_SLUG,
    DEMO_WARRANTY_AGENT_SLUG,
)
from runs.devserver import ChatCompletionsServer
from runs.devserver.demo import DEMO_WARRANTY_INPUT, DEMO_WARRANTY_SCRIPT
from runs.models import Agent, AgentVersion, McpServer, ModelEndpoint, Run, ToolCall
from tests.conftest import wait_for
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def demo_model() -> Iterator[ChatCompletionsServer]:
    """The demo's model, as `python -m runs.devserver --demo` serves it."""
    assert shutil.which("bwrap"), "the MCP stdio server runs in the sandbox"
    with ChatCompletionsServer(script=DEMO_WARRANTY_SCRIPT, chunk_delay=0.01) as server:
        yield server


def seed(model: ChatCompletionsServer, settings: Any) -> None:
    settings.DEMO_PASSWORD = "demo-pass-4821"
    call_command("seed_demo", "--with-mcp", "--model-url", model.base_url)


def wait_settled(run_id: Any, timeout: float = 90) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} still {run.status} after {timeout} s")


def test_the_api_defined_agent_runs_end_to_end_on_a_worker(
    demo_model, settings, celery_worker_process, api_client_for
):
    seed(demo_model, settings)
    agent = Agent.objects.get(slug=DEMO_WARRANTY_AGENT_SLUG)
    version = agent.current_version
    assert version.endpoint.kind == "openai"
    assert version.endpoint.base_url == demo_model.base_url
    assert version.tools == ["lookup_order", f"mcp:{DEMO_MCP_SLUG}/warranty_lookup"]
    # Made through the API by the demo admin: audited as such, the token gone.
    for action in ("mcp_server.create", "model_endpoint.create", "agent.create"):
        by_admin = AuditEvent.objects.filter(action=action, actor__username="admin")
        assert by_admin.exists(), action
    assert not ApiToken.objects.filter(revoked_at__isnull=True).exists()

    operator = agent.tenant.memberships.get(user__username="operator").user
    api = api_client_for(operator, agent.tenant)
    started = api.post(
        "/api/v1/runs/",
        {"agent": DEMO_WARRANTY_AGENT_SLUG, "input": DEMO_WARRANTY_INPUT},
        format="json",
    )
    assert started.status_code == 201, started.content
    run = wait_settled(started.json()["id"])

    assert run.status == Run.Status.SUCCEEDED, (run.stop_reason, run.stop_detail)
    assert run.evaluation["verdict"] == "passed", run.evaluation
    assert "18 more months" in run.final_answer
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run=run)}
    warranty = calls["warranty_warranty_lookup"]
    assert warranty.status == "succeeded", warranty.result
    assert warranty.result["data"]["structured"]["months_left"] == 18
    assert calls["lookup_order"].status == "succeeded"
    # The model was asked to stream, and was sent what the tools returned.
    assert all(r["body"].get("stream") for r in demo_model.requests)
    assert "months_left" in json.dumps(demo_model.requests[-1]["body"]["messages"])

    # The step's spans are stored when its task ends, just after the run settles.
    wait_for(
        lambda: not Span.objects.filter(run=run, ended_at__isnull=True).exists(),
        what="every span of the run ended",
    )
    spans = run_spans_with_payloads(tenant=run.tenant, run_id=run.id)
    tool_span = next(
        (s, p) for s, p in spans if s.name == "execute_tool warranty_warranty_lookup"
    )
    tool_text = json.dumps(tool_span[0].attributes) + json.dumps(tool_span[1])
    assert "months_left" in tool_text and "18" in tool_text
    chats = [(s, p) for s, p in spans if s.name.startswith("chat ")]
    assert len(chats) == 2
    last_chat, payloads = chats[-1]
    output = json.loads(payloads["gen_ai.output.messages"])
    assert "18 more months" in output[0]["content"]
    assert last_chat.attributes.get("cp.model.live_messages", 0) >= 1  # streamed


def test_reseeding_changes_nothing_and_a_moved_model_url_is_patched_in_place(
    demo_model, settings
):
    seed(demo_model, settings)
    counts = (
        AgentVersion.objects.count(),
        McpServer.objects.count(),
        ModelEndpoint.objects.count(),
    )
    audited = AuditEvent.objects.exclude(action__startswith="api_token.").count()

    seed(demo_model, settings)
    assert (
        AgentVersion.objects.count(),
        McpServer.objects.count(),
        ModelEndpoint.objects.count(),
    ) == counts
    assert AuditEvent.objects.exclude(action__startswith="api_token.").count() == (
        audited
    )

    call_command("seed_demo", "--with-mcp", "--model-url", "http://127.0.0.1:9/v1")
    endpoint = ModelEndpoint.objects.get(slug=DEMO_ENDPOINT_SLUG)
    assert endpoint.base_url == "http://127.0.0.1:9/v1"
    assert AgentVersion.objects.count() == counts[0]  # not a new version


def test_with_no_redis_the_seed_says_so_and_defines_nothing(settings, monkeypatch):
    settings.DEMO_PASSWORD = "demo-pass-4821"
    monkeypatch.setattr(celery_app.conf, "broker_url", "redis://127.0.0.1:9/0")
    with pytest.raises(CommandError, match="no Redis at redis://127.0.0.1:9/0"):
        call_command("seed_demo", "--with-mcp")
    assert not McpServer.objects.exists()
    assert not Agent.objects.filter(slug=DEMO_WARRANTY_AGENT_SLUG).exists()
