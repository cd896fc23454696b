"""The demo's second agent, "Kettlecraft warranty", defined entirely through the API.

`seed_demo --with-mcp` (and `make run`, which seeds with it by default) makes, as
the demo tenant's admin would from a script:

1. an MCP server over stdio, run inside the sandbox: the warranty server shipped in
   `runs/mcp/servers/warranty.py` (`python3 -m warranty`; its directory is on a
   stdio server's read-only PYTHONPATH), its tools listed and pinned; the tenant
   declares its `warranty_lookup` tool read-only, so a call needs no approval;
2. a model endpoint of kind `openai` whose base URL is the local scripted
   OpenAI-compatible server (`python -m runs.devserver --demo`, which `make run`
   supervises): the real streaming adapter, no API key;
3. the agent, whose version uses that endpoint, the built-in `lookup_order` and
   the MCP tool `mcp:warranty/warranty_lookup`, judged by `kettlecraft_warranty`.

Why requests through the API and not the ORM or the services: the point of the
demo is that an operator can define an agent with nothing but the API, so the
seeder is such an operator, with a token of the demo admin (issued for the seed,
revoked when it ends). Each request goes through the whole stack: URL routing,
middleware, bearer authentication, the tenant context, the permission gate, the
serializers' 400s, the services and their audit events. `make run` sends them
over real HTTP to its own Daphne once it is healthy (the authentication's
lockout counters need the Redis it starts, so the seed cannot run before); with
no `api_url` (`manage.py seed_demo --with-mcp`, the tests) the same requests go
in-process through DRF's `APIClient`, so no server need be up (Redis still must
be reachable: REDIS_URL, or the one a running `make run` publishes).

Idempotent: what exists and matches is left alone (a re-seed writes nothing but
the token's issue and revoke); a changed model URL is patched in place (the
endpoint is infrastructure, not part of a version); an agent whose definition
the demo changed gets a new version.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from controlplane.demo import DEMO_MODEL_URL, DemoSeedError
from controlplane.models import ApiToken, Tenant
from controlplane.services import api_token_issue, api_token_revoke
from runs.devserver.demo import DEMO_MODEL

DEMO_WARRANTY_AGENT_SLUG = "kettlecraft-warranty"
DEMO_ENDPOINT_SLUG = "local-openai"
DEMO_MCP_SLUG = "warranty"
DEMO_MCP_TOOL = "warranty_lookup"
# The sandbox's interpreter (run_code's too); `-m warranty` finds the server on
# the read-only PYTHONPATH of stdio servers (MCP_STDIO_READONLY_PATHS).
DEMO_MCP_COMMAND = ["/usr/bin/python3", "-m", "warranty"]
DEMO_ADMIN = "admin"
DEMO_WARRANTY_PROMPT = (
    "You are Kettlecraft's warranty desk. Look the order and its warranty up "
    "before answering, and say how many months of warranty are left."
)


@dataclass
class SeedReport:
    agent_slug: str = DEMO_WARRANTY_AGENT_SLUG
    model_url: str = ""
    changes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        done = "; ".join(self.changes) if self.changes else "already up to date"
        return (
            f"agent {self.agent_slug} (model endpoint {DEMO_ENDPOINT_SLUG} at "
            f"{self.model_url}, MCP server {DEMO_MCP_SLUG} over stdio): {done}"
        )


def warranty_agent_config() -> dict[str, Any]:
    """The agent's configuration as an API client writes it (PUT, POST)."""
    tool = f"mcp:{DEMO_MCP_SLUG}/{DEMO_MCP_TOOL}"
    return {
        "name": "Kettlecraft warranty",
        "endpoint": DEMO_ENDPOINT_SLUG,
        "model": DEMO_MODEL,
        "evaluated_models": [DEMO_MODEL],
        "system_prompt": DEMO_WARRANTY_PROMPT,
        "tools": ["lookup_order", tool],
        "tool_settings": {},
        "default_limits": {"max_steps": 6},
        "evaluator": "kettlecraft_warranty",
    }


