"""An MCP server's elicitation becomes a question to a person (issue 28 item 4):
a real MCP server (the SDK's, over streamable HTTP) asks during a tool call; the
run waits in `waiting_input` holding no worker; once a person answers, the call
is run again and the server's elicitation is given the answer (accepted with
that content), so the server completes the call. A real Celery worker runs the
steps; the model is the scripted adapter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel

from approvals.models import ApprovalRequest, Question
from budgets.quotas import tool_quota_used
from runs.models import McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide
from runs.services.mcp import mcp_server_register, mcp_tool_configure
from tests.conftest import WorkerProcess, start_worker, wait_for
from tests.runs.mcp_servers import HttpMcpServer

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


class Confirm(BaseModel):
    confirm: bool


def ask_confirm(path: str, text: str) -> Elicit[Confirm]:
    """The server's question to the user, before it writes."""
    return Elicit(f"Write {len(text)} bytes to {path}?", Confirm)


class Notes:
    """A server whose write tool asks the user first, and counts what it wrote."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str]] = []
        self.server = MCPServer("notes", log_level="WARNING")

        def write_note(
            path: str, text: str, answer: Annotated[Confirm, Resolve(ask_confirm)]
        ) -> dict[str, Any]:
            if not answer.confirm:
                return {"written": None}
            self.written.append((path, text))
            return {"written": path}

        self.server.add_tool(write_note, description="Write a note to a file.")


@pytest.fixture
def notes(tenant: Any, admin_user: Any) -> Iterator[tuple[Notes, HttpMcpServer]]:
    world = Notes()
    http = HttpMcpServer(world.server)
    mcp_server_register(
        tenant=tenant,
        actor=admin_user,
        data={
            "slug": "notes",
            "transport": "http",
            "url": http.url,
            "network": http.network,
        },
    )
    mcp_tool_configure(
        tool=McpTool.objects.get(name="write_note"),
        actor=None,
        data={"requires_approval": False},
    )
    yield world, http
    http.stop()


@pytest.fixture
def worker(tmp_path: Path, transactional_db: Any) -> Iterator[WorkerProcess]:
    started = start_worker(tmp_path, concurrency=1)
    yield started
    started.stop()


SCRIPT = [
    {
        "tool_calls": [
            {
                "id": "c1",
                "name": "notes_write_note",
                "arguments": {"path": "out.txt", "text": "hello"},
            }
        ]
    },
    {"text": "The note is written."},
]


def settled(run: Run, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def test_an_elicitation_waits_for_a_person_and_the_rerun_call_completes(
    tenant, admin_user, operator_user, scripted_agent, api_client_for, notes, worker
):
    world, _http = notes
    agent = scripted_agent(SCRIPT, ["mcp:notes/write_note"])
    run = run_start(
        tenant=tenant, agent_slug=agent.slug, input="note it", started_by=None
    )
    # An untrusted server's write waits for an approval first, as any does.
    approval = wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status="pending").first(),
        what="the approval of the write",
    )
    assert world.written == []
    approval_decide(request=approval, decided_by=admin_user, approve=True)
    wait_for(
        lambda: (
            Run.objects.get(id=run.id).status
            in (Run.Status.WAITING_INPUT, *Run.TERMINAL)
        ),
        what="the run waiting for an answer",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_INPUT, (
        run.stop_detail,
        list(ToolCall.objects.filter(run=run).values_list("status", "result")),
    )
    assert run.lease_owner == "" and run.step_token is None  # holds no worker
    question = Question.objects.get(run=run)
    assert question.kind == Question.Kind.ELICITATION
    assert question.question == "Write 5 bytes to out.txt?"
    assert question.schema["properties"]["confirm"]["type"] == "boolean"
    assert question.choices == ["true", "false"]
    assert world.written == []  # the server did not complete the call
    call = ToolCall.objects.get(run=run, call_id="c1")
    assert call.status == ToolCall.Status.WAITING_INPUT

    client = api_client_for(operator_user, tenant)
    url = f"/api/v1/questions/{question.id}/answer/"
    refused = client.post(url, {"answer": "maybe"}, format="json")
    assert refused.status_code == 400 and "answer" in refused.json()["error"]["fields"]
    question.refresh_from_db()
    assert question.status == Question.Status.PENDING and world.written == []

    assert client.post(url, {"answer": "true"}, format="json").status_code == 200
    run = settled(run)
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail
    assert run.final_answer == "The note is written."
    assert world.written == [("out.txt", "hello")]  # once, with the answer
    call.refresh_from_db()
    assert call.status == ToolCall.Status.SUCCEEDED, call.result
    assert call.result["data"]["structured"] == {"written": "out.txt"}


def test_the_rerun_with_the_answer_is_the_same_call_for_quotas_and_counts(
    tenant, admin_user, operator_user, scripted_agent, api_client_for, notes, worker
):
    """The call that asked and its re-run with the answer are one call: a
    quota of one per run and one per day lets it complete, and both count 1."""
    world, _http = notes
    tool = McpTool.objects.get(name="write_note")
    mcp_tool_configure(
        tool=tool, actor=None, data={"requires_approval": False, "quota": "1/run;1/day"}
    )
    agent = scripted_agent(SCRIPT, ["mcp:notes/write_note"])
    run = run_start(
        tenant=tenant, agent_slug=agent.slug, input="note it", started_by=None
    )
    approval = wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status="pending").first(),
        what="the approval of the write",
    )
    approval_decide(request=approval, decided_by=admin_user, approve=True)
    question = wait_for(
        lambda: Question.objects.filter(run=run, status="pending").first(),
        what="the server's question",
    )
    client = api_client_for(operator_user, tenant)
    url = f"/api/v1/questions/{question.id}/answer/"
    assert client.post(url, {"answer": "true"}, format="json").status_code == 200
    run = settled(run)
    call = ToolCall.objects.get(run=run, call_id="c1")
    assert call.status == ToolCall.Status.SUCCEEDED, call.result
    assert world.written == [("out.txt", "hello")]
    assert run.tool_calls == 1
    bucket = "notes_write_note"
    assert run.engine_state["contract"]["quota_used"] == {bucket: 1}
    assert tool_quota_used(tenant_id=tenant.id, bucket=bucket, period="day") == 1
