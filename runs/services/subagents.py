"""Sub-agents: a run's call of `agent__<slug>` starts a child run (docs/engine.md,
Sub-agents).

The step gates the call like any (runs.services.advance: validation, the
tenant's policy, a person's approval when the policy asks for one); once it
passes, its child starts here. The child's input is the call's task brief;
its caps are the lowest of its own agent's, the tenant's ceiling and a share
of what its parent has left (never more: the parent's remaining cost, tokens
and active seconds, less what its children not yet charged to it hold, split
over the calls of the step still to start).
The parent waits `waiting_subagents` holding no worker; each child's end wakes
it once none is left running (runs.services.subagent_wake), and the step that
resumes records each child's answer (or why it stopped) as the observation and
charges the child's spend to the parent's counters, so the parent's caps bound
its whole tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from budgets.services import tenant_run_ceiling
from controlplane.failpoints import failpoint
from controlplane.services import audit_record
from runs.engine.actions import ToolCall
from runs.engine.budget import BudgetLimits, BudgetVector
from runs.engine.disclosure import skills_from
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.loop import AgentConfig, EngineState
from runs.models import Agent, Run
from runs.models import ToolCall as ToolCallRow
from runs.runtime import effective_limits, min_limits
from runs.services.admission import budget_admit_run
from runs.services.dispatch import step_enqueue
from runs.services.lifecycle import run_children_cancel
from runs.services.spend import run_remaining
from runs.services.subagent_wake import subagent_child_ended, subagent_parent_wake
from runs.subagent_spans import subagent_span_open, subagent_span_settle
from runs.tools.subagents import SUBAGENT_TOOL_PREFIX, subagent_slug_of

# The statuses a child ends answered in: its final answer is the observation.
ANSWERED = (Run.Status.SUCCEEDED, Run.Status.UNVERIFIED)
# The parent's caps a child's are carved from (the child counts its own steps
# and tool calls under its agent's caps).
CARVED = {
    "cost": "max_cost",
    "input_tokens": "max_input_tokens",
    "output_tokens": "max_output_tokens",
    "wall_seconds": "max_wall_seconds",
}


@dataclass(frozen=True)
class ChildOutcome:
    """A delegated call's end: its observation and the child's spend."""

    result: ToolResult
    spent: BudgetVector
    refused: bool = False  # no child was started


@dataclass(frozen=True)
class CallStep:
    """What the step records for a sub-agent call: its observation and the
    call's status, and the spend to charge."""

    result: ToolResult
    status: str
    spent: BudgetVector


def is_subagent_call(name: str) -> bool:
    return name.startswith(SUBAGENT_TOOL_PREFIX)


def subagent_call_started(name: str, status: str) -> bool:
    """A sub-agent call whose child was started (or whose start was under
    way when its step died): it waits on its child, never gated again."""
    return is_subagent_call(name) and status == ToolCallRow.Status.EXECUTING


def subagent_call_step(
    *,
    run: Run,
    row: ToolCallRow,
    call: ToolCall,
    usage: BudgetVector,
    limits: BudgetLimits,
) -> CallStep | None:
    """Start the child of a call that passed its gate (the step's, approval
    included: `call` carries the arguments approved), or take the ended
    child's outcome. None while the child works."""
    ended = subagent_call_advance(
        run=run, row=row, call=call, usage=usage, limits=limits
    )
    if ended is None:
        return None
    status = (
        ToolCallRow.Status.REFUSED
        if ended.refused
        else ToolCallRow.Status.SUCCEEDED
        if ended.result.ok
        else ToolCallRow.Status.FAILED
    )
    return CallStep(ended.result, status, ended.spent)


def subagent_child_of(row: ToolCallRow) -> Run | None:
    return Run.objects.filter(parent_tool_call=row).first()


