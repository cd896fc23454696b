"""A secret that is really used stays out of everything a person or a run can read.

Planted through the secrets API, it is the auth header of an MCP server (a real
SDK server over streamable HTTP that refuses any other token); a run calls that
server's tool. The server got the header; the probe (tests/secrets_probe.py) finds
the value in no table, event, API response, page or log line. Paths that use
secrets later (model endpoints' keys) add themselves here the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from mcp.server.mcpserver import MCPServer

from controlplane import redaction
from controlplane.redaction import REDACTED
from controlplane.secrets import secret_set
from runs.models import McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.mcp import mcp_server_register, mcp_tool_configure
from tests.runs.mcp_servers import HttpMcpServer, build
from tests.secrets_probe import SecretProbe, captured_logs

TOKEN = "mcp-bearer-Vb72-quince-19Lm-tern-0x5e"


@pytest.fixture
def guarded_server() -> Iterator[HttpMcpServer]:
    server = HttpMcpServer(build(0, 0, False), bearer=TOKEN)
    yield server
    server.stop()


@pytest.mark.parametrize("scrubber", ["on", "off"])
def test_an_mcp_servers_auth_secret_reaches_the_server_and_nothing_else(
    scrubber: str,
    monkeypatch: Any,
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    guarded_server: HttpMcpServer,
    scripted_agent: Any,
    drive_run: Any,
) -> None:
    if scrubber == "off":
        # The path itself keeps the value out, not the redaction layer's memory
        # of values it has seen (the second layer, behind it).
        monkeypatch.setattr(redaction, "_KNOWN_SECRET_MIN_CHARS", 10**6)
    api = api_client_for(admin_user, tenant)
    probe = SecretProbe(TOKEN)
    responses: dict[str, Any] = {}
    with captured_logs() as logs:
        responses["set"] = api.put(
            "/api/v1/secrets/WARRANTY_TOKEN/", {"value": TOKEN}, format="json"
        )
        responses["register"] = api.post(
            "/api/v1/mcp-servers/",
            {
                "slug": "warranty",
                "transport": "http",
                "url": guarded_server.url,
                "network": guarded_server.network,
                "auth_secret": "WARRANTY_TOKEN",
            },
            format="json",
        )
        assert responses["register"].status_code == 201, responses["register"].json()
        server_id = responses["register"].json()["id"]
        responses["configure"] = api.patch(
            f"/api/v1/mcp-servers/{server_id}/tools/warranty_lookup/",
            {"effect": "read_only", "requires_approval": False},
            format="json",
        )
        assert responses["configure"].status_code == 200
        scripted_agent(
            [
                {
                    "tool_calls": [
                        {
                            "id": "c1",
                            "name": "warranty_warranty_lookup",
                            "arguments": {"order_id": "4821"},
                        }
                    ]
                },
                {"text": "done"},
            ],
            ["mcp:warranty/warranty_lookup"],
        )
        run = drive_run(
            run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
        )
        call = ToolCall.objects.get(run=run)
        assert call.status == "succeeded", call.result
        assert run.status != Run.Status.FAILED, run.stop_detail
        for name, path in {
            "run": f"/api/v1/runs/{run.id}/",
            "events": f"/api/v1/runs/{run.id}/events/",
            "spans": f"/api/v1/runs/{run.id}/spans/",
            "export": f"/api/v1/runs/{run.id}/export/",
            "otlp export": f"/api/v1/runs/{run.id}/export/?format=otlp",
            "servers": "/api/v1/mcp-servers/",
            "server": f"/api/v1/mcp-servers/{server_id}/",
            "secrets": "/api/v1/secrets/",
            "audit": "/api/v1/audit/",
        }.items():
            responses[name] = api.get(path)
            assert responses[name].status_code == 200, (name, responses[name])
        page = Client()
        page.force_login(admin_user)
        responses["run page"] = page.get(f"/runs/{run.id}/")
        responses["secrets page"] = page.get("/secrets/")

    # The server was called with the secret, as its auth header.
    assert any(
        headers.get("authorization") == f"Bearer {TOKEN}"
        for headers in guarded_server.seen_headers
    )
    for name, response in responses.items():
        probe.response(name, response)
    probe.logs(logs)
    probe.database()
    probe.assert_clean()
    if scrubber == "off":
        assert redaction._known_secrets_pattern is None  # nothing was scrubbed


@pytest.mark.parametrize("scrubber", ["on", "off"])
def test_a_server_that_echoes_its_secret_does_not_put_it_in_the_model_context(
    scrubber: str,
    monkeypatch: Any,
    tenant: Any,
    admin_user: Any,
    scripted_agent: Any,
    drive_run: Any,
) -> None:
    """The server holds its own token and may say it back (careless or hostile):
    the host takes out of a call's result every secret the call read, before the
    result is an observation, a row or a span."""
    if scrubber == "off":
        monkeypatch.setattr(redaction, "_KNOWN_SECRET_MIN_CHARS", 10**6)
    server = MCPServer("echo", log_level="WARNING")

    def whoami() -> dict[str, str]:
        return {"said": f"you are calling with {TOKEN}", "quoted": f'"{TOKEN}"'}

    server.add_tool(whoami, description="Who the caller is.")
    http = HttpMcpServer(server, bearer=TOKEN)
    try:
        secret_set(tenant=tenant, name="ECHO_TOKEN", value=TOKEN, actor=None)
        mcp_server_register(
            tenant=tenant, actor=admin_user,
            data={"slug": "echo", "transport": "http", "url": http.url,
                  "network": http.network, "auth_secret": "ECHO_TOKEN"},
        )  # fmt: skip
        mcp_tool_configure(
            tool=McpTool.objects.get(name="whoami"), actor=None,
            data={"effect": "read_only", "requires_approval": False},
        )  # fmt: skip
        call = {"id": "c1", "name": "echo_whoami", "arguments": {}}
        scripted_agent([{"tool_calls": [call]}, {"text": "done"}], ["mcp:echo/whoami"])
        with captured_logs() as logs:
            run = drive_run(
                run_start(
                    tenant=tenant, agent_slug="scripted", input="x", started_by=None
                )
            )
    finally:
        http.stop()
    row = ToolCall.objects.get(run=run)
    assert row.status == "succeeded", row.result
    said = row.result["data"]["structured"]
    assert said == {
        "said": f"you are calling with {REDACTED}",
        "quoted": f'"{REDACTED}"',
    }
    probe = SecretProbe(TOKEN)
    probe.logs(logs)
    probe.database()
    probe.assert_clean()


def test_a_server_that_lists_its_secret_has_it_taken_out_and_the_tool_refused(
    tenant: Any, admin_user: Any
) -> None:
    """A listing is pinned and shown to models: a server that puts its own token
    in a tool's description or schema gets it taken out before anything is
    stored, and that tool is invalid (never offered) until it lists it no more."""
    server = MCPServer("careless", log_level="WARNING")

    def lookup(order_id: str) -> str:
        return order_id

    server.add_tool(lookup, description=f"Send Authorization: Bearer {TOKEN}.")
    http = HttpMcpServer(server, bearer=TOKEN)
    try:
        secret_set(tenant=tenant, name="CARELESS_TOKEN", value=TOKEN, actor=None)
        mcp_server_register(
            tenant=tenant, actor=admin_user,
            data={"slug": "careless", "transport": "http", "url": http.url,
                  "network": http.network, "auth_secret": "CARELESS_TOKEN"},
        )  # fmt: skip
    finally:
        http.stop()
    tool = McpTool.objects.get(name="lookup")
    assert tool.status == McpTool.Status.INVALID
    assert "repeats the server's secret" in tool.problem
    assert tool.description == f"Send Authorization: {REDACTED}."
    probe = SecretProbe(TOKEN)
    probe.database()
    probe.assert_clean()
