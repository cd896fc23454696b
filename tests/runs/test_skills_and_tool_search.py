"""Skills and tool search through a real Celery worker, on the scripted model:
what the model received on each call is read back from its chat spans. The
deferred tools are a real MCP server's (the SDK's, over streamable HTTP)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

from approvals.models import ApprovalRequest
from runs.models import McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide
from runs.services.mcp import mcp_server_register, mcp_tool_configure
from tests.conftest import start_worker, wait_for
from tests.runs.mcp_servers import HttpMcpServer
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

PROCEDURE = (
    "1. Confirm the damage with lookup_order.\n2. Create the replacement.\n"
    "3. Always call get_delivery_date for the new shipment; never reuse original_eta."
)
SKILLS = [
    {
        "name": "replacement-procedure",
        "summary": "How to replace a damaged item.",
        "body": PROCEDURE,
    },
    {"name": "refunds", "summary": "When a refund is allowed.", "body": "Rarely."},
]
WARRANTY = {
    "warranty_claim": "File a warranty claim for a damaged item.",
    "warranty_status": "Tell where a warranty claim stands.",
    "warranty_lookup": "Look up the warranty of an order.",
    "warranty_extend": "Extend the warranty of an order by a year.",
    "warranty_transfer": "Transfer a warranty to a new owner.",
    "warranty_cancel": "Cancel a warranty.",
    "refund_order": "Refund an order's payment to the customer.",
}
DEFERRED = 200


def settled(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.status in Run.TERMINAL else None


def model_calls(run: Run) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """Each model call's input messages and the names of the tools it was sent."""
    calls = []
    for span, bodies in run_spans_with_payloads(tenant=run.tenant, run_id=run.id):
        if span.attributes.get("gen_ai.operation.name") != "chat":
            continue
        found = {**span.attributes, **bodies}
        messages = json.loads(found["gen_ai.input.messages"])
        tools = json.loads(found["gen_ai.tool.definitions"])
        calls.append((messages, [tool["function"]["name"] for tool in tools]))
    return calls


def test_the_prompt_holds_the_skill_index_and_load_skill_brings_a_body_in(
    tenant, scripted_agent, celery_worker_process
):
    script = [
        {"tool_calls": [{"id": "a", "name": "load_skill",
                         "arguments": {"name": "replacement-procedure"}}]},
        {"tool_calls": [{"id": "b", "name": "load_skill",
                         "arguments": {"name": "returns"}}]},
        {"text": "done"},
    ]  # fmt: skip
    scripted_agent(script, ["lookup_order"], skills=SKILLS, system_prompt="Be kind.")
    run = run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    run = wait_for(lambda: settled(run), timeout=60)
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail

    calls = model_calls(run)
    assert len(calls) == 3
    first_messages, first_tools = calls[0]
    system = first_messages[0]["content"]
    assert system.startswith("Be kind.\n\nSkills")
    assert "- replacement-procedure — How to replace a damaged item." in system
    assert "- refunds — When a refund is allowed." in system
    assert "never reuse original_eta" not in json.dumps(first_messages)
    assert "Rarely." not in json.dumps(first_messages)
    assert first_tools == ["lookup_order", "load_skill"]
    # The body came in as load_skill's observation, for the next call.
    assert "never reuse original_eta" in json.dumps(calls[1][0])

    loaded, unknown = ToolCall.objects.filter(run=run).order_by("step__index")
    assert loaded.status == "succeeded"
    assert loaded.result["data"]["body"] == PROCEDURE
    assert unknown.status == "failed"
    assert unknown.result["error"]["message"] == (
        "there is no skill named 'returns'; skills: replacement-procedure, refunds"
    )
    spans = Span.objects.filter(run=run, name="execute_tool load_skill")
    assert spans.count() == 2


