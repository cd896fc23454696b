"""Writes for MCP servers and their tools: register, refresh, accept a changed
definition, set a tool's contract, delete. Every change is audited.

Registration lists the server's tools before anything is written: a server that
does not answer, answers garbage or lists too many tools is refused with the
reason and nothing is created. A refresh that fails records the failure on the
server and changes no tool.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from controlplane.celery import app as celery_app
from controlplane.models import Tenant
from controlplane.secrets import SecretMissing, secret_exists
from controlplane.services import audit_record
from runs.mcp.client import mcp_list_tools
from runs.mcp.connection import mcp_endpoint_for
from runs.mcp.endpoint import ListedTool, McpFailure
from runs.mcp.pinning import (
    ListingChanges,
    definition_problem,
    mcp_listing_apply,
    without_secret,
)
from runs.models import McpServer, McpTool
from runs.sandbox import HostPort, SandboxSpecError, SandboxUnavailable, probe_host
from runs.sandbox.capabilities import require_layers
from runs.tools.egress import (
    CREDENTIALS,
    NETWORK,
    EgressSettingsError,
    egress_settings_errors,
)
from runs.tools.run_code import sandbox_settings

LIST_TASK = "runs.tasks.mcp_stdio_list_task"


class McpInputError(ValueError):
    """The request is malformed or the server unusable; a message per field.
    Nothing was written."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in fields.items()))
        self.fields = fields


class McpConflict(ValueError):
    """The tool is not in the state the request assumed (nothing was written)."""


def mcp_server_view(server: McpServer) -> dict[str, Any]:
    """What the audit log keeps of a server (the secret's name, never a value)."""
    return {
        "slug": server.slug,
        "name": server.name,
        "transport": server.transport,
        "url": server.url,
        "command": list(server.command),
        "auth_secret": server.auth_secret,
        "network": list(server.network),
        "credentials": dict(server.credentials),
        "enabled": server.enabled,
    }


def mcp_tool_view(tool: McpTool) -> dict[str, Any]:
    return {
        "name": tool.name,
        "status": tool.status,
        "accepted_sha256": tool.accepted_sha256,
        "definition_sha256": tool.definition_sha256,
        "effect": tool.effect,
        "idempotency": tool.idempotency,
        "requires_approval": tool.requires_approval,
        "timeout_seconds": tool.timeout_seconds,
        "quota": tool.quota,
    }


def _validate(tenant: Tenant, data: Mapping[str, Any]) -> dict[str, Any]:
    """Cross-field and stored-state checks after the API's shape checks."""
    errors: dict[str, list[str]] = {}
    transport = data["transport"]
    url, command = data.get("url") or "", list(data.get("command") or [])
    if transport == McpServer.Transport.HTTP:
        if not url:
            errors["url"] = ["an http server needs its URL"]
        if command:
            errors["command"] = ["an http server takes no command"]
    else:
        if not command:
            errors["command"] = ["a stdio server needs its command (a list of strings)"]
        if url:
            errors["url"] = ["a stdio server takes no URL"]
        if data.get("auth_secret"):
            errors["auth_secret"] = [
                "a stdio server gets no secret (it runs in the sandbox, which never "
                "holds one)"
            ]
    network: list[str] = []
    for item in data.get("network") or []:
        try:
            network.append(str(HostPort.parse(item)))
        except SandboxSpecError as exc:
            errors.setdefault("network", []).append(str(exc))
    secret = data.get("auth_secret") or ""
    if secret and not secret_exists(tenant_id=tenant.id, name=secret):
        errors["auth_secret"] = [f"secret {secret!r} is not set in this tenant"]
    credentials = dict(data.get("credentials") or {})
    errors.update(_credential_errors(tenant, transport, data, credentials))
    if McpServer.objects.filter(tenant=tenant, slug=data["slug"]).exists():
        errors["slug"] = [f"an MCP server {data['slug']!r} already exists"]
    if errors:
        raise McpInputError(errors)
    return {
        "slug": data["slug"],
        "name": data.get("name") or data["slug"],
        "transport": transport,
        "url": url,
        "command": command,
        "auth_secret": secret,
        "network": network,
        "credentials": credentials,
    }


def _credential_errors(
    tenant: Tenant, transport: str, data: Mapping[str, Any], credentials: dict[str, Any]
) -> dict[str, list[str]]:
    """A stdio server's egress credentials, checked as an agent tool's are (each
    host in `network`, each secret set in the tenant); an HTTP server has one
    secret, its `auth_secret`, sent by the host itself."""
    if not credentials:
        return {}
    if transport == McpServer.Transport.HTTP:
        return {
            "credentials": [
                "an http server's secret is its auth_secret; credentials are for "
                "the hosts a stdio server reaches through the egress proxy"
            ]
        }
    settings_ = {NETWORK: list(data.get("network") or []), CREDENTIALS: credentials}
    problems = egress_settings_errors(settings_, field="server", tenant_id=tenant.id)
    return {
        path.removeprefix("server."): [message]
        for path, message in problems.items()
        if path.startswith(f"server.{CREDENTIALS}")
    }


