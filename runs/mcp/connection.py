"""How the host reaches a registered server: the endpoint of an `McpServer` row.

HTTP: the URL (a private or loopback host only when the server's `network` lists
it as `private:HOST:PORT`, the egress allowlist's form), with the tenant secret
named by `auth_secret` sent as its auth header; the value is read here, at
connection time, and goes nowhere else. stdio: the
command runs inside the sandbox for one session, with no network unless the
server's `network` allows hosts through the egress proxy (which adds the
`credentials` headers itself), a throwaway workspace, and the operator's
read-only paths (MCP_STDIO_READONLY_PATHS, on PYTHONPATH).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from controlplane.secrets import secret_value
from runs.mcp.endpoint import McpEndpoint, PipedProcess, StdioFactory
from runs.models import McpServer
from runs.sandbox import (
    HostPort,
    Limits,
    NetworkPolicy,
    SandboxResult,
    SandboxSettings,
    SandboxSpec,
    workspace_create,
    workspace_release,
)
from runs.sandbox.piped import SandboxProcess, open_sandbox_process
from runs.tools.egress import CREDENTIALS, NETWORK, egress_policy_for
from runs.tools.run_code import sandbox_settings


def label_of(server: McpServer) -> str:
    return f"MCP server {server.slug!r}"


class _SandboxedServer:
    """One stdio session's sandbox: its workspace goes when the process does."""

    def __init__(
        self,
        process: SandboxProcess,
        workspace: Path,
        config: SandboxSettings,
        results: list[SandboxResult],
    ):
        self._process = process
        self._workspace = workspace
        self._config = config
        self._results = results
        self.stdin = process.stdin
        self.stdout = process.stdout

    def stop(self, grace_seconds: float = 2.0) -> str:
        try:
            result = self._process.stop(grace_seconds)
        finally:
            workspace_release(self._workspace, settings=self._config)
        if result is not None:
            self._results.append(result)
        else:
            error = self._process.error
            return f"the sandbox could not run it ({type(error).__name__}: {error})"
        if result.termination_cause == "exit" and result.exit_code == 0:
            return ""
        ended = f"the command ended with {result.termination_cause}"
        if result.exit_code is not None:
            ended += f" (exit code {result.exit_code})"
        if result.detail:
            ended += f": {result.detail}"
        return ended


class SandboxedStdio:
    """Starts the server's command in a new sandbox per session; keeps each
    session's judged result (the enforcement map, the egress log) for the trace."""

    def __init__(self, start: StdioFactory, results: list[SandboxResult]) -> None:
        self._start = start
        self.results = results

    def __call__(self) -> PipedProcess:
        return self._start()


def sandbox_evidence(endpoint: McpEndpoint) -> tuple[dict[str, Any], ...]:
    """`sandbox_result` refs of the sessions a stdio endpoint ran (the trace's
    sandbox span: enforcement, limits, each egress connection), output left out."""
    if not isinstance(endpoint.stdio, SandboxedStdio):
        return ()
    return tuple(
        {
            "kind": "sandbox_result",
            "result": {
                k: v
                for k, v in result.to_dict().items()
                if k not in ("stdout", "stderr")
            },
        }
        for result in endpoint.stdio.results
    )


def stdio_network(
    server: McpServer, secret: Callable[[str], str] | None = None
) -> NetworkPolicy:
    """A stdio server's allowlist, with its egress credentials' values read here,
    on the host, for the proxy's memory only (never the sandbox's). `secret`
    reads them for a call (its contract's auth_scope names them); without, the
    tenant's store is read (a listing). A secret not set raises a LookupError (or
    the call's ToolFailure) naming it; settings that cannot be used raise
    EgressSettingsError."""
    if not server.credentials:
        return NetworkPolicy(tuple(HostPort.parse(item) for item in server.network))

    def read(name: str) -> str:
        if secret is not None:
            return secret(name)
        return secret_value(tenant_id=server.tenant_id, name=name)

    egress = {NETWORK: list(server.network), CREDENTIALS: dict(server.credentials)}
    return egress_policy_for(egress, secret_value=read, field="server")


def _sandboxed(
    server: McpServer, wall_seconds: float, network: NetworkPolicy
) -> SandboxedStdio:
    config = sandbox_settings()
    results: list[SandboxResult] = []
    readonly = [p for p in settings.MCP_STDIO_READONLY_PATHS if Path(p).is_dir()]
    argv = [str(arg) for arg in server.command]

    def start() -> PipedProcess:
        workspace = workspace_create(settings=config, label="mcp")
        spec = SandboxSpec(
            argv=argv,
            workspace=workspace,
            env={
                "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": ":".join(readonly),
            },
            limits=Limits(
                wall_seconds=wall_seconds,
                cpu_seconds=wall_seconds,
                memory_mb=settings.MCP_STDIO_MEMORY_MB,
                pids=64,
                output_bytes=settings.SANDBOX_OUTPUT_BYTES,
            ),
            network=network,
            readonly_paths=readonly,
        )
        try:
            process = open_sandbox_process(spec, config)
        except BaseException:
            workspace_release(workspace, settings=config)
            raise
        return _SandboxedServer(process, workspace, config, results)

    return SandboxedStdio(start, results)


def mcp_endpoint_for(
    server: McpServer,
    *,
    timeout_seconds: float,
    secret: Callable[[str], str] | None = None,
) -> McpEndpoint:
    """The endpoint of `server` for one session of at most `timeout_seconds`.

    `secret` reads the auth secret or a stdio server's egress credentials (a
    call's context: its contract's auth_scope names them); without, the tenant's
    store is read directly (an admin's registration or refresh)."""
    label = label_of(server)
    cap, most = settings.MCP_MAX_RESPONSE_BYTES, settings.MCP_MAX_TOOLS
    if server.transport == McpServer.Transport.STDIO:
        network = stdio_network(server, secret)
        # The wall clock kills the sandbox a little after the session's deadline.
        return McpEndpoint(
            label=label,
            stdio=_sandboxed(server, timeout_seconds + 3, network),
            max_response_bytes=cap,
            max_tools=most,
        )
    return McpEndpoint(
        label=label,
        max_response_bytes=cap,
        max_tools=most,
        url=server.url,
        headers=auth_headers(server, secret),
        # Only entries an admin marked `private:` let the URL name a private host.
        allowed_private=tuple(
            str(HostPort(target.host, target.port))
            for target in map(HostPort.parse, server.network)
            if target.private
        ),
    )


def auth_headers(
    server: McpServer, secret: Callable[[str], str] | None = None
) -> dict[str, str]:
    """The auth header of an HTTP server, from the tenant's secret (a LookupError
    names it when it is not set)."""
    if not server.auth_secret:
        return {}
    if secret is not None:
        value = secret(server.auth_secret)
    else:
        value = secret_value(tenant_id=server.tenant_id, name=server.auth_secret)
    return {server.auth_header: f"{server.auth_prefix}{value}"}
