"""Start, cancel, resume and finish runs; the lease that makes one worker the writer."""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from typing import Any, NamedTuple

import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals.questions import questions_cancel_for_run
from approvals.services import approval_requests_cancel_for_run
from budgets.end_user_ledger import end_user_limited
from budgets.ledger import budget_release_for_run
from budgets.models import Budget
from budgets.prices import PriceLookup, model_price_for
from budgets.selectors import budget_of
from budgets.services import tenant_run_ceiling
from controlplane import metrics
from controlplane.celery import workers_gone
from controlplane.durability import recoverable_transaction
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.engine.disclosure import skills_from
from runs.engine.loop import AgentConfig, EngineState
from runs.engine.step import close_open_calls
from runs.engine.stop import StopReason
from runs.models import Agent, AgentVersion, Run, ToolCall
from runs.runtime import effective_limits
from runs.services.admission import budget_admit_run, run_slot_claim, runs_start_queued
from runs.services.dispatch import finished_hooks_on_commit, step_enqueue
from runs.services.session import session_log_flush
from runs.services.settle import run_settle
from runs.services.subagent_wake import subagent_child_ended

logger = logging.getLogger(__name__)


class RunInputError(ValueError):
    """The request to start a run is invalid; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RunConflict(Exception):
    """The run is not in a state that allows this; carries the current run."""

    def __init__(self, run: Run, message: str) -> None:
        super().__init__(message)
        self.run = run


# An end user's id as a caller's system knows it ("c-8812", "user@example.com",
# "crm:42"): no slash, so it can never name a path outside its own memory.
END_USER_PATTERN = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def end_user_problem(end_user: str, *, tenant: Tenant) -> str:
    """Why `end_user` cannot start a run of the tenant, or ""."""
    if end_user and not END_USER_PATTERN.fullmatch(end_user):
        return (
            "must be 1 to 128 characters of letters, digits and . _ : @ - (e.g. c-8812)"
        )
    if not end_user:
        budget = budget_of(tenant.pk)
        if budget is not None and end_user_limited(budget):
            return (
                "this tenant's budget limits spend per end user; name the end "
                "user the run serves"
            )
    return ""


def run_input_problem(input: str) -> str:
    """Why `input` cannot start a run, or "" (what an eval run checks of every
    case before it starts any)."""
    if not input.strip():
        return "the input is empty"
    if len(input) > settings.RUN_MAX_INPUT_CHARS:
        return (
            f"the input has {len(input)} characters; the limit is "
            f"{settings.RUN_MAX_INPUT_CHARS}"
        )
    return ""


@transaction.atomic
def run_start(
    *,
    tenant: Tenant,
    agent_slug: str,
    input: str,
    started_by: User | None,
    limits: dict[str, Any] | None = None,
    version: AgentVersion | None = None,
    world_id: uuid.UUID | None = None,
    end_user: str = "",
) -> Run:
    """Start a run of the agent's current version, or of `version` (one of its
    versions: an eval run tries a version that need not be the current one).
    `world_id`: the world its tools act in (an eval trial's own shop); None,
    the tenant's real one. `end_user`: who the run serves (its memory and the
    per-end-user budget limits); required when the tenant sets such limits."""
    agent = (
        Agent.objects.filter(tenant=tenant, slug=agent_slug, deleted_at__isnull=True)
        .select_related("current_version")
        .first()
    )
    if agent is None:
        raise RunInputError("agent", f"no agent {agent_slug!r} in this tenant")
    if agent.disabled:
        raise RunInputError(
            "agent", f"agent {agent_slug!r} is disabled; an admin may enable it"
        )
    if version is not None and version.agent_id != agent.id:
        raise RunInputError(
            "version", f"version {version.number} is not a version of {agent_slug!r}"
        )
    version = version or agent.current_version
    if version is None:
        raise RunInputError(
            "agent",
            f"agent {agent_slug!r} records runs sent over OTLP; it is not run here",
        )
    refused = run_input_problem(input)
    if refused:
        raise RunInputError("input", refused)
    refused = end_user_problem(end_user, tenant=tenant)
    if refused:
        raise RunInputError("end_user", refused)
    try:
        caps = effective_limits(
            version, limits or {}, ceiling=tenant_run_ceiling(tenant.pk)
        )
    except (ValueError, ArithmeticError, TypeError) as exc:
        raise RunInputError("limits", str(exc)) from exc
    # The prompt carries the skills' index, never their bodies (load_skill).
    config = AgentConfig(
        name=agent.slug,
        system_prompt=version.system_prompt,
        skills=skills_from(version.skills),
    )
    state = EngineState.start(config, input)
    run = Run.objects.create(
        tenant=tenant,
        agent=agent,
        agent_version=version,
        input=input,
        end_user=end_user,
        started_by=started_by,
        limits=caps.to_dict(),
        engine_state=state.to_dict(),
        trace_id=uuid.uuid4().hex,
        world_id=world_id,
    )
    audit_record(
        tenant=tenant,
        actor=started_by,
        action="run.start",
        object_type="run",
        object_id=str(run.id),
        after={
            "agent": agent.slug,
            "agent_version": version.number,
            "limits": caps.to_dict(),
            "end_user": end_user,
        },
    )
    transaction.on_commit(metrics.run_started)
    refusal = budget_admit_run(run=run)
    if refusal is not None:  # over the runs-per-period limit: it ends before a step
        transaction.on_commit(
            lambda: metrics.run_ended(
                status=Run.Status.BUDGET_EXHAUSTED, stop_reason=refusal.dimension
            )
        )
        Run.objects.filter(id=run.id).update(
            status=Run.Status.BUDGET_EXHAUSTED,
            stop_reason=refusal.dimension,
            stop_detail=refusal.detail,
            finished_at=timezone.now(),
            settled_at=timezone.now(),  # nothing ran: nothing goes on
        )
        run.refresh_from_db()
        return run
    if run_slot_claim(run=run):
        step_enqueue(run)
    # Else it stays queued with no step token and no task until a slot frees.
    return run


class Lease(NamedTuple):
    run: Run
    # The previous step ended without releasing the lease (its worker died, or
    # this is a redelivery): what it left running must be swept.
    taken_over: bool
    budget: Budget | None  # the tenant's, read with the lease
    price: PriceLookup  # of the pinned version's model, read with the lease


def lease_acquire(
    *, run_id: str, step_token: str, owner: str, worker: str = ""
) -> Lease | None:
    """Take the run's lease by compare-and-set on `version`; None if not ours to take.

    A delivery whose token is stale, a run already finished or waiting, or a lease
    held (and not expired) by another delivery: nothing happens.
    """
    # The tenant's budget comes with the run (a join, where it was a query of
    # its own after the lease).
    run = (
        Run.objects.select_related("agent", "agent_version__endpoint", "tenant__budget")
        .filter(id=run_id)
        .first()
    )
    if run is None or str(run.step_token) != step_token:
        return None
    if run.agent_version is None:  # sent over OTLP: never advanced here
        return None
    if run.status not in (Run.Status.QUEUED, Run.Status.RUNNING):
        return None
    now = timezone.now()
    held = run.lease_owner and run.lease_owner != owner
    if held and run.lease_expires_at and run.lease_expires_at > now:
        return None
    expires = now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS)
    changes: dict[str, Any] = {
        "lease_owner": owner,
        "lease_expires_at": expires,
        "version": run.version + 1,
    }
    if run.lease_worker != worker:
        changes["lease_worker"] = worker
    # Only when it changes: a column in the SET list rewrites its indexes' entries.
    if run.status != Run.Status.RUNNING:
        changes["status"] = Run.Status.RUNNING
    if run.started_at is None:
        changes["started_at"] = now
    with recoverable_transaction():  # lost in a database crash: taken again
        won = Run.objects.filter(id=run.id, version=run.version).update(**changes)
    if not won:
        return None
    taken_over = bool(run.lease_owner)
    for name, value in changes.items():
        setattr(run, name, value)
    price = model_price_for(model=run.agent_version.model, tenant_id=run.tenant_id)
    # A tenant without a budget: the reverse one-to-one raises DoesNotExist,
    # an AttributeError, without a query (select_related cached its absence).
    budget: Budget | None = getattr(run.tenant, "budget", None)
    return Lease(run, taken_over, budget, price)


class LeaseLost(Exception):
    """Another writer took the run; this step stops before writing anything more."""


def run_save(run: Run, *, heed_cancel: bool = False, **changes: Any) -> bool:
    """Write run fields as the lease holder (CAS on version); raises LeaseLost.

    With `heed_cancel` the write also looks at `cancel_requested` (in its WHERE)
    and returns True if it proved no cancel was requested: the caller's next
    phase then needs no read of its own. A run to be cancelled is written all
    the same (a second UPDATE), and False leaves the read to the caller.
    """
    changes["version"] = run.version + 1
    changes.setdefault(
        "lease_expires_at",
        timezone.now() + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS),
    )
    changes["updated_at"] = timezone.now()
    held = Run.objects.filter(
        id=run.id, version=run.version, lease_owner=run.lease_owner
    )
    not_cancelled = heed_cancel and bool(
        held.filter(cancel_requested=False).update(**changes)
    )
    if not not_cancelled and not held.update(**changes):
        raise LeaseLost(str(run.id))
    for name, value in changes.items():
        setattr(run, name, value)
    return not_cancelled


def lease_release(run: Run) -> None:
    if not run.lease_owner:
        return  # already released by the step's last write
    Run.objects.filter(id=run.id, lease_owner=run.lease_owner).update(
        lease_owner="", lease_expires_at=None
    )


def counters_from_state(state: EngineState) -> dict[str, Any]:
    usage = state.usage
    return {
        "steps": usage.steps,
        "tool_calls": usage.tool_calls,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost": usage.cost,
    }


def run_finish_fields(
    state: EngineState,
    reason: StopReason,
    status: str,
    *,
    detail: str = "",
    evaluation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields that end a run (the caller also saves state and counters)."""
    state.stop_reason = reason
    # Counted once the end commits (at once when no transaction is open).
    transaction.on_commit(
        lambda: metrics.run_ended(status=str(status), stop_reason=str(reason))
    )
    return {
        "status": status,
        "stop_reason": str(reason),
        "stop_detail": detail,
        "final_answer": state.final_text or "",
        "evaluation": evaluation,
        "finished_at": timezone.now(),
    }