def _listing(server: McpServer) -> list[ListedTool]:
    """The server's tools, or McpInputError naming the field to look at."""
    field = "url" if server.transport == McpServer.Transport.HTTP else "command"
    if server.transport == McpServer.Transport.STDIO and not _lists_here():
        return _listing_by_a_worker(server)
    try:
        endpoint = mcp_endpoint_for(
            server, timeout_seconds=settings.MCP_LIST_TIMEOUT_SECONDS
        )
        listing = mcp_list_tools(
            endpoint, timeout_seconds=settings.MCP_LIST_TIMEOUT_SECONDS
        )
        # An HTTP server holds its auth header and may list it back; a stdio
        # server never holds its credentials (the egress proxy adds them).
        for sent in endpoint.headers.values():
            listing = [without_secret(tool, sent) for tool in listing]
        return listing
    except McpFailure as failure:
        if failure.kind in ("too_many_tools", "too_large"):
            field = "server"
        raise McpInputError({field: [str(failure)]}) from None
    except SecretMissing as missing:
        field = "credentials" if server.credentials else "auth_secret"
        raise McpInputError({field: [str(missing)]}) from None
    except EgressSettingsError as invalid:
        raise McpInputError({"credentials": [str(invalid)]}) from None


def _lists_here() -> bool:
    """Whether this process lists stdio servers itself: `inline`, or `auto` and
    it can run the sandbox (a worker can; an unprivileged web process cannot)."""
    where = settings.MCP_STDIO_LIST_IN
    if where != "auto":
        return bool(where == "inline")
    config = sandbox_settings()
    try:
        require_layers(probe_host(config).planned_layers(), config.required_layers)
    except SandboxUnavailable:
        return False
    return True


def _listing_by_a_worker(server: McpServer) -> list[ListedTool]:
    """A stdio server's listing from a Celery worker: the web process cannot
    start a sandbox (it has neither root nor the cgroups). The answer comes back
    through the cache under a one-time key; no answer in time is a 400 too."""
    reply_key = f"mcp-listing:{uuid.uuid4().hex}"
    kwargs = {
        "reply_key": reply_key,
        "tenant_id": str(server.tenant_id),
        "slug": server.slug,
        "command": list(server.command),
        "network": list(server.network),
        "credentials": dict(server.credentials),
    }
    try:
        # Named, not imported: runs.tasks imports the services (as dispatch.py).
        celery_app.signature(LIST_TASK).apply_async(kwargs=kwargs)
    except BrokerUnavailable:
        raise McpInputError(
            {"command": ["no worker can be reached to start it (broker down)"]}
        ) from None
    deadline = time.monotonic() + settings.MCP_LIST_TIMEOUT_SECONDS + 15
    while time.monotonic() < deadline:
        reply = cache.get(reply_key)
        if reply is None:
            time.sleep(0.1)
            continue
        cache.delete(reply_key)
        if "failure" in reply:
            too_much = reply["kind"] in ("too_many_tools", "too_large")
            field = reply.get("field") or ("server" if too_much else "command")
            raise McpInputError({field: [reply["failure"]]})
        return [ListedTool(**tool) for tool in reply["tools"]]
    raise McpInputError(
        {"command": ["no worker listed its tools in time: is a worker running?"]}
    )


def mcp_stdio_listing_reply(
    *,
    reply_key: str,
    tenant_id: str,
    slug: str,
    command: list[str],
    network: list[str],
    credentials: dict[str, Any] | None = None,
) -> None:
    """In a worker: list a stdio server's tools and leave the answer (or the
    failure's message) in the cache under `reply_key`. The egress credentials'
    secrets are read here, from the store, by name."""
    server = McpServer(
        tenant_id=tenant_id,
        slug=slug,
        transport=McpServer.Transport.STDIO,
        command=command,
        network=network,
        credentials=credentials or {},
    )
    try:
        endpoint = mcp_endpoint_for(
            server, timeout_seconds=settings.MCP_LIST_TIMEOUT_SECONDS
        )
        listing = mcp_list_tools(
            endpoint, timeout_seconds=settings.MCP_LIST_TIMEOUT_SECONDS
        )
    except McpFailure as failure:
        reply: dict[str, Any] = {"failure": str(failure), "kind": failure.kind}
    except (SecretMissing, EgressSettingsError) as invalid:
        message = str(invalid.args[0]) if invalid.args else str(invalid)
        reply = {"failure": message, "kind": "credentials", "field": "credentials"}
    else:
        reply = {"tools": [dataclasses.asdict(tool) for tool in listing]}
    cache.set(reply_key, reply, timeout=120)


def mcp_server_register(
    *,
    tenant: Tenant,
    actor: User | None,
    data: Mapping[str, Any],
    remote_addr: str | None = None,
) -> McpServer:
    """Register a server and pin its tools as listed now (the admin sees them)."""
    fields = _validate(tenant, data)
    unsaved = McpServer(tenant=tenant, created_by=actor, **fields)
    listing = _listing(unsaved)  # before anything is written
    try:
        with transaction.atomic():
            unsaved.save()
            changes = mcp_listing_apply(server=unsaved, listing=listing)
            audit_record(
                tenant=tenant, actor=actor, action="mcp_server.create",
                object_type="mcp_server", object_id=str(unsaved.id),
                after={**mcp_server_view(unsaved), "tools": changes.to_dict()},
                remote_addr=remote_addr,
            )  # fmt: skip
    except IntegrityError:
        raise McpInputError(
            {"slug": [f"an MCP server {fields['slug']!r} already exists"]}
        ) from None
    unsaved.refresh_from_db()
    return unsaved


