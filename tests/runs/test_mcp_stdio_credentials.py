"""Egress credentials of an MCP stdio server (issue 25, item 5): a stdio server
that needs one authenticated host lists it in `network` and names the tenant
secret in `credentials`; the egress proxy adds the header, so the sandboxed
server never holds the value. Bad credentials are a 400 naming the field with
nothing written; a secret gone by call time is an EACCES observation naming it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from controlplane import redaction
from controlplane.models import AuditEvent
from controlplane.secrets import secret_delete, secret_set
from runs.models import McpServer, McpTool, Run, ToolCall
from runs.services import run_start
from runs.services.mcp import mcp_tool_configure
from tests.sandbox.egress_servers import BODY, Upstream, upstream_server
from tests.secrets_probe import SecretProbe, captured_logs

SERVER = str(settings.BASE_DIR / "runs" / "mcp" / "servers" / "warranty.py")
COMMAND = ["/usr/bin/python3", SERVER, "--test-tools"]
VALUE = "partner-Qm41-heron-88Zt-ledger-3vK0"


@pytest.fixture(autouse=True)
def bubblewrap_installed() -> None:
    assert shutil.which("bwrap"), "stdio MCP servers need bubblewrap"


@pytest.fixture(autouse=True)
def listed_in_this_process() -> Iterator[None]:
    with override_settings(MCP_STDIO_LIST_IN="inline"):
        yield


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


def body(upstream: Upstream, **credential: Any) -> dict[str, Any]:
    target = f"localhost:{upstream.port}"
    return {
        "slug": "warranty",
        "transport": "stdio",
        "command": COMMAND,
        "network": [f"private:{target}"],
        "credentials": {
            target: {"secret": "PARTNER_KEY", "prefix": "Bearer ", "tls": False}
            | credential
        },
    }


def fetch_run(tenant: Any, scripted_agent: Any, drive_run: Any, url: str) -> Run:
    for name in ("fetch", "sandbox_facts"):
        mcp_tool_configure(
            tool=McpTool.objects.get(name=name), actor=None,
            data={"effect": "read_only", "requires_approval": False},
        )  # fmt: skip
    calls = [
        {"id": "c1", "name": "warranty_fetch", "arguments": {"url": url}},
        {"id": "c2", "name": "warranty_sandbox_facts", "arguments": {}},
    ]
    scripted_agent(
        [{"tool_calls": calls}, {"text": "done"}],
        ["mcp:warranty/fetch", "mcp:warranty/sandbox_facts"],
    )
    return drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
    )


@pytest.mark.parametrize("scrubber", ["on", "off"])
def test_the_proxy_adds_the_stdio_servers_credential_the_sandbox_never_holds_it(
    scrubber: str,
    monkeypatch: Any,
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    scripted_agent: Any,
    drive_run: Any,
    upstream: Upstream,
) -> None:
    if scrubber == "off":
        # The path keeps the value out, not the redaction layer's memory of it.
        monkeypatch.setattr(redaction, "_KNOWN_SECRET_MIN_CHARS", 10**6)
    api = api_client_for(admin_user, tenant)
    probe = SecretProbe(VALUE)
    responses: dict[str, Any] = {}
    with captured_logs() as logs:
        responses["set"] = api.put(
            "/api/v1/secrets/PARTNER_KEY/", {"value": VALUE}, format="json"
        )
        responses["register"] = api.post(
            "/api/v1/mcp-servers/", body(upstream), format="json"
        )
        assert responses["register"].status_code == 201, responses["register"].json()
        server_id = responses["register"].json()["id"]
        run = fetch_run(
            tenant, scripted_agent, drive_run, f"http://localhost:{upstream.port}/w"
        )
        fetched, facts = ToolCall.objects.filter(run=run).order_by("position")
        for name, path in {
            "run": f"/api/v1/runs/{run.id}/",
            "events": f"/api/v1/runs/{run.id}/events/",
            "spans": f"/api/v1/runs/{run.id}/spans/",
            "export": f"/api/v1/runs/{run.id}/export/",
            "servers": "/api/v1/mcp-servers/",
            "server": f"/api/v1/mcp-servers/{server_id}/",
            "audit": "/api/v1/audit/",
        }.items():
            responses[name] = api.get(path)
            assert responses[name].status_code == 200, (name, responses[name])
    # The upstream got the credential the proxy added, and nothing else did.
    assert fetched.result["data"]["text"] == BODY.decode(), fetched.result
    [(_, path, headers)] = upstream.requests
    assert path == "/w" and headers["Authorization"] == f"Bearer {VALUE}"
    log = {e["target"]: e for e in fetched.sandbox_result["network_log"]}
    entry = log[f"localhost:{upstream.port}"]
    assert (entry["decision"], entry["credential"]) == ("allow", "PARTNER_KEY")
    # The sandboxed server's own view of its world has no trace of the value.
    assert facts.status == "succeeded", facts.result
    assert VALUE not in str(facts.result)
    # The server's contract may read exactly that secret, and the API says which.
    shown = responses["server"].json()
    assert shown["credentials"] == body(upstream)["credentials"]
    created = AuditEvent.objects.get(action="mcp_server.create")
    assert created.after["credentials"] == body(upstream)["credentials"]
    for name, response in responses.items():
        probe.response(name, response)
    probe.logs(logs)
    probe.database()
    probe.assert_clean()


def test_bad_credentials_are_a_400_naming_the_field_and_nothing_is_written(
    tenant: Any, admin_user: Any, api_client_for: Any, upstream: Upstream
) -> None:
    api = api_client_for(admin_user, tenant)
    target = f"localhost:{upstream.port}"
    unset = api.post("/api/v1/mcp-servers/", body(upstream), format="json")
    assert unset.status_code == 400
    fields = unset.json()["error"]["fields"]
    assert "PARTNER_KEY" in str(fields[f"credentials.{target}.secret"])
    secret_set(tenant=tenant, name="PARTNER_KEY", value=VALUE, actor=None)
    off_list = body(upstream)
    off_list["network"] = []
    refused = api.post("/api/v1/mcp-servers/", off_list, format="json")
    assert refused.status_code == 400
    assert "not in the tool's network list" in str(
        refused.json()["error"]["fields"][f"credentials.{target}"]
    )
    reserved = api.post(
        "/api/v1/mcp-servers/", body(upstream, header="Host"), format="json"
    )
    assert reserved.status_code == 400
    assert f"credentials.{target}.header" in reserved.json()["error"]["fields"]
    http = {
        "slug": "remote",
        "transport": "http",
        "url": "https://mcp.example.com/mcp",
        "credentials": body(upstream)["credentials"],
    }
    refused_http = api.post("/api/v1/mcp-servers/", http, format="json")
    assert refused_http.status_code == 400
    assert "auth_secret" in str(refused_http.json()["error"]["fields"]["credentials"])
    assert not McpServer.objects.exists()
    assert not AuditEvent.objects.filter(object_type="mcp_server").exists()


def test_a_credential_secret_gone_at_call_time_is_eacces_naming_it(
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    scripted_agent: Any,
    drive_run: Any,
    upstream: Upstream,
) -> None:
    secret_set(tenant=tenant, name="PARTNER_KEY", value=VALUE, actor=None)
    api = api_client_for(admin_user, tenant)
    registered = api.post("/api/v1/mcp-servers/", body(upstream), format="json")
    assert registered.status_code == 201, registered.json()
    secret_delete(tenant=tenant, name="PARTNER_KEY", actor=None)
    run = fetch_run(
        tenant, scripted_agent, drive_run, f"http://localhost:{upstream.port}/w"
    )
    fetched = ToolCall.objects.filter(run=run).order_by("position").first()
    assert fetched is not None
    assert fetched.result["error"]["code"] == "EACCES", fetched.result
    assert "PARTNER_KEY" in fetched.result["error"]["message"]
    assert upstream.requests == []  # nothing reached the credentialed host


def test_a_worker_lists_a_credentialed_stdio_server_for_a_web_process(
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    upstream: Upstream,
    celery_worker_process: Any,
) -> None:
    """The unprivileged web process has a worker list it: the worker reads the
    credential's secret from the store by name (the request carries only names)."""
    secret_set(tenant=tenant, name="PARTNER_KEY", value=VALUE, actor=None)
    api = api_client_for(admin_user, tenant)
    with override_settings(MCP_STDIO_LIST_IN="worker"):
        response = api.post("/api/v1/mcp-servers/", body(upstream), format="json")
    assert response.status_code == 201, (
        response.content,
        celery_worker_process.output()[-3000:],
    )
    assert len(response.json()["tools"]) == 6
    assert McpServer.objects.get().credentials == body(upstream)["credentials"]