def run_end_unheld(
    run: Run,
    *,
    reason: StopReason,
    status: str,
    note: str,
    detail: str = "",
    **changes: Any,
) -> None:
    """End a run no step holds (queued, or waiting on a person), under its row
    lock: its open calls closed with `note`, its log flushed, its end written
    (with `changes` over the finish fields); its `run_finished` hooks follow the
    commit. The caller frees what the run holds in the budget."""
    state = EngineState.from_dict(run.engine_state)
    close_open_calls(state.transcript, note)
    ToolCall.objects.filter(
        run=run,
        status__in=[ToolCall.Status.PENDING, ToolCall.Status.WAITING_APPROVAL,
                    ToolCall.Status.WAITING_INPUT, ToolCall.Status.APPROVED],
    ).update(status=ToolCall.Status.CANCELLED, finished_at=timezone.now())  # fmt: skip
    session_log_flush(run_id=run.id, state=state)
    fields = {**run_finish_fields(state, reason, status, detail=detail), **changes}
    Run.objects.filter(id=run.id).update(
        version=F("version") + 1,
        step_token=None,
        lease_owner="",  # a dead step's (see _lease_alive)
        lease_expires_at=None,
        engine_state=state.to_dict(),
        **counters_from_state(state),
        **fields,
    )
    run.refresh_from_db()
    subagent_child_ended(run)  # its parent may go on
    if not finished_hooks_on_commit(run):
        run_settle(run_id=run.id)


