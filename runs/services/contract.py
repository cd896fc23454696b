"""The host's side of the tool contract's host-only fields (docs/engine.md,
"Contract enforcement"), for built-in and MCP tools alike.

- `auth_scope` secrets: a tool reads the tenant's secrets only through its
  context, and only those its scope names (`secret_reader_for` is the raw lookup
  the engine wraps); permissions: the run's starter must hold each one in the
  run's tenant when the call executes.
- `cost.quota`: per tenant and period, taken race-safely in the database before
  the call executes (budgets/quotas.py); per run, counted in the engine state.
- A non-retryable error repeated: `repeated_error_ask` asks a person whether the
  run may go on (an approval of kind `tool_error`); `run_end_repeated_error` ends
  the run when the person says no or nobody answers in time.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from approvals.models import ApprovalRequest
from approvals.services import approval_request_open_question
from budgets.quotas import tool_quota_take
from controlplane.models import Membership
from controlplane.permissions import Action, role_may
from controlplane.secrets import SecretMissing, secret_value
from runs.engine.enforcement import (
    REPEATED_ERROR_RULE,
    ContractLedger,
    Escalation,
    quota_refused_result,
    run_quota_refusal,
)
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.stop import StopReason, terminal_status
from runs.engine.tools import SecretReader, Tool
from runs.models import Run
from runs.services.admission import budget_run_ended
from runs.services.lifecycle import run_end_unheld
from runs.spans import run_root_end

logger = logging.getLogger(__name__)


def secret_reader_for(*, tenant_id: Any, names: frozenset[str]) -> SecretReader:
    """The run's tenant's secrets named in a tool's auth_scope (`names`), for the
    engine to hand the tool through `ToolContext.secret`. Read here, in the step's
    thread (a handler may run on a thread of its own, which must not open a
    database connection); a secret that cannot be read raises SecretMissing (a
    LookupError naming it, never a value) when the tool asks for it."""
    values: dict[str, str] = {}
    missing: dict[str, SecretMissing] = {}
    for name in names:
        try:
            values[name] = secret_value(tenant_id=tenant_id, name=name)
        except SecretMissing as exc:
            missing[name] = exc

    def read(name: str) -> str:
        if name in values:
            return values[name]
        raise missing.get(name) or SecretMissing(name)

    return read


def _permission_problem(run: Run, permissions: frozenset[str]) -> str | None:
    if not permissions:
        return None
    role = (
        Membership.objects.filter(
            tenant_id=run.tenant_id, user_id=run.started_by_id, user__is_active=True
        )
        .values_list("role", flat=True)
        .first()
        if run.started_by_id is not None
        else None
    )
    for name in sorted(permissions):
        try:
            action = Action(name)
        except ValueError:
            return f"unknown permission {name}"  # fail-safe: a typo grants nothing
        if role is None or not role_may(role, action):
            return f"{name} (starter's role: {role or 'none'})"
    return None


def contract_refusal(
    *,
    run: Run,
    tool: Tool,
    ledger: ContractLedger,
    first_attempt: bool,
    continuation: bool = False,
) -> ToolResult | None:
    """Why the call may not execute now under the tool's contract, or None (it
    may, and its tenant period quotas are taken). Checked when the call is about
    to execute: after any approval, so a permission or quota that changed while
    it waited counts. `first_attempt`: False when the call already took its
    quotas (a re-run after a crash). `continuation`: the call ran and counted
    already and runs again to complete (its permission is checked again, no
    quota)."""
    contract = tool.contract
    problem = _permission_problem(run, contract.scope.permissions)
    if problem is not None:
        logger.info("run %s: %s refused, missing permission %s", run.id, tool, problem)
        # The model is not told which permission: a scope shown invites probing.
        return ToolResult.failure(
            ErrorCode.EACCES,
            f"{tool.name} was not executed: the user who started this run may not "
            "use it",
        )
    if continuation:
        return None
    over_run_quota = run_quota_refusal(tool, ledger)
    if over_run_quota is not None or not first_attempt:
        return over_run_quota
    refused = tool_quota_take(tenant_id=run.tenant_id, limits=contract.quotas)
    return None if refused is None else quota_refused_result(tool.name, refused)


def repeated_error_ask(*, run: Run, escalation: Escalation) -> ApprovalRequest:
    """Ask whether the run may go on after the repeated error (approve: it goes
    on; deny or expiry: it ends `repeated_error`). The caller makes it wait."""
    return approval_request_open_question(
        tenant_id=run.tenant_id,
        run_id=run.id,
        tool_name=escalation.tool_name,
        rule=REPEATED_ERROR_RULE,
        question=escalation.question(),
        details={"code": escalation.code, "message": escalation.message},
    )


@transaction.atomic
def run_end_repeated_error(*, run_id: Any, detail: str) -> bool:
    """End a run that waited for a person about a repeated error who said no (or
    did not answer); False when it was no longer waiting."""
    run = (
        Run.objects.select_for_update()
        .filter(id=run_id, status=Run.Status.WAITING_APPROVAL)
        .first()
    )
    if run is None:
        return False
    reason = StopReason.REPEATED_ERROR
    run_end_unheld(
        run,
        reason=reason,
        status=str(terminal_status(reason, None)),
        note=f"the run stopped ({reason})",
        detail=detail,
    )
    budget_run_ended(run=run, reason=reason, dimension="", detail=detail)
    transaction.on_commit(lambda: _root_end(run))
    return True


def _root_end(run: Run) -> None:
    try:
        run_root_end(run)
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: root end of run %s", run.id, exc_info=True)
