"""Gates for agents that run outside the control plane (docs/external-agents.md).

An agent in its own process asks, before a risky tool call, what the tenant's
approval policy says about it: the same rules a native run's call meets
(runs.services.policy.tenant_policy). The call belongs to the external run of
the caller's trace (created if its spans have not arrived yet). `allow` and
`deny` answer at once; `require_approval` opens an ApprovalRequest of kind
`external_call` (the inbox, the run's trace) whose decision finalises the gate
(`gate_settle`, called by runs.services.decide) instead of resuming a run.
Whoever waits hears of it through the channel layer (the long-poll) and the
webhook (runs.services.gate_webhooks).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from approvals.models import ApprovalRequest
from approvals.policy import rule_of
from approvals.services import (
    ApprovalInputError,
    ArgsEdit,
    approval_request_open_external,
)
from controlplane.celery import app as celery_app
from controlplane.models import Tenant
from controlplane.redaction import args_digest, redact
from controlplane.secrets import secret_exists
from controlplane.services import audit_record
from runs.engine.contracts import ContractError, Effect, ToolContract, ToolSource
from runs.engine.policy import PolicyAction, PolicyContext, decide_policy
from runs.engine.validation import SchemaError, prepare_schema, validate_arguments
from runs.mcp.endpoint import McpFailure
from runs.mcp.transports import checked_addresses
from runs.models import ExternalGate, Run
from runs.services.external import EXTERNAL_STOP_REASON, run_external_for_trace
from runs.services.policy import REQUESTED_BY, tenant_policy
from runs.spans import gate_span_open, gate_span_settle
from runs.tools.registry import tool_contracts_for
from tracing.broadcast import broadcaster

logger = logging.getLogger(__name__)

# The tenant secret that signs gate webhooks (secret names are identifiers).
GATE_WEBHOOK_SECRET = "gate_webhook"
WEBHOOK_TASK = "runs.tasks.gate_webhook_deliver_task"
RESOLVE_SECONDS = 3
_resolver = concurrent.futures.ThreadPoolExecutor(
    max_workers=4, thread_name_prefix="gate-webhook-resolve"
)
_SETTLED = {
    ApprovalRequest.Status.APPROVED: ExternalGate.Status.APPROVED,
    ApprovalRequest.Status.DENIED: ExternalGate.Status.DENIED,
    ApprovalRequest.Status.EXPIRED: ExternalGate.Status.EXPIRED,
    ApprovalRequest.Status.CANCELLED: ExternalGate.Status.CANCELLED,
}


class GateInputError(ValueError):
    """The ask is malformed (a field, its problem); nothing was written (400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class GateConflict(Exception):
    """The ask cannot be served as it stands (409); nothing was written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class GateKeyReused(Exception):
    """The idempotency key was used for another ask (422); nothing was written."""


@dataclass(frozen=True)
class GateAsk:
    """One tool call an external agent is about to make, as its request says."""

    tool: str
    arguments: dict[str, Any]
    trace_id: str
    span_id: str = ""
    input_schema: dict[str, Any] | None = None
    effect: str | None = None
    agent: str = ""
    idempotency_key: str | None = None
    webhook_url: str = ""
    ttl_seconds: int | None = None

    def fingerprint(self) -> str:
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def group_of(gate_id: Any) -> str:
    """The channel-layer group a long-poll of this gate listens on."""
    return f"gate.{gate_id}"


def arguments_sha256(arguments: dict[str, Any]) -> str:
    """The canonical hash an approval binds to (as a native call's)."""
    canonical = json.dumps(
        arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- the contract a gate's call is checked against ---------------------------------


def gate_contract(
    *,
    tenant_id: Any,
    tool: str,
    input_schema: dict[str, Any] | None,
    effect: str | None,
) -> tuple[ToolContract, dict[str, Any] | None]:
    """The call's contract and the schema its arguments must meet (None: any
    object). A tool the tenant knows (built-in, MCP) keeps its own contract;
    any other is what the caller declares, vouched for by its token."""
    known = tool_contracts_for(tenant_id=tenant_id).get(tool)
    if known is not None:
        return known, dict(known.input_schema)
    schema = None
    if input_schema is not None:
        try:
            schema = prepare_schema(input_schema)
        except SchemaError as exc:
            raise GateInputError("input_schema", str(exc)) from None
    try:
        contract = ToolContract(
            name=tool,
            description=f"{tool}, called by an agent outside the control plane",
            input_schema=schema or {"type": "object"},
            effect=Effect(effect or Effect.WRITE),
            source=ToolSource.TRUSTED,
        )
    except (ContractError, SchemaError, ValueError) as exc:
        raise GateInputError("tool", str(exc)) from None
    return contract, schema


def _arguments_checked(schema: dict[str, Any] | None, arguments: Any) -> None:
    if not isinstance(arguments, dict):
        raise GateInputError("arguments", "arguments must be a JSON object")
    if schema is None:
        return
    errors = validate_arguments(schema, arguments)
    if errors:
        raise GateInputError("arguments", "; ".join(errors))


def webhook_target(url: str) -> tuple[str, int, list[str]]:
    """The webhook's host, port and the addresses it may be reached at: public
    ones only (SSRF), unless GATE_WEBHOOK_ALLOW_PRIVATE (tests). Raises
    GateInputError naming `webhook_url`. Checked again at each delivery."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GateInputError("webhook_url", "the URL must be http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise GateInputError("webhook_url", "the URL may not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise GateInputError("webhook_url", "the URL's port is invalid") from None
    host = parts.hostname.lower().rstrip(".")
    allowed = [f"{host}:{port}"] if settings.GATE_WEBHOOK_ALLOW_PRIVATE else []
    # The resolver has no timeout of its own: a name whose DNS never answers
    # must not hold the request (a small pool bounds the threads it may hold).
    lookup = _resolver.submit(
        checked_addresses, host, port, allowed, label="webhook_url"
    )
    try:
        addresses = lookup.result(timeout=RESOLVE_SECONDS)
    except concurrent.futures.TimeoutError:
        raise GateInputError(
            "webhook_url",
            f"the host {host!r} did not resolve within {RESOLVE_SECONDS} s",
        ) from None
    except McpFailure as refused:
        message = str(refused).split("; an admin must")[0]
        if refused.kind == "refused":
            message += "; a webhook must reach a public address"
        raise GateInputError("webhook_url", message) from None
    return host, port, addresses


# --- asking ------------------------------------------------------------------------


def gate_request(
    *, tenant: Tenant, user: User, ask: GateAsk, remote_addr: str | None = None
) -> tuple[ExternalGate, bool]:
    """The gate for this ask and whether it is new: the policy's answer, and for
    a call that needs a human, its approval request. A repeated idempotency key
    of the same ask is the first gate; of another ask, GateKeyReused. Every
    check runs before the first write, so a refused ask writes nothing."""
    fingerprint = ask.fingerprint()
    if ask.idempotency_key is not None:
        earlier = _by_key(tenant, ask.idempotency_key, fingerprint)
        if earlier is not None:
            return earlier, False
    contract, schema = gate_contract(
        tenant_id=tenant.id,
        tool=ask.tool,
        input_schema=ask.input_schema,
        effect=ask.effect,
    )
    _arguments_checked(schema, ask.arguments)
    if ask.webhook_url:
        webhook_target(ask.webhook_url)
        if not secret_exists(tenant_id=tenant.id, name=GATE_WEBHOOK_SECRET):
            raise GateInputError(
                "webhook_url",
                f"a webhook is signed with the tenant secret {GATE_WEBHOOK_SECRET!r}, "
                "which is not set: an admin sets it on the Secrets page first",
            )
    _trace_usable(tenant, ask.trace_id)
    try:
        with transaction.atomic():
            gate = _gate_create(tenant, user, ask, contract, fingerprint, remote_addr)
    except IntegrityError:
        # A concurrent ask with the same key won: it is the answer (or refused).
        earlier = (
            _by_key(tenant, ask.idempotency_key, fingerprint)
            if ask.idempotency_key is not None
            else None
        )
        if earlier is None:
            raise
        return earlier, False
    return gate, True


def _by_key(tenant: Tenant, key: str, fingerprint: str) -> ExternalGate | None:
    earlier = ExternalGate.objects.filter(tenant=tenant, idempotency_key=key).first()
    if earlier is not None and earlier.request_sha256 != fingerprint:
        raise GateKeyReused(
            f"idempotency_key {key!r} was already used for another gate request at "
            f"{earlier.created_at.isoformat()}; a retry must repeat the first "
            "request exactly, a new call needs a new key"
        )
    return earlier


def _trace_usable(tenant: Tenant, trace_id: str) -> None:
    """The trace is this tenant's external run's, or nobody's yet."""
    if Run.objects.filter(trace_id=trace_id).exclude(tenant=tenant).exists():
        raise GateConflict(
            "trace_unavailable",
            f"trace {trace_id} cannot be used by this tenant: send the trace id "
            "of your own agent's run",
        )
    native = (
        Run.objects.filter(tenant=tenant, trace_id=trace_id)
        .exclude(stop_reason=EXTERNAL_STOP_REASON)
        .exists()
    )
    if native:
        raise GateConflict(
            "trace_of_native_run",
            f"trace {trace_id} is a run of this control plane, whose tool calls "
            "are gated as it runs; gates are for agents that run elsewhere",
        )


def _gate_create(
    tenant: Tenant,
    user: User,
    ask: GateAsk,
    contract: ToolContract,
    fingerprint: str,
    remote_addr: str | None,
) -> ExternalGate:
    now = timezone.now()
    run = run_external_for_trace(
        tenant=tenant,
        trace_id=ask.trace_id,
        service=ask.agent or "external agent",
        started_at=now,
    )
    context = PolicyContext(
        run_id=str(run.id),
        tenant_id=str(tenant.id),
        agent_name=ask.agent,
        attributes={REQUESTED_BY: user.id},
    )
    decision = decide_policy(tenant_policy, contract, ask.arguments, context)
    status = {
        PolicyAction.ALLOW: ExternalGate.Status.ALLOWED,
        PolicyAction.DENY: ExternalGate.Status.DENIED,
        PolicyAction.REQUIRE_APPROVAL: ExternalGate.Status.PENDING,
    }[decision.action]
    sha = arguments_sha256(ask.arguments)
    approval = None
    if decision.action is PolicyAction.REQUIRE_APPROVAL:
        ttl = decision.ttl_seconds or settings.APPROVAL_DEFAULT_TTL_SECONDS
        if ask.ttl_seconds is not None:  # the caller may wait less, never longer
            ttl = min(ttl, ask.ttl_seconds)
        approval = approval_request_open_external(
            tenant_id=tenant.id,
            run_id=run.id,
            tool_name=contract.name,
            args=ask.arguments,
            args_sha256=sha,
            decision=decision.to_dict(),
            ttl_seconds=ttl,
            requested_by=user,
        )
    final = status != ExternalGate.Status.PENDING
    webhook_state = ExternalGate.Webhook.NONE
    if ask.webhook_url:
        webhook_state = (
            ExternalGate.Webhook.DUE if final else ExternalGate.Webhook.WAITING
        )
    gate = ExternalGate.objects.create(
        tenant=tenant,
        run=run,
        approval=approval,
        requested_by=user,
        tool=contract.name,
        arguments=ask.arguments,
        args_sha256=sha,
        input_schema=ask.input_schema if ask.input_schema is not None else None,
        effect=str(contract.effective_effect),
        agent=ask.agent,
        span_id=ask.span_id,
        decision=str(decision.action),
        rule=decision.rule,
        reason=decision.reason,
        status=status,
        idempotency_key=ask.idempotency_key or "",
        request_sha256=fingerprint,
        webhook_url=ask.webhook_url,
        webhook_state=webhook_state,
        webhook_next_at=now if final and ask.webhook_url else None,
        finalised_at=now if final else None,
    )
    audit_record(
        tenant=tenant,
        actor=user,
        action="gate.request",
        object_type="gate",
        object_id=str(gate.id),
        after={
            "run": str(run.id),
            "trace_id": ask.trace_id,
            "tool": gate.tool,
            "args_sha256": args_digest(sha),
            "decision": gate.decision,
            "status": gate.status,
            "rule": gate.rule,
            "approval": str(approval.id) if approval else None,
            "webhook": bool(ask.webhook_url),
        },
        remote_addr=remote_addr,
    )
    if approval is not None:
        gate_span_open(run, approval=approval, parent_span_id=ask.span_id)
    if final and ask.webhook_url:
        _webhook_enqueue_on_commit(gate.id)
    return gate


# --- finalising ------------------------------------------------------------------


def gate_settle(*, request: ApprovalRequest) -> ExternalGate | None:
    """The gate's approval is final: so is the gate (approved, denied, expired,
    cancelled). Inside the decision's transaction; waiters and the webhook
    hear of it once it commits. A second call changes nothing."""
    status = _SETTLED.get(ApprovalRequest.Status(request.status))
    if status is None:
        return None
    now = timezone.now()
    updated = ExternalGate.objects.filter(
        approval_id=request.id, status=ExternalGate.Status.PENDING
    ).update(status=status, finalised_at=now)
    gate = ExternalGate.objects.filter(approval_id=request.id).first()
    if gate is None or not updated:
        return gate
    if gate.webhook_state == ExternalGate.Webhook.WAITING:
        ExternalGate.objects.filter(id=gate.id).update(
            webhook_state=ExternalGate.Webhook.DUE, webhook_next_at=now
        )
        _webhook_enqueue_on_commit(gate.id)
    gate_span_settle(gate.run, approval=request)
    gate_id = gate.id
    transaction.on_commit(lambda: gate_notify(gate_id=gate_id))
    return gate


def gate_notify(*, gate_id: Any) -> None:
    """Wake this gate's long-polls (a fast path: they re-read the row)."""
    broadcaster().send([group_of(gate_id)], {"type": "gate.final"})


def _webhook_enqueue_on_commit(gate_id: Any) -> None:
    """Deliver once committed. The task is named, not imported (`runs.tasks`
    imports the services); a lost enqueue is found by the due sweep."""

    def enqueue() -> None:
        try:
            celery_app.signature(WEBHOOK_TASK).apply_async(
                kwargs={"gate_id": str(gate_id)}
            )
        except BrokerUnavailable:
            logger.warning("gate %s: webhook not enqueued; the sweep will", gate_id)

    transaction.on_commit(enqueue)


def gate_view(gate: ExternalGate) -> dict[str, Any]:
    """The gate as the API answers it, the long-poll returns it and the webhook
    posts it. `arguments` are the ones to execute with (an approver's edit, if
    any), redacted like every argument the API shows: a value shown as the
    placeholder stands for the one the caller sent."""
    approval = gate.approval
    arguments = approval.args_snapshot if approval is not None else gate.arguments
    reason = gate.reason
    if approval is not None and approval.status != ApprovalRequest.Status.PENDING:
        reason = approval.reason or reason
    decider = approval.decided_by if approval is not None else None
    return {
        "id": str(gate.id),
        "run_id": str(gate.run_id),
        "trace_id": gate.run.trace_id,
        "tool": gate.tool,
        "arguments": redact(arguments),
        "decision": gate.decision,
        "status": gate.status,
        "final": gate.status != ExternalGate.Status.PENDING,
        "rule": gate.rule,
        "reason": redact(reason),
        "approval_id": str(approval.id) if approval is not None else None,
        "decided_by": decider.get_username() if decider is not None else None,
        "decided_at": _iso(approval.decided_at if approval is not None else None),
        "expires_at": _iso(approval.expires_at if approval is not None else None),
    }


def _iso(moment: Any) -> str | None:
    return moment.isoformat() if moment is not None else None


# --- an approver's edit --------------------------------------------------------------


def gate_args_edit(request: ApprovalRequest, args: dict[str, Any]) -> ArgsEdit | None:
    """Check an approver's edit of a gated external call: the call's schema and
    the tenant's policy, as for a native call; None when unchanged."""
    gate = ExternalGate.objects.filter(approval_id=request.id).first()
    if gate is None:
        raise ApprovalInputError("args", "this approval's gate is gone")
    contract, schema = gate_contract(
        tenant_id=request.tenant_id,
        tool=gate.tool,
        input_schema=gate.input_schema,
        effect=gate.effect,
    )
    try:
        _arguments_checked(schema, args)
    except GateInputError as invalid:
        raise ApprovalInputError("args", str(invalid)) from None
    sha = arguments_sha256(args)
    if sha == request.args_sha256:
        return None
    context = PolicyContext(
        run_id=str(request.run_id),
        tenant_id=str(request.tenant_id),
        agent_name=gate.agent,
        attributes={REQUESTED_BY: gate.requested_by_id},
    )
    decision = decide_policy(tenant_policy, contract, args, context)
    if decision.action is PolicyAction.DENY:
        raise ApprovalInputError(
            "args", f"the edited arguments are denied by policy: {decision.reason}"
        )
    changes: dict[str, Any] = {}
    rule = rule_of(decision.to_dict())
    if (
        decision.action is PolicyAction.REQUIRE_APPROVAL
        and rule is not None
        and rule.approvals_required > request.approvals_required
    ):
        changes = {
            "rule": decision.rule,
            "rule_ref": rule,
            "rule_reason": decision.reason,
            "approvals_required": rule.approvals_required,
            "approver_roles": rule.approver_roles,
            "starter_may_approve": rule.starter_may_approve
            and request.starter_may_approve,
        }
    return ArgsEdit(dict(args), sha, changes)
