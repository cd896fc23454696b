"""An MCP stdio server runs inside the sandbox, one sandbox per session: listed
and pinned at registration, called from a run, refused when it is not MCP."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from controlplane.models import AuditEvent
from runs.models import McpServer, McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.mcp import McpInputError, mcp_server_refresh, mcp_tool_configure
from tests.runs.mcp_servers import JunkHttpServer

SERVER = str(settings.BASE_DIR / "runs" / "mcp" / "servers" / "warranty.py")
COMMAND = ["/usr/bin/python3", SERVER, "--test-tools"]
LEGACY_SERVER = str(
    settings.BASE_DIR / "runs" / "mcp" / "servers" / "legacy_warranty.py"
)


@pytest.fixture(autouse=True)
def bubblewrap_installed() -> None:
    assert shutil.which("bwrap"), (
        "stdio MCP servers need bubblewrap: apt-get install bubblewrap"
    )


@pytest.fixture(autouse=True)
def listed_in_this_process() -> Iterator[None]:
    # This test process may start sandboxes; one test below asks a worker.
    with override_settings(MCP_STDIO_LIST_IN="inline"):
        yield


@pytest.fixture
def admin_api(tenant: Any, admin_user: Any, api_client_for: Any) -> Any:
    return api_client_for(admin_user, tenant)


def register(api: Any, command: list[str], slug: str = "warranty") -> Any:
    body = {"slug": slug, "transport": "stdio", "command": command}
    return api.post("/api/v1/mcp-servers/", body, format="json")


def test_a_stdio_server_runs_in_the_sandbox_and_is_called_from_a_run(
    admin_api, tenant, scripted_agent, drive_run, monkeypatch
):
    monkeypatch.setenv("SECRET_KEY", "worker-secret-do-not-leak")
    response = register(admin_api, COMMAND)
    assert response.status_code == 201, response.content
    names = [tool["name"] for tool in response.json()["tools"]]
    assert names == ["big_output", "fetch", "sandbox_facts", "slow",
                     "warranty_claim", "warranty_lookup"]  # fmt: skip
    for name in ("sandbox_facts", "warranty_lookup"):
        mcp_tool_configure(
            tool=McpTool.objects.get(name=name), actor=None,
            data={"effect": "read_only", "requires_approval": False},
        )  # fmt: skip
    scripted_agent(
        [
            {"tool_calls": [
                {"id": "c1", "name": "warranty_sandbox_facts", "arguments": {}},
                {"id": "c2", "name": "warranty_warranty_lookup",
                 "arguments": {"order_id": "4821"}},
            ]},
            {"text": "done"},
        ],
        ["mcp:warranty/sandbox_facts", "mcp:warranty/warranty_lookup"],
    )  # fmt: skip
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    facts, lookup = ToolCall.objects.filter(run=run).order_by("position")
    assert facts.status == "succeeded", facts.result
    inside = facts.result["data"]["structured"]
    assert inside["hostname"] == "sandbox"
    assert inside["uid"] == 65534
    assert inside["network"] == "unreachable"
    assert "SECRET_KEY" not in inside["environment"]
    assert "DATABASE_URL" not in inside["environment"]
    assert lookup.status == "succeeded", lookup.result
    assert lookup.result["data"]["structured"]["item"] == "kettle"
    assert run.status == Run.Status.UNVERIFIED


def test_a_2025_only_stdio_server_is_reached_through_the_handshake(
    admin_api, tenant, scripted_agent, drive_run
):
    """The 2026 client x 2025-only server cell (spec §2.9): `server/discover` is
    unknown to it, so the client falls back to `initialize`, lists, pins and calls."""
    response = register(admin_api, ["/usr/bin/python3", LEGACY_SERVER], "legacy")
    assert response.status_code == 201, response.content
    [listed] = response.json()["tools"]
    assert (listed["name"], listed["status"]) == ("warranty_lookup", "active")
    mcp_tool_configure(
        tool=McpTool.objects.get(name="warranty_lookup"), actor=None,
        data={"effect": "read_only", "requires_approval": False},
    )  # fmt: skip
    calls = [
        {"id": "c1", "name": "legacy_warranty_lookup",
         "arguments": {"order_id": "4821"}},
        {"id": "c2", "name": "legacy_warranty_lookup",
         "arguments": {"order_id": "9999"}},
    ]  # fmt: skip
    scripted_agent(
        [{"tool_calls": calls}, {"text": "done"}], ["mcp:legacy/warranty_lookup"]
    )
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )
    found, missing = ToolCall.objects.filter(run=run).order_by("position")
    assert found.status == "succeeded", found.result
    assert found.result["data"]["structured"] == {
        "order_id": "4821", "item": "kettle", "months_left": 18,
        "protocol": "2025-11-25",
    }  # fmt: skip
    # Its isError result is the model's to fix, as a modern server's is.
    assert missing.result["error"]["code"] == "EINVAL", missing.result
    assert "no warranty for order 9999" in missing.result["error"]["message"]


def test_an_upgraded_stdio_server_has_its_changed_tool_disabled(admin_api):
    server_id = register(admin_api, COMMAND).json()["id"]
    # The operator's server package changed under the same registration.
    McpServer.objects.filter(id=server_id).update(command=[*COMMAND, "--variant", "2"])
    changes = mcp_server_refresh(server=McpServer.objects.get(id=server_id), actor=None)
    assert changes.changed == ["warranty_lookup"]
    tool = McpTool.objects.get(name="warranty_lookup")
    assert tool.status == "changed"
    assert tool.description.endswith("(revision 2)")
    assert not tool.accepted_description.endswith("(revision 2)")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["/bin/sh", "-c", "echo hello from a shell; sleep 5"], "not MCP"),
        (["/nonexistent/mcp-server"], "exit code 127"),
        (["/bin/true"], "closed the connection"),
    ],
)
def test_a_stdio_command_that_is_not_an_mcp_server_is_refused(
    admin_api, command, expected
):
    response = register(admin_api, command)
    assert response.status_code == 400, response.content
    message = response.json()["error"]["fields"]["command"][0]
    assert expected in message, message
    assert not McpServer.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="mcp_").exists()


def test_a_refresh_of_a_stdio_server_that_broke_changes_no_tool(admin_api):
    server_id = register(admin_api, COMMAND).json()["id"]
    McpServer.objects.filter(id=server_id).update(command=["/bin/false"])
    with pytest.raises(McpInputError):
        mcp_server_refresh(server=McpServer.objects.get(id=server_id), actor=None)
    assert set(McpTool.objects.values_list("status", flat=True)) == {"active"}
    assert McpServer.objects.get(id=server_id).last_refresh_status == "error"


def test_a_stdio_server_reaches_only_the_hosts_its_network_lists(
    admin_api, tenant, scripted_agent, drive_run
):
    allowed = JunkHttpServer(b"warranty database says hello", "text/plain")
    other = JunkHttpServer(b"should never be read", "text/plain")
    try:
        body = {
            "slug": "warranty",
            "transport": "stdio",
            "command": COMMAND,
            "network": allowed.network,
        }
        response = admin_api.post("/api/v1/mcp-servers/", body, format="json")
        assert response.status_code == 201, response.content
        mcp_tool_configure(
            tool=McpTool.objects.get(name="fetch"), actor=None,
            data={"effect": "read_only", "requires_approval": False},
        )  # fmt: skip
        calls = [
            {"id": "c1", "name": "warranty_fetch", "arguments": {"url": allowed.url}},
            {"id": "c2", "name": "warranty_fetch", "arguments": {"url": other.url}},
        ]
        scripted_agent(
            [{"tool_calls": calls}, {"text": "done"}], ["mcp:warranty/fetch"]
        )
        run = drive_run(
            run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
        )
    finally:
        allowed.stop()
        other.stop()
    reached, refused = ToolCall.objects.filter(run=run).order_by("position")
    assert reached.result["data"]["text"] == "warranty database says hello"
    assert refused.result["data"]["text"].startswith("refused")
    log = reached.sandbox_result["network_log"]
    assert any(e.get("decision") == "allow" for e in log), log
    log = refused.sandbox_result["network_log"]
    assert log and all(e.get("decision") != "allow" for e in log), log


def test_a_web_process_that_cannot_sandbox_has_a_worker_list_the_tools(
    admin_api, celery_worker_process
):
    with override_settings(MCP_STDIO_LIST_IN="worker"):
        response = register(admin_api, COMMAND)
        assert response.status_code == 201, (
            response.content,
            celery_worker_process.output()[-3000:],
        )
        assert len(response.json()["tools"]) == 6
        broken = register(admin_api, ["/bin/sh", "-c", "echo hi"], slug="broken")
    assert "not MCP" in broken.json()["error"]["fields"]["command"][0]
    assert McpServer.objects.count() == 1


def test_a_stdio_server_the_sandbox_cannot_start_is_refused_with_the_reason(
    admin_api, settings
):
    # An operator's memory cap below the sandbox's floor: it refuses the spec.
    settings.MCP_STDIO_MEMORY_MB = 16
    response = register(admin_api, COMMAND)
    message = response.json()["error"]["fields"]["command"][0]
    assert "could not be started (SandboxSpecError" in message, message
    assert not McpServer.objects.exists()
