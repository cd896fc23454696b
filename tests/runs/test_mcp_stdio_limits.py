"""The issue's hostile MCP servers, over stdio in the sandbox (the HTTP ones are in
test_mcp_servers.py and test_mcp_calls.py): one that lists 10,000 tools is
refused at registration with nothing written, and a tool that returns 50 MB is an
error observation, read no further than the cap, within seconds."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest
from django.conf import settings

from controlplane.models import AuditEvent
from runs.models import McpServer, McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.mcp import mcp_tool_configure

SERVER = str(settings.BASE_DIR / "runs" / "mcp" / "servers" / "warranty.py")


@pytest.fixture(autouse=True)
def bubblewrap_installed() -> None:
    assert shutil.which("bwrap"), "stdio MCP servers run in the sandbox: bubblewrap"


@pytest.fixture
def admin_api(tenant: Any, admin_user: Any, api_client_for: Any) -> Any:
    return api_client_for(admin_user, tenant)


def register(api: Any, *flags: str) -> Any:
    body = {
        "slug": "warranty",
        "transport": "stdio",
        "command": ["/usr/bin/python3", SERVER, *flags],
    }
    return api.post("/api/v1/mcp-servers/", body, format="json")


def test_a_stdio_server_listing_ten_thousand_tools_is_refused(admin_api):
    started = time.monotonic()
    response = register(admin_api, "--extra-tools", "10000")
    assert response.status_code == 400, response.content
    message = str(response.json()["error"]["fields"])
    assert "lists more than 500 tools" in message, message
    assert time.monotonic() - started < 60
    assert not McpServer.objects.exists() and not McpTool.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="mcp_").exists()


def test_a_fifty_megabyte_stdio_result_is_an_error_observation(
    admin_api, tenant, scripted_agent, drive_run
):
    assert register(admin_api, "--test-tools").status_code == 201
    mcp_tool_configure(
        tool=McpTool.objects.get(name="big_output"), actor=None,
        data={"effect": "read_only", "requires_approval": False},
    )  # fmt: skip
    scripted_agent(
        [
            {"tool_calls": [{"id": "c1", "name": "warranty_big_output",
                             "arguments": {"n": 50 * 1024 * 1024}}]},
            {"text": "done"},
        ],
        ["mcp:warranty/big_output"],
    )  # fmt: skip
    started = time.monotonic()
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    assert time.monotonic() - started < 60
    call = ToolCall.objects.get(run=run)
    assert call.status == "failed"
    assert call.result["error"]["code"] == "EOUTPUT", call.result
    assert "refused unread" in call.result["error"]["message"]
    assert len(str(call.result)) < 10_000
    assert run.status == Run.Status.UNVERIFIED and run.final_answer == "done"
