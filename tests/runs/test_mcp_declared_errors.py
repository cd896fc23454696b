"""An MCP tool's own error object drives the host as a built-in tool's does (issue
25, item 7; spec §1.5, §2.7): the `retryable` and `suggested_action` of its
`isError` result's structured `error` decide whether a repeated error asks a
person or ends the run. Only the known action tokens count; the engine's own
rules on what it retries stay. A real SDK server over streamable HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

from approvals.models import ApprovalRequest
from runs.models import McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.mcp import mcp_server_register, mcp_tool_configure
from tests.runs.mcp_servers import HttpMcpServer


class Ledger:
    """A server whose one tool always fails with the error object it is given."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.calls = 0
        self.server = MCPServer("ledger", log_level="WARNING")

        def ledger_post(entry: str) -> CallToolResult:
            self.calls += 1
            body = {"error": error}
            return CallToolResult(
                content=[TextContent(type="text", text=json.dumps(body))],
                structured_content=body,
                is_error=True,
            )

        self.server.add_tool(ledger_post, description="Post one ledger entry.")


@pytest.fixture
def ledger(request: Any) -> Iterator[tuple[Ledger, HttpMcpServer]]:
    world = Ledger(request.param)
    http = HttpMcpServer(world.server)
    yield world, http
    http.stop()


def insisting_run(
    tenant: Any, ledger: tuple[Ledger, HttpMcpServer], scripted_agent: Any
) -> Run:
    _world, http = ledger
    mcp_server_register(
        tenant=tenant, actor=None,
        data={"slug": "ledger", "transport": "http", "url": http.url,
              "network": http.network},
    )  # fmt: skip
    mcp_tool_configure(
        tool=McpTool.objects.get(name="ledger_post"), actor=None,
        data={"effect": "read_only", "requires_approval": False},
    )  # fmt: skip
    call = {"name": "ledger_ledger_post", "arguments": {"entry": "refund 20.00"}}
    script = [{"tool_calls": [{"id": f"c{n}", **call}]} for n in range(3)]
    scripted_agent([*script, {"text": "done"}], ["mcp:ledger/ledger_post"])
    return run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)


ASKS = {
    "code": "EINVAL",
    "message": "the ledger is closed",
    "retryable": False,
    "suggested_action": "stop_and_request_human",
}


@pytest.mark.parametrize("ledger", [ASKS], indirect=True)
def test_a_repeated_error_the_server_says_needs_a_person_asks_one(
    tenant: Any, admin_user: Any, ledger: Any, scripted_agent: Any, drive_run: Any
) -> None:
    world, _http = ledger
    run = drive_run(insisting_run(tenant, ledger, scripted_agent))
    # EINVAL alone would be the model's to fix; the tool said it is not.
    assert run.status == Run.Status.WAITING_APPROVAL, (run.status, run.stop_detail)
    assert world.calls == 2
    question = ApprovalRequest.objects.get(run=run)
    assert question.kind == "tool_error"
    assert question.args_snapshot["code"] == "EINVAL"
    first = ToolCall.objects.filter(run=run).order_by("position").first()
    assert first is not None
    assert first.result["error"]["retryable"] is False
    assert first.result["error"]["suggested_action"] == "stop_and_request_human"


@pytest.mark.parametrize(
    "ledger",
    [{**ASKS, "suggested_action": "retry_forever_please"}],
    indirect=True,
)
def test_a_repeated_non_retryable_error_with_an_unknown_action_ends_the_run(
    tenant: Any, admin_user: Any, ledger: Any, scripted_agent: Any, drive_run: Any
) -> None:
    world, _http = ledger
    run = drive_run(insisting_run(tenant, ledger, scripted_agent))
    assert (run.status, run.stop_reason) == (Run.Status.FAILED, "repeated_error")
    assert world.calls == 2
    first = ToolCall.objects.filter(run=run).order_by("position").first()
    assert first is not None
    # An unknown token is not taken: the code's own default stands.
    assert first.result["error"]["suggested_action"] == "fix_arguments_and_retry_once"
    assert not ApprovalRequest.objects.filter(run=run).exists()
