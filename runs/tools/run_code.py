"""`run_code`: run a Python snippet in the sandbox runner; its result is the
observation. Nothing of the worker (environment, files, network) reaches it.

An agent version's `tool_settings["run_code"]` may give it egress (`network`) and
credentials the sandbox's proxy adds (`credentials`), see runs/tools/egress.py;
`run_code_tool` builds the tool for those settings.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from controlplane import metrics
from controlplane.secrets import SecretMissing, secret_value
from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, ToolFailure, ToolResult
from runs.engine.tools import Tool, ToolContext
from runs.sandbox import (
    Limits,
    NetworkPolicy,
    SandboxSettings,
    SandboxSpec,
    SandboxSpecError,
    SandboxUnavailable,
    run_in_sandbox,
    workspace_create,
    workspace_release,
)
from runs.tools.egress import (
    CREDENTIALS,
    NETWORK,
    EgressSettingsError,
    egress_policy_for,
    egress_targets,
)

SCRIPT_NAME = "main.py"
# The sandbox's own codes, as the envelope codes the model and policies know.
SANDBOX_ERROR_CODES = {
    "ETIMEDOUT": ErrorCode.ETIMEDOUT,
    "ECPU": ErrorCode.ELIMIT,
    "EMEMORY": ErrorCode.ELIMIT,
    "EPIDS": ErrorCode.ELIMIT,
    "EOUTPUT": ErrorCode.EOUTPUT,
    "EDISK": ErrorCode.EDISK,
    "EFBIG": ErrorCode.EDISK,
    "EPATH": ErrorCode.EPATH,
    "ENOENT": ErrorCode.EINVAL,
    "EACCES": ErrorCode.EACCES,
}


def sandbox_settings() -> SandboxSettings:
    root = Path(settings.SANDBOX_ROOT)
    return SandboxSettings(
        workspace_root=root / "workspaces",
        state_dir=root / "state",
        required_layers=frozenset(settings.SANDBOX_REQUIRED_LAYERS),
        workspace_mb=settings.SANDBOX_WORKSPACE_MB,
        egress_ca_file=settings.SANDBOX_EGRESS_CA_FILE or None,
    )


def _network(
    egress: Mapping[str, Any] | None, ctx: ToolContext, read: list[str]
) -> NetworkPolicy:
    """The call's allowlist, with the tenant's secrets read here, on the host: they
    go to the proxy's memory only, never into the sandbox (`read` remembers them,
    so an upstream that echoes its request headers cannot pass one to the model
    through the program's output)."""
    if not egress:
        return NetworkPolicy()

    def secret(name: str) -> str:
        value = secret_value(tenant_id=ctx.tenant_id, name=name)
        read.append(value)
        return value

    try:
        return egress_policy_for(egress, secret_value=secret, field="run_code")
    except EgressSettingsError as exc:
        raise ToolFailure(
            ErrorCode.EACCES,
            f"run_code's egress settings are invalid ({exc}); ask an operator",
            retryable=False,
            suggested_action="do_not_retry_ask_an_operator",
        ) from exc
    except SecretMissing as exc:  # the message names the secret, never a value
        raise ToolFailure(
            ErrorCode.EACCES,
            f"run_code cannot reach its credentialed hosts: {exc}",
            retryable=False,
            suggested_action="do_not_retry_ask_an_operator",
        ) from exc


def run_code(
    arguments: dict[str, Any],
    ctx: ToolContext,
    *,
    egress: Mapping[str, Any] | None = None,
) -> ToolResult:
    read: list[str] = []
    network = _network(egress, ctx, read)
    return _outcome(arguments, network).without_values(read)