@transaction.atomic
def run_cancel(*, run: Run, actor: User | None) -> Run:
    """Cancel a run; a finished run is a conflict. A run in a step stops at its
    next phase boundary; a queued or waiting run stops now and frees its slot."""
    locked = Run.objects.select_for_update().get(id=run.id)
    if locked.is_terminal:
        raise RunConflict(locked, f"the run already ended as {locked.status}")
    audit_record(
        tenant=locked.tenant,
        actor=actor,
        action="run.cancel",
        object_type="run",
        object_id=str(locked.id),
        before={"status": locked.status},
    )
    if locked.status == Run.Status.RUNNING and _lease_alive(locked):
        # The worker in the step stops at its next phase boundary. The version
        # stays: bumping it would make the worker's next write lose its lease,
        # and the run would wait out the lease before anything cancelled it.
        # (Its sub-agent runs are cancelled when the step ends it.)
        Run.objects.filter(id=locked.id).update(cancel_requested=True)
        locked.refresh_from_db()
        return locked
    _approvals_cancel(locked)
    run_end_unheld(
        locked,
        reason=StopReason.CANCELLED,
        status=Run.Status.CANCELLED,
        note="the run was cancelled",
        cancel_requested=True,
    )
    # After the commit, each in its own transaction: a child ending meanwhile
    # locks its row, then its parent's; this order never inverts that.
    transaction.on_commit(lambda: run_children_cancel(locked, actor=actor))
    # Its slot frees now; the budget row before the counters (the ledger's lock
    # order: both stay locked until this transaction commits).
    runs_start_queued(tenant_id=locked.tenant_id)
    budget_release_for_run(run_id=locked.id)
    return locked