def subagent_call_advance(
    *,
    run: Run,
    row: ToolCallRow,
    call: ToolCall,
    usage: BudgetVector,
    limits: BudgetLimits,
) -> ChildOutcome | None:
    """The call's outcome once its child has ended; None while it works (the
    child was started now, or earlier). A call that may not start a child (a
    cap, a cycle, nothing left to carve) ends now with an error observation,
    nothing started."""
    child = subagent_child_of(row)
    if child is not None:
        # Stored already, unless the step that started the child died before
        # storing it (its store keeps a stored span as it is).
        subagent_span_open(run, tool_call=row, child=child)
        if not child.is_terminal:
            return None
        outcome = _child_outcome(child)
        subagent_span_settle(run, tool_call=row, child=child, result=outcome.result)
        return outcome
    refused = _start_refusal(run, call)
    if refused is not None:
        return ChildOutcome(refused, BudgetVector(), refused=True)
    carve = _carve(run, row, usage, limits)
    if isinstance(carve, ToolResult):
        return ChildOutcome(carve, BudgetVector(), refused=True)
    with transaction.atomic():  # the child and its call's state, or neither
        child = _child_start(run, row, call, carve)
    failpoint("after_subagent_started")
    subagent_span_open(run, tool_call=row, child=child)
    if child.is_terminal:  # refused at admission (the tenant's runs per period)
        outcome = _child_outcome(child)
        subagent_span_settle(run, tool_call=row, child=child, result=outcome.result)
        return outcome
    return None


def subagents_running(*, run: Run) -> bool:
    """Whether any child of the run has not ended."""
    return Run.objects.filter(parent_run=run).exclude(status__in=Run.TERMINAL).exists()


def subagents_wait_check(*, run: Run) -> None:
    """In the transaction that puts the run to wait: a child that ended before
    it began to wait queues it at once (subagent_wake)."""
    subagent_parent_wake(parent_id=run.id)


def subagent_run_ended(run: Run) -> None:
    """In the transaction that ends a run in a step: its parent may go on, and
    its own children still running are cancelled once the end is committed."""
    subagent_child_ended(run)
    version = run.agent_version
    if version is not None and version.subagents:
        transaction.on_commit(lambda: run_children_cancel(run, actor=None))


def _refusal(message: str, code: ErrorCode = ErrorCode.EPERM) -> ToolResult:
    return ToolResult.failure(code, message, retryable=False)


def _start_refusal(run: Run, call: ToolCall) -> ToolResult | None:
    """Why this call may not start a child now (the runtime's cap, cycle and
    agent checks; the version's list was checked when it was saved)."""
    slug = subagent_slug_of(call.name) or ""
    if run.depth + 1 > settings.RUN_SUBAGENT_MAX_DEPTH:
        return _refusal(
            f"not started: a sub-agent here would be {run.depth + 1} levels deep; "
            f"the limit is {settings.RUN_SUBAGENT_MAX_DEPTH} "
            "(RUN_SUBAGENT_MAX_DEPTH). Do the task yourself."
        )
    started = Run.objects.filter(parent_run=run).count()
    if started >= settings.RUN_SUBAGENT_MAX_CHILDREN:
        return _refusal(
            f"not started: this run already started {started} sub-agent runs; "
            f"the limit is {settings.RUN_SUBAGENT_MAX_CHILDREN} "
            "(RUN_SUBAGENT_MAX_CHILDREN)."
        )
    chain = _ancestor_slugs(run)
    if slug in chain:
        path = " -> ".join([*reversed(chain), slug])
        return _refusal(f"not started: a cycle ({path}); an agent may not call itself")
    agent = Agent.objects.filter(
        tenant_id=run.tenant_id, slug=slug, deleted_at__isnull=True
    ).first()
    if agent is None or agent.current_version_id is None:
        return _refusal(f"no agent {slug!r} in this tenant", ErrorCode.ENOTOOL)
    if agent.disabled:
        return _refusal(f"the agent {slug!r} is disabled", ErrorCode.EPERM)
    return None


def _ancestor_slugs(run: Run) -> list[str]:
    """The agents of the run and its ancestors, the run's first."""
    slugs = [run.agent.slug]
    parent_id = run.parent_run_id
    while parent_id is not None and len(slugs) <= settings.RUN_SUBAGENT_MAX_DEPTH:
        parent = (
            Run.objects.filter(id=parent_id)
            .values("agent__slug", "parent_run_id")
            .first()
        )
        if parent is None:
            break
        slugs.append(parent["agent__slug"])
        parent_id = parent["parent_run_id"]
    return slugs


