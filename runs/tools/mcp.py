"""MCP tools as agent tools: `mcp:<server_slug>/<tool_name>` refs become `Tool`s.

Each gets our eight-field contract from what the tenant set, never from what the
server says: the model sees the accepted (pinned) name, description and schema;
the effect is the tenant's or, unset, an irreversible external write from an
untrusted source (annotations are hints shown to the admin, nothing more); the
tool needs approval unless the tenant said otherwise. Only active tools of
enabled servers are registered: a changed, removed or invalid tool is not in the
registry (ENOTOOL), and a change the host has not seen yet is caught at call
time, when the server is asked for the definition again before the call (EPERM).

A call opens one session (stdio: one sandbox), checks the definition, calls,
and closes it; errors map to our codes (spec §2.7): `isError` is an error the
model may fix, a JSON-RPC error or a transport failure is the host's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from django.db import transaction

from controlplane.services import audit_record
from runs.engine.contracts import (
    ApprovalNeed,
    ContractError,
    Effect,
    Idempotency,
    ToolContract,
    ToolCost,
    ToolSource,
    parse_quota,
)
from runs.engine.disclosure import is_deferred
from runs.engine.envelope import ErrorCode, SuggestedAction, ToolFailure, ToolResult
from runs.engine.tools import Tool, ToolContext
from runs.mcp.client import mcp_call_tool
from runs.mcp.connection import mcp_endpoint_for, sandbox_evidence
from runs.mcp.endpoint import McpFailure, McpInputRequired, clip, mcp_model_name
from runs.mcp.pinning import mcp_listing_apply
from runs.models import McpServer, McpTool
from runs.tools.egress import CREDENTIALS, EgressSettingsError, egress_secret_names
from runs.tools.elicitation import elicitation_answers_for, input_required_result

MCP_REF_PREFIX = "mcp:"
# Text kept of one result (the observation shown to the model is bounded again).
MAX_RESULT_TEXT_CHARS = 200_000
# Codes an `isError` result may name in its structured error; anything else is
# EINVAL (the model may fix it).
_ACTIONS = frozenset(action.value for action in SuggestedAction)
_TOOL_ERROR_CODES = {
    ErrorCode.EINVAL,
    ErrorCode.EPERM,
    ErrorCode.EACCES,
    ErrorCode.EPATH,
    ErrorCode.ETIMEDOUT,
}


def parse_mcp_ref(ref: str) -> tuple[str, str] | None:
    """(server_slug, tool_name) of `mcp:<server_slug>/<tool_name>`, else None."""
    if not ref.startswith(MCP_REF_PREFIX):
        return None
    slug, sep, name = ref[len(MCP_REF_PREFIX) :].partition("/")
    if not sep or not slug or not name:
        return None
    return slug, name


def _rows_for(refs: Iterable[str], *, tenant_id: Any) -> dict[str, McpTool | None]:
    wanted = {ref: parse_mcp_ref(ref) for ref in refs if ref.startswith(MCP_REF_PREFIX)}
    slugs = {parsed[0] for parsed in wanted.values() if parsed is not None}
    found = {
        (tool.server.slug, tool.name): tool
        for tool in McpTool.objects.filter(
            server__tenant_id=tenant_id, server__slug__in=slugs
        ).select_related("server")
    }
    return {
        ref: None if parsed is None else found.get(parsed)
        for ref, parsed in wanted.items()
    }


def unknown_mcp_refs(refs: Iterable[str], *, tenant_id: Any) -> list[str]:
    """The `mcp:` refs that name no tool of this tenant's servers (a removed tool
    is unknown too)."""
    return [
        ref
        for ref, row in _rows_for(refs, tenant_id=tenant_id).items()
        if row is None or row.status == McpTool.Status.REMOVED
    ]


def mcp_tools_for(
    refs: Iterable[str],
    *,
    tenant_id: Any,
    tool_settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Tool]:
    """The usable MCP tools among `refs`: active tools of enabled servers."""
    tools: list[Tool] = []
    for ref, row in _rows_for(refs, tenant_id=tenant_id).items():
        if row is None or row.status != McpTool.Status.ACTIVE or not row.server.enabled:
            continue
        try:
            tools.append(mcp_tool(row, settings=(tool_settings or {}).get(ref) or {}))
        except ValueError:  # ContractError, SchemaError: not offered (ENOTOOL)
            continue
    return tools


def mcp_contracts_of(*, tenant_id: Any) -> dict[str, ToolContract]:
    """The contracts of the tenant's usable MCP tools by the name the model sees
    (approval rules and an approver's edit check against them)."""
    rows = McpTool.objects.filter(
        server__tenant_id=tenant_id,
        server__enabled=True,
        status=McpTool.Status.ACTIVE,
    ).select_related("server")
    contracts: dict[str, ToolContract] = {}
    for row in rows:
        try:
            contract = mcp_contract(row)
        except ValueError:  # ContractError, SchemaError: not a usable tool
            continue
        contracts[contract.name] = contract
    return contracts


def mcp_contract(row: McpTool, *, approval: str = "") -> ToolContract:
    """The eight-field contract of a pinned tool, from the tenant's settings."""
    declared = bool(row.effect)
    need = ApprovalNeed.ALWAYS if row.requires_approval else ApprovalNeed.POLICY
    if approval in ApprovalNeed.__members__.values():
        # The agent's per-tool override (tool_settings[ref]["approval"]).
        need = ApprovalNeed(approval) if approval != "policy" else need
    return ToolContract(
        name=mcp_model_name(row.server.slug, row.name),
        description=row.accepted_description or f"{row.name} (MCP tool)",
        input_schema=row.accepted_input_schema,
        effect=Effect(row.effect) if declared else Effect.IRREVERSIBLE_EXTERNAL,
        idempotency=Idempotency(row.idempotency),
        # The tenant vouched for the effect; the server's own claims never count.
        source=ToolSource.TRUSTED if declared else ToolSource.UNTRUSTED,
        # The server's auth secret, or its egress credentials' secrets, are the
        # only secrets its calls may read.
        auth_scope=" ".join(f"secrets:{name}" for name in _secrets_of(row.server))
        or None,
        cost=ToolCost(quota=_quota(row.quota)),
        version=row.accepted_sha256[:16],
        approval=need,
    )


def _secrets_of(server: McpServer) -> list[str]:
    names = [server.auth_secret] if server.auth_secret else []
    return names + egress_secret_names({CREDENTIALS: server.credentials})


def _quota(declared: str) -> str | None:
    """The tenant's quota; one stored that no longer parses refuses every call
    (fail-safe) rather than lifting the limit."""
    try:
        parse_quota(declared, tool_name="mcp")
    except ContractError:
        return "0/run"
    return declared or None


def mcp_tool(row: McpTool, *, settings: Mapping[str, Any]) -> Tool:
    server_id, tool_id, name = row.server_id, row.id, row.name
    pinned, timeout = row.accepted_sha256, float(row.timeout_seconds)
    approval = str(settings.get("approval") or "")
    contract = mcp_contract(row, approval=approval)

    def handler(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return _call(
            server_id, tool_id, name, pinned, timeout, arguments, contract, ctx
        )

    # Inline (it reads the database): the session's own deadline ends the call,
    # its SDK loop on a thread of its own that is waited for at most that long.
    return Tool(contract, handler, timeout_seconds=None, deferred=is_deferred(settings))


def _call(
    server_id: Any,
    tool_id: Any,
    name: str,
    pinned: str,
    timeout: float,
    arguments: dict[str, Any],
    contract: ToolContract,
    ctx: ToolContext,
) -> ToolResult:
    server = McpServer.objects.filter(id=server_id).first()
    row = McpTool.objects.filter(id=tool_id).first()
    if server is None or row is None or not server.enabled:
        raise ToolFailure(ErrorCode.ENOTOOL, f"{contract.name} is no longer registered")
    if row.status != McpTool.Status.ACTIVE or row.accepted_sha256 != pinned:
        raise ToolFailure(
            ErrorCode.EPERM,
            f"{contract.name} is disabled ({row.status}): its definition must be "
            "accepted again by an admin",
        )
    # The auth secret and egress credentials come through the context, as the
    # contract's auth_scope allows (EACCES otherwise, naming the secret, never a
    # value).
    try:
        endpoint = mcp_endpoint_for(server, timeout_seconds=timeout, secret=ctx.secret)
    except EgressSettingsError as invalid:
        raise ToolFailure(
            ErrorCode.EACCES,
            f"{contract.name} cannot reach its credentialed hosts ({invalid}); "
            "ask an operator",
            retryable=False,
            suggested_action="do_not_retry_ask_an_operator",
        ) from None
    # The server may ask a person (elicitation): the answers given so far go
    # to its requests in order; one more stops the call for a new question.
    answers = elicitation_answers_for(run_id=ctx.run_id, call_id=ctx.call_id)
    try:
        result = mcp_call_tool(
            endpoint, name, arguments, timeout_seconds=timeout, pinned_sha256=pinned,
            elicitation_answers=answers,
        )  # fmt: skip
    except McpInputRequired as asked:
        return input_required_result(contract.name, asked.message, asked.schema)
    except McpFailure as failure:
        if failure.listing is not None:
            # The server changed under us: pin what it lists now, disabling the
            # tool, and say so in the audit log as a refresh by nobody.
            with transaction.atomic():
                changes = mcp_listing_apply(server=server, listing=failure.listing)
                audit_record(
                    tenant=server.tenant, actor=None, action="mcp_server.refresh",
                    object_type="mcp_server", object_id=str(server.id),
                    after={**changes.to_dict(), "seen_by": f"a call of {name}"},
                )  # fmt: skip
        refused = _failure_result(failure, contract).result
        return replace(refused, refs=sandbox_evidence(endpoint))
    outcome = _result(result.is_error, result.text, result.content, result.structured)
    return replace(outcome, refs=sandbox_evidence(endpoint))


def _failure_result(failure: McpFailure, contract: ToolContract) -> ToolFailure:
    read_only = contract.effective_effect is Effect.READ_ONLY
    message = str(failure)
    if failure.kind == "changed":
        return ToolFailure(
            ErrorCode.EPERM,
            f"{message}; {contract.name} is disabled until an admin accepts the new "
            "definition",
            suggested_action="stop_and_request_human",
        )
    if failure.kind == "removed":
        return ToolFailure(ErrorCode.ENOTOOL, message)
    if failure.kind == "timeout":
        # Not retried by the host: each retry would hold the step another deadline.
        return ToolFailure(
            ErrorCode.ETIMEDOUT,
            message + ("" if read_only else "; the call may have taken effect"),
            retryable=False,
        )
    if failure.kind == "too_large":
        return ToolFailure(ErrorCode.EOUTPUT, message, retryable=False)
    if failure.kind == "refused":
        return ToolFailure(ErrorCode.EACCES, message)
    if failure.kind == "protocol" and failure.code == -32602:
        return ToolFailure(ErrorCode.EINVAL, message)
    if failure.kind == "protocol" and failure.code == -32601:
        return ToolFailure(ErrorCode.ENOTOOL, message)
    # Unreachable, garbage, any other protocol error: the host's problem, and for
    # a write, whether it took effect is not known.
    return ToolFailure(
        ErrorCode.EINTERNAL,
        message,
        retryable=read_only and failure.kind == "unreachable",
        suggested_action="retry_later" if read_only else "check_state_before_retrying",
    )


def _result(
    is_error: bool, text: str, content: list[dict[str, Any]], structured: Any
) -> ToolResult:
    shown_text = text[:MAX_RESULT_TEXT_CHARS]
    data: dict[str, Any] = {"text": shown_text}
    if len(text) > MAX_RESULT_TEXT_CHARS:
        data["text_truncated"] = True
        data["text_chars"] = len(text)
    others = [block for block in content if block.get("type") != "text"]
    if others:
        data["content"] = others[:20]
    if structured is not None:
        encoded = json.dumps(structured, default=str)
        if len(encoded) <= MAX_RESULT_TEXT_CHARS:
            data["structured"] = structured
    if not is_error:
        return ToolResult.success(data)
    code = ErrorCode.EINVAL
    retryable: bool | None = None
    action: str | None = None
    error = structured.get("error") if isinstance(structured, Mapping) else None
    if isinstance(error, Mapping):
        if error.get("code") in _TOOL_ERROR_CODES:
            code = ErrorCode(str(error["code"]))
        # The tool's own word on its error drives the host (spec §1.5), as a
        # built-in tool's does. It can only make the host stop sooner or ask a
        # person: what the host retries on its own stays the engine's rule (a
        # read, bounded), and only the known action tokens are taken.
        if isinstance(error.get("retryable"), bool):
            retryable = error["retryable"]
        if error.get("suggested_action") in _ACTIONS:
            action = str(error["suggested_action"])
    return ToolResult.failure(
        code,
        f"the MCP tool reported an error: {clip(text, 1000)}",
        retryable=retryable,
        suggested_action=action,
        data=data,
    )