def run_children_cancel(run: Run, *, actor: User | None) -> int:
    """The run ended: cancel its sub-agent runs that have not (and theirs, in
    turn); its calls waiting on them are cancelled. Returns how many."""
    ToolCall.objects.filter(
        run=run, status=ToolCall.Status.EXECUTING, child_runs__isnull=False
    ).update(status=ToolCall.Status.CANCELLED, finished_at=timezone.now())
    cancelled = 0
    for child in Run.objects.filter(parent_run=run).exclude(status__in=Run.TERMINAL):
        try:
            run_cancel(run=child, actor=actor)
            cancelled += 1
        except RunConflict:  # it ended meanwhile
            continue
    return cancelled


def _lease_alive(run: Run) -> bool:
    """Whether a worker may still be inside the run's step: it holds a lease that
    has not run out, and its worker's heartbeat has not stopped. A lease left by
    a step that died (its worker gone, or a delivery that raised) would keep a
    cancel waiting for a step that never comes: such a run is cancelled now,
    and the version bump makes a late write of the old holder lose its lease."""
    if not run.lease_owner:
        return False
    if run.lease_expires_at is None or run.lease_expires_at <= timezone.now():
        return False
    if not run.lease_worker:
        return True
    try:
        return run.lease_worker not in workers_gone([run.lease_worker])
    except redis.RedisError:  # unknown: let the step see the flag
        return True


def _approvals_cancel(run: Run) -> None:
    approval_requests_cancel_for_run(run_id=run.id, tenant=run.tenant)
    questions_cancel_for_run(run_id=run.id)


@transaction.atomic
def run_resume(*, run_id: str) -> None:
    """A decision ended the wait: queue the run's next step (holding nothing before)."""
    updated = Run.objects.filter(id=run_id, status=Run.Status.WAITING_APPROVAL).update(
        status=Run.Status.QUEUED, version=F("version") + 1
    )
    if updated:
        step_enqueue(Run.objects.get(id=run_id))