def _carve(
    run: Run, row: ToolCallRow, usage: BudgetVector, limits: BudgetLimits
) -> dict[str, Any] | ToolResult:
    """The child's share of what the parent has left, as caps; a refusal when
    a capped dimension has nothing left."""
    left = run_remaining(usage, limits)
    # What the children not yet charged to the parent hold: their whole caps
    # (one that ended meanwhile has spent no more than that).
    uncharged = Run.objects.filter(
        parent_run=run, parent_tool_call__status=ToolCallRow.Status.EXECUTING
    )
    held = [BudgetLimits.from_dict(child.limits) for child in uncharged.only("limits")]
    # This call and the step's other delegations not started yet share it
    # (this one is `pending`, or `approved` after a person's decision).
    sharing = 1 + (
        ToolCallRow.objects.filter(
            step_id=row.step_id,
            tool_name__startswith=SUBAGENT_TOOL_PREFIX,
            status=ToolCallRow.Status.PENDING,
        )
        .exclude(id=row.id)
        .count()
    )
    carve: dict[str, Any] = {}
    for name, cap in CARVED.items():
        if name not in left:
            continue
        remaining = Decimal(str(left[name]))
        for other in held:
            value = getattr(other, cap)
            if value is not None:
                remaining -= Decimal(str(value))
        share = remaining / sharing
        if share <= 0:
            return _refusal(
                f"not started: the run has no {name.replace('_', ' ')} left to "
                "give a sub-agent",
                ErrorCode.EBUDGET,
            )
        if name == "cost":
            carve[cap] = str(share.quantize(Decimal("0.000001"), rounding="ROUND_DOWN"))
        elif name == "wall_seconds":
            carve[cap] = float(share)
        else:
            carve[cap] = int(share)
    return carve


def _child_start(
    run: Run, row: ToolCallRow, call: ToolCall, carve: dict[str, Any]
) -> Run:
    """Create the child run (same tenant, trace, world and end user) and queue
    its first step; it rides its parent's concurrency slot."""
    slug = subagent_slug_of(call.name) or ""
    agent = Agent.objects.select_related("current_version").get(
        tenant_id=run.tenant_id, slug=slug, deleted_at__isnull=True
    )
    version = agent.current_version
    assert version is not None  # checked by _start_refusal
    caps = min_limits(
        effective_limits(version, {}, ceiling=tenant_run_ceiling(run.tenant_id)),
        BudgetLimits.from_dict(carve),
    )
    task = str(call.arguments.get("task", ""))
    config = AgentConfig(
        name=agent.slug,
        system_prompt=version.system_prompt,
        skills=skills_from(version.skills),
    )
    child = Run.objects.create(
        tenant_id=run.tenant_id,
        agent=agent,
        agent_version=version,
        input=task,
        end_user=run.end_user,
        started_by=run.started_by,
        limits=caps.to_dict(),
        engine_state=EngineState.start(config, task).to_dict(),
        trace_id=run.trace_id,
        world_id=run.world_id,
        parent_run=run,
        parent_tool_call=row,
        depth=run.depth + 1,
        # Its spend is its parent's (charged there when it ends): the
        # overview counts the tree once, in the top-level run.
        rollup_pending=False,
    )
    audit_record(
        tenant=run.tenant,
        actor=None,
        action="run.start",
        object_type="run",
        object_id=str(child.id),
        after={
            "agent": agent.slug,
            "agent_version": version.number,
            "limits": caps.to_dict(),
            "parent_run": str(run.id),
            "parent_call_id": row.call_id,
        },
    )
    ToolCallRow.objects.filter(id=row.id).update(
        status=ToolCallRow.Status.EXECUTING, started_at=timezone.now()
    )
    refusal = budget_admit_run(run=child)
    if refusal is not None:
        Run.objects.filter(id=child.id).update(
            status=Run.Status.BUDGET_EXHAUSTED,
            stop_reason=refusal.dimension,
            stop_detail=refusal.detail,
            finished_at=timezone.now(),
            settled_at=timezone.now(),  # nothing ran: nothing goes on
        )
        child.refresh_from_db()
        return child
    step_enqueue(child)
    return child


def _child_outcome(child: Run) -> ChildOutcome:
    spent = BudgetVector(
        tool_calls=1,
        input_tokens=child.input_tokens,
        output_tokens=child.output_tokens,
        cost=child.cost,
    )
    slug = child.agent.slug
    if child.status in ANSWERED:
        data = {
            "agent": slug,
            "run_id": str(child.id),
            "status": child.status,
            "answer": child.final_answer,
        }
        return ChildOutcome(ToolResult.success(data), spent)
    why = child.stop_detail or child.stop_reason or child.status
    code = (
        ErrorCode.ECANCELED
        if child.status == Run.Status.CANCELLED
        else ErrorCode.EBUDGET
        if child.status == Run.Status.BUDGET_EXHAUSTED
        else ErrorCode.EINTERNAL
    )
    message = f"the sub-agent {slug!r} stopped {child.status} ({why})"
    if child.final_answer:
        message += f"; its last answer: {child.final_answer}"
    return ChildOutcome(ToolResult.failure(code, message, retryable=False), spent)