def mcp_server_refresh(
    *, server: McpServer, actor: User | None, remote_addr: str | None = None
) -> ListingChanges:
    """List the tools again: changed definitions are disabled until accepted."""
    try:
        listing = _listing(server)
    except McpInputError as invalid:
        McpServer.objects.filter(id=server.id).update(
            last_refresh_at=timezone.now(),
            last_refresh_status="error",
            last_refresh_error=invalid.args[0][:2000],
        )
        raise
    with transaction.atomic():
        changes = mcp_listing_apply(server=server, listing=listing)
        audit_record(
            tenant=server.tenant, actor=actor, action="mcp_server.refresh",
            object_type="mcp_server", object_id=str(server.id),
            after=changes.to_dict(), remote_addr=remote_addr,
        )  # fmt: skip
    return changes


@transaction.atomic
def mcp_tool_accept(
    *,
    tool: McpTool,
    actor: User | None,
    definition_sha256: str,
    remote_addr: str | None = None,
) -> McpTool:
    """Accept the definition the server lists now, the one the admin reviewed
    (`definition_sha256`); a definition that moved on since is a conflict."""
    locked = McpTool.objects.select_for_update().get(id=tool.id)
    if locked.status != McpTool.Status.CHANGED:
        raise McpConflict(
            f"{locked.name} is {locked.status}: there is nothing to accept"
        )
    if locked.definition_sha256 != definition_sha256:
        raise McpConflict(
            f"the definition of {locked.name} is now {locked.definition_sha256}, "
            "not the one reviewed: look at it again"
        )
    problem = definition_problem(
        ListedTool(locked.name, locked.description, locked.input_schema, {}, "")
    )
    if problem:
        raise McpInputError({"definition_sha256": [f"{locked.name}: {problem}"]})
    before = mcp_tool_view(locked)
    locked.accepted_sha256 = locked.definition_sha256
    locked.accepted_description = locked.description
    locked.accepted_input_schema = locked.input_schema
    locked.accepted_by = actor
    locked.accepted_at = timezone.now()
    locked.problem = ""
    locked.status = McpTool.Status.ACTIVE
    locked.save()
    audit_record(
        tenant=locked.server.tenant, actor=actor, action="mcp_tool.accept",
        object_type="mcp_tool", object_id=str(locked.id),
        before=before,
        after={**mcp_tool_view(locked), "description": locked.description,
               "input_schema": locked.input_schema},
        remote_addr=remote_addr,
    )  # fmt: skip
    return locked


@transaction.atomic
def mcp_tool_configure(
    *,
    tool: McpTool,
    actor: User | None,
    data: Mapping[str, Any],
    remote_addr: str | None = None,
) -> McpTool:
    """Set the tenant's side of a tool's contract (effect, idempotency, approval
    need, timeout, quota); fields not given stay."""
    locked = McpTool.objects.select_for_update().get(id=tool.id)
    before = mcp_tool_view(locked)
    fields = ("effect", "idempotency", "requires_approval", "timeout_seconds", "quota")
    for name in fields:
        if name in data:
            setattr(locked, name, data[name])
    locked.save()
    audit_record(
        tenant=locked.server.tenant, actor=actor, action="mcp_tool.update",
        object_type="mcp_tool", object_id=str(locked.id),
        before=before, after=mcp_tool_view(locked), remote_addr=remote_addr,
    )  # fmt: skip
    return locked


@transaction.atomic
def mcp_server_update(
    *,
    server: McpServer,
    actor: User | None,
    data: Mapping[str, Any],
    remote_addr: str | None = None,
) -> McpServer:
    """Rename, enable or disable a server (its connection is fixed at
    registration: a new one is a new server, listed and pinned afresh)."""
    before = mcp_server_view(server)
    for name in ("name", "enabled"):
        if name in data:
            setattr(server, name, data[name])
    server.save(update_fields=["name", "enabled"])
    audit_record(
        tenant=server.tenant, actor=actor, action="mcp_server.update",
        object_type="mcp_server", object_id=str(server.id),
        before=before, after=mcp_server_view(server), remote_addr=remote_addr,
    )  # fmt: skip
    return server


@transaction.atomic
def mcp_server_delete(
    *, server: McpServer, actor: User | None, remote_addr: str | None = None
) -> None:
    """Delete a server and its tools; agents naming them get ENOTOOL."""
    audit_record(
        tenant=server.tenant, actor=actor, action="mcp_server.delete",
        object_type="mcp_server", object_id=str(server.id),
        before={**mcp_server_view(server),
                "tools": [t.name for t in server.tools.all()]},
        remote_addr=remote_addr,
    )  # fmt: skip
    server.delete()