class BigServer:
    """An MCP server of 200 tools that counts which of them really ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.server = MCPServer("big", log_level="WARNING")
        tools = dict(WARRANTY)
        for i in range(DEFERRED - len(WARRANTY)):
            tools[f"stock_bin_{i}"] = f"Report the stock level of warehouse bin {i}."
        for name, description in tools.items():
            self._add(name, description)
        self.names = list(tools)

    def _add(self, name: str, description: str) -> None:
        def tool() -> dict[str, str]:
            self.ran.append(name)
            return {"tool": name, "status": "done"}

        self.server.add_tool(tool, name=name, description=description)


@pytest.fixture
def big() -> Iterator[tuple[BigServer, HttpMcpServer]]:
    world = BigServer()
    http = HttpMcpServer(world.server)
    yield world, http
    http.stop()


@pytest.fixture
def deferred_agent(tenant, admin_user, big, scripted_agent) -> Any:
    """An agent with one direct tool (echo) and 200 deferred MCP tools."""
    world, http = big
    mcp_server_register(
        tenant=tenant,
        actor=admin_user,
        data={"slug": "big", "transport": "http", "url": http.url,
              "network": http.network},
    )  # fmt: skip
    refs = [f"mcp:big/{name}" for name in world.names]
    settings = {ref: {"exposure": "deferred"} for ref in refs}

    def build(script: list[dict[str, Any]]) -> Any:
        return scripted_agent(script, ["echo", *refs], tool_settings=settings)

    return build


def search_then_call(name: str, *, unloaded: str = "") -> list[dict[str, Any]]:
    first = [{"id": "s", "name": "tool_search",
              "arguments": {"query": "file a warranty claim"}}]  # fmt: skip
    if unloaded:
        first.append({"id": "u", "name": unloaded, "arguments": {}})
    return [
        {"tool_calls": first},
        {"tool_calls": [{"id": "c", "name": name, "arguments": {}}]},
        {"text": "done"},
    ]


def test_tool_search_over_200_deferred_tools_sends_only_core_and_found_ones(
    tenant, big, deferred_agent, celery_worker_process
):
    world, _http = big
    mcp_tool_configure(
        tool=McpTool.objects.get(name="warranty_claim"),
        actor=None,
        data={"effect": "read_only", "requires_approval": False},
    )
    deferred_agent(search_then_call("big_warranty_claim", unloaded="big_refund_order"))
    run = run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    run = wait_for(lambda: settled(run), timeout=90)
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail

    search, unloaded, claim = ToolCall.objects.filter(run=run).order_by(
        "step__index", "position"
    )
    found = [tool["name"] for tool in search.result["data"]["tools"]]
    assert len(found) == 5 and found[0] == "big_warranty_claim"
    assert all(name.startswith("big_warranty_") for name in found)
    assert search.result["data"]["loaded"] == found

    calls = model_calls(run)
    assert [tools for _, tools in calls] == [
        ["echo", "tool_search"],
        ["echo", *sorted(found, key=world_order(world)), "tool_search"],
        ["echo", *sorted(found, key=world_order(world)), "tool_search"],
    ]

    # Called before it was found: refused, never sent to the server.
    assert unloaded.status == "refused"
    assert unloaded.result["error"]["code"] == "ENOTOOL"
    assert (
        "is not loaded, so it was not executed: call tool_search"
        in (unloaded.observation["content"])
    )
    assert claim.status == "succeeded", claim.result
    assert world.ran == ["warranty_claim"]

    span = Span.objects.get(run=run, name="execute_tool tool_search")
    assert list(span.attributes["cp.tool_search.loaded"]) == found
    run.refresh_from_db()
    assert run.engine_state["loaded_tools"] == found


def world_order(world: BigServer) -> Any:
    """Tools are sent in the agent's order of refs (the server's listing)."""
    return lambda name: world.names.index(name.removeprefix("big_"))


def test_loaded_tools_survive_a_worker_restart_and_a_resume_after_approval(
    tenant, big, deferred_agent, admin_user, celery_worker_process, tmp_path
):
    world, _http = big
    # warranty_claim needs approval (an MCP tool's default).
    deferred_agent(search_then_call("big_warranty_claim"))
    run = run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)

    def waiting() -> Run | None:
        run.refresh_from_db()
        return run if run.status == Run.Status.WAITING_APPROVAL else None

    run = wait_for(waiting, timeout=90)
    found = ToolCall.objects.get(run=run, tool_name="tool_search").result["data"][
        "loaded"
    ]
    assert run.engine_state["loaded_tools"] == found
    assert world.ran == []

    # The worker that ran the search is gone; another resumes the run.
    celery_worker_process.stop()
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    approval_decide(request=approval, decided_by=admin_user, approve=True)
    worker = start_worker(tmp_path)
    try:
        run = wait_for(lambda: settled(run), timeout=90)
    finally:
        worker.stop()
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail
    assert world.ran == ["warranty_claim"]
    last_messages, last_tools = model_calls(run)[-1]
    assert set(last_tools) == {"echo", "tool_search", *found}
    assert len(last_tools) == 7
    assert run.engine_state["loaded_tools"] == found