def _outcome(arguments: dict[str, Any], network: NetworkPolicy) -> ToolResult:
    config = sandbox_settings()
    try:
        workspace = workspace_create(settings=config, label="run-code")
    except OSError as exc:
        raise ToolFailure(ErrorCode.EINTERNAL, f"no sandbox workspace: {exc}") from exc
    try:
        script = workspace / SCRIPT_NAME
        script.write_text(arguments["code"])
        script.chmod(0o644)
        spec = SandboxSpec(
            argv=[config.python, "-I", SCRIPT_NAME],
            workspace=workspace,
            env={"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
            limits=Limits(
                wall_seconds=float(arguments.get("timeout_seconds", 10)),
                cpu_seconds=10.0,
                memory_mb=256,
                pids=32,
                output_bytes=settings.SANDBOX_OUTPUT_BYTES,
            ),
            network=network,
        )
        try:
            outcome = run_in_sandbox(spec, config)
        except SandboxUnavailable as exc:
            raise ToolFailure(
                ErrorCode.EACCES,
                f"the sandbox cannot run here: {exc}",
                retryable=False,
                suggested_action="do_not_retry_ask_an_operator",
            ) from exc
        except SandboxSpecError as exc:
            raise ToolFailure(ErrorCode.EINVAL, str(exc)) from exc
    finally:
        workspace_release(workspace, settings=config)
    metrics.sandbox_terminated(cause=str(outcome.termination_cause))
    report = outcome.to_dict()
    shown = ("exit_code", "signal_name", "termination_cause", "stdout", "stderr",
             "stdout_truncated", "output_limited", "duration_ms")  # fmt: skip
    data = {key: report[key] for key in shown}
    # The full report (enforcement, limits, counters) goes to the trace, once.
    evidence = {k: v for k, v in report.items() if k not in ("stdout", "stderr")}
    refs = ({"kind": "sandbox_result", "result": evidence},)
    if outcome.ok:
        return ToolResult.success(data, refs=refs)
    if outcome.error is None:
        message = f"the program ended with {outcome.termination_cause}"
        if outcome.exit_code is not None:
            message += f" (exit code {outcome.exit_code})"
        code = ErrorCode.EINVAL  # a failing program: the model can fix its code
    else:
        code = SANDBOX_ERROR_CODES.get(outcome.error, ErrorCode.EINTERNAL)
        message = outcome.detail or outcome.error
    return ToolResult.failure(
        code, message, retryable=outcome.retryable, data=data, refs=refs
    )


RUN_CODE_TOOL = Tool(
    ToolContract(
        name="run_code",
        description=(
            "Run a short Python 3 program in an isolated sandbox with no network and "
            "a throwaway workspace; returns its exit status, stdout and stderr."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "code": {"type": "string", "minLength": 1, "maxLength": 100_000},
                "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 60},
            },
            "required": ["code"],
        },
        # Its only effects stay inside a throwaway workspace with no network.
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    ),
    run_code,
    timeout_seconds=None,  # the sandbox's own wall clock kills the whole tree
)


def run_code_tool(tool_settings: Mapping[str, Any] | None = None) -> Tool:
    """run_code as an agent version configures it (`tool_settings["run_code"]`).
    Without egress it is the read-only RUN_CODE_TOOL; with a network allowlist a
    program can change the world outside (a POST to an allowed API), so the
    contract says irreversible_external and the tenant's policy decides (an
    approval by default; the agent's per-tool `approval` override applies)."""
    egress = {
        key: value
        for key, value in (tool_settings or {}).items()
        if key in (NETWORK, CREDENTIALS)
    }
    if not egress.get(NETWORK):
        return RUN_CODE_TOOL
    targets = egress_targets(egress)
    credentialed = sorted(str(key) for key in egress.get(CREDENTIALS) or {})
    description = (
        "Run a short Python 3 program in an isolated sandbox with a throwaway "
        "workspace; returns its exit status, stdout and stderr. Network: only "
        "through the HTTP proxy in HTTP_PROXY/HTTPS_PROXY (urllib uses it), to "
        + ", ".join(str(t).removeprefix("private:") for t in targets)
        + "; there is no DNS and nothing else is reachable."
    )
    if credentialed:
        description += (
            " The proxy adds the credentials for "
            + ", ".join(credentialed)
            + " itself: request those as plain http://HOST:PORT/... URLs (the proxy "
            "opens TLS), and never put credentials in the code."
        )
    contract = dataclasses.replace(
        RUN_CODE_TOOL.contract,
        description=description,
        effect=Effect.IRREVERSIBLE_EXTERNAL,
        idempotency=Idempotency.NONE,
    )
    return dataclasses.replace(
        RUN_CODE_TOOL,
        contract=contract,
        handler=functools.partial(run_code, egress=egress),
    )