class DemoApi:
    """One admin's requests through the real API stack; a non-2xx is an error."""

    def __init__(self, secret: str, api_url: str) -> None:
        self.secret = secret
        self.api_url = api_url.rstrip("/")
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    def call(self, method: str, path: str, body: Any = None) -> Any:
        if self.api_url:
            status, content = self._over_http(method, path, body)
        else:
            send = getattr(self.client, method.lower())
            response = send(
                f"/api/v1/{path}", body, format="json", **_host(), secure=_secure()
            )
            status, content = response.status_code, response.content
        if status >= 300:
            raise DemoSeedError(
                f"{method} /api/v1/{path} answered {status}: "
                f"{content.decode(errors='replace')[:2000]}"
            )
        return json.loads(content) if content else None

    def _over_http(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        request = urllib.request.Request(
            f"{self.api_url}/api/v1/{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self.secret}",
                "Content-Type": "application/json",
            },
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as refused:
            return int(refused.code), refused.read()
        except OSError as unreachable:
            raise DemoSeedError(f"{self.api_url} unreachable: {unreachable}") from None


def _host() -> dict[str, str]:
    # A host this deployment answers to (ALLOWED_HOSTS may not list testserver).
    hosts = [h.lstrip(".") for h in settings.ALLOWED_HOSTS if h != "*"]
    return {"HTTP_HOST": hosts[0] if hosts else "localhost"}


def _secure() -> bool:
    # Behind SECURE_SSL_REDIRECT a plain request would only be redirected.
    return bool(getattr(settings, "SECURE_SSL_REDIRECT", False))


@contextmanager
def demo_admin_api(tenant: Tenant, api_url: str) -> Iterator[DemoApi]:
    admin = get_user_model().objects.get(username=DEMO_ADMIN)
    issued = api_token_issue(tenant=tenant, user=admin, name="seed_demo --with-mcp")
    try:
        yield DemoApi(issued.secret, api_url)
    finally:
        token = ApiToken.objects.get(pk=issued.token.pk)
        api_token_revoke(token=token, actor=admin)


def _by_slug(items: list[dict[str, Any]], slug: str) -> dict[str, Any] | None:
    return next((item for item in items if item["slug"] == slug), None)


def _seed_mcp_server(api: DemoApi, report: SeedReport) -> None:
    server = _by_slug(api.call("GET", "mcp-servers/"), DEMO_MCP_SLUG)
    if server is not None and server["command"] != DEMO_MCP_COMMAND:
        # A command is not editable (a new one is a new server to trust).
        api.call("DELETE", f"mcp-servers/{server['id']}/")
        report.changes.append(f"MCP server {DEMO_MCP_SLUG} replaced (new command)")
        server = None
    if server is None:
        server = api.call(
            "POST",
            "mcp-servers/",
            {
                "slug": DEMO_MCP_SLUG,
                "name": "Kettlecraft warranties (stdio, in the sandbox)",
                "transport": "stdio",
                "command": DEMO_MCP_COMMAND,
            },
        )
        report.changes.append(f"MCP server {DEMO_MCP_SLUG} registered")
    tools = {tool["name"]: tool for tool in server["tools"]}
    tool = tools.get(DEMO_MCP_TOOL)
    if tool is None or tool["status"] != "active" or not server["enabled"]:
        if not server["enabled"]:
            api.call("PATCH", f"mcp-servers/{server['id']}/", {"enabled": True})
        refreshed = api.call("POST", f"mcp-servers/{server['id']}/refresh/", {})
        report.changes.append(f"MCP server {DEMO_MCP_SLUG} refreshed")
        server = api.call("GET", f"mcp-servers/{server['id']}/")
        tools = {tool["name"]: tool for tool in server["tools"]}
        tool = tools.get(DEMO_MCP_TOOL)
        if tool is None:
            raise DemoSeedError(
                f"the MCP server {DEMO_MCP_SLUG} lists no {DEMO_MCP_TOOL}: {refreshed}"
            )
        if tool["status"] == "changed":
            api.call(
                "POST",
                f"mcp-servers/{server['id']}/tools/{DEMO_MCP_TOOL}/accept/",
                {"definition_sha256": tool["definition_sha256"]},
            )
            report.changes.append(f"{DEMO_MCP_TOOL}'s new definition accepted")
    # The tenant's word on the tool (its own annotations are never believed): a
    # read that needs no approval.
    wanted = {
        "effect": "read_only",
        "idempotency": "natural",
        "requires_approval": False,
    }
    if any(tool[key] != value for key, value in wanted.items()):
        api.call("PATCH", f"mcp-servers/{server['id']}/tools/{DEMO_MCP_TOOL}/", wanted)
        report.changes.append(f"{DEMO_MCP_TOOL} declared read-only")


def _seed_endpoint(api: DemoApi, report: SeedReport) -> None:
    wanted = {
        "slug": DEMO_ENDPOINT_SLUG,
        "name": "Local OpenAI-compatible model (demo)",
        "kind": "openai",
        "base_url": report.model_url,
        "api_key_secret": "",
        "options": {"stream": True, "timeout_seconds": 30, "max_retries": 1},
    }
    endpoint = _by_slug(api.call("GET", "model-endpoints/"), DEMO_ENDPOINT_SLUG)
    if endpoint is None:
        api.call("POST", "model-endpoints/", wanted)
        report.changes.append(f"model endpoint {DEMO_ENDPOINT_SLUG} created")
    elif any(endpoint[key] != value for key, value in wanted.items()):
        api.call("PUT", f"model-endpoints/{endpoint['id']}/", wanted)
        report.changes.append(f"model endpoint {DEMO_ENDPOINT_SLUG} updated")


def _seed_agent(api: DemoApi, report: SeedReport) -> None:
    config = warranty_agent_config()
    agent = _by_slug(api.call("GET", "agents/"), DEMO_WARRANTY_AGENT_SLUG)
    if agent is None:
        api.call("POST", "agents/", {"slug": DEMO_WARRANTY_AGENT_SLUG, **config})
        report.changes.append(f"agent {DEMO_WARRANTY_AGENT_SLUG} created")
        return
    if agent["disabled"]:
        api.call("POST", f"agents/{agent['id']}/enable/", {})
        report.changes.append(f"agent {DEMO_WARRANTY_AGENT_SLUG} enabled")
    # A PUT of the same definition makes no version.
    after = api.call("PUT", f"agents/{agent['id']}/", config)
    if after["version"] != agent["version"]:
        report.changes.append(f"agent version {after['version']}")


def demo_seed_warranty_agent(
    *, tenant: Tenant, model_url: str = DEMO_MODEL_URL, api_url: str = ""
) -> SeedReport:
    """Define the warranty agent through the API as the demo admin (module doc):
    over HTTP to the control plane at `api_url`, or with none in-process.

    The MCP server goes first: it is the part that needs the sandbox (bubblewrap),
    so a host without it stops the seed before anything else is written."""
    report = SeedReport(model_url=model_url)
    with demo_admin_api(tenant, api_url) as api:
        _seed_mcp_server(api, report)
        _seed_endpoint(api, report)
        _seed_agent(api, report)
    return report
