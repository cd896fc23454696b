"""Retry and fork: a new run that continues a run's session tree as a branch
(docs/engine.md "Branches"; runs.engine.branching holds the rules).

Each branch is its own Run (status, steps, spans, trace, budget reservation);
the session, one tree of entries, is shared: the branch's first entry has the
branch point, an entry of the source run's path, as its parent. Nothing of the
source changes: its entries, steps, tool calls and spans stay as they were.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from controlplane import metrics
from controlplane.services import audit_record
from runs.engine.branching import (
    FORK,
    MAX_BRANCHES,
    RECOVERY,
    RETRY,
    BranchPoint,
    BranchRefused,
    branch_state,
    fork_point,
    replies_on_path,
    retry_point,
)
from runs.engine.loop import EngineState
from runs.engine.session import SessionEntry as Entry
from runs.engine.session import SessionLogError, session_path
from runs.engine.stop import StopReason
from runs.eval_models import EvalTrial
from runs.models import Run, SessionBranch, SessionEntry, Step, ToolCall
from runs.services.admission import budget_admit_run, run_slot_claim
from runs.services.dispatch import step_enqueue
from runs.services.lifecycle import RunConflict
from runs.services.session import session_entries_append

__all__ = [
    "RETRYABLE_STATUSES",
    "BranchRefused",
    "run_fork",
    "recovery_allowed",
    "run_recover_overflow",
    "run_retry",
]

# A run that ended without succeeding may be retried; a succeeded one is forked.
RETRYABLE_STATUSES = frozenset(
    {
        Run.Status.FAILED,
        Run.Status.BUDGET_EXHAUSTED,
        Run.Status.POLICY_BLOCKED,
        Run.Status.UNVERIFIED,
        Run.Status.CANCELLED,
    }
)
# Results a retry keeps: the call ran (or was refused before running, or its
# outcome is unknown) and the run went on. A cancelled call never ran.
_KEPT_CALLS = frozenset(
    {
        ToolCall.Status.SUCCEEDED,
        ToolCall.Status.FAILED,
        ToolCall.Status.REFUSED,
        ToolCall.Status.UNKNOWN,
        ToolCall.Status.DENIED,
    }
)
MAX_EDIT_CHARS = 1_000_000
# The run ended on a model call that failed (a scripted model used a reply).
_FAILED_CALL_STOPS = frozenset({StopReason.MODEL_ERROR, StopReason.CONTEXT_OVERFLOW})


class _Session:
    """The session tree the source run is on, read under the root's row lock."""

    def __init__(self, source: Run) -> None:
        branch = SessionBranch.objects.filter(run=source).first()
        self.root_id = source.id if branch is None else branch.session_root_id
        # One branch is made at a time per session: its number is the next one.
        Run.objects.select_for_update().filter(id=self.root_id).first()
        runs = list(
            SessionBranch.objects.filter(session_root_id=self.root_id).values_list(
                "run_id", flat=True
            )
        )
        self.run_ids = set(runs) | {self.root_id, source.id}
        self.rows = {
            row.entry_id: row
            for row in SessionEntry.objects.filter(run_id__in=self.run_ids)
        }
        self.entries = {
            key: Entry(row.seq, key, row.parent_id or None, row.type, row.payload)
            for key, row in self.rows.items()
        }
        numbers = SessionBranch.objects.filter(session_root_id=self.root_id)
        top = numbers.aggregate(top=Max("number"))["top"]
        self.number = 1 if top is None else top + 1
        leaf = (source.engine_state.get("session") or {}).get("leaf")
        if leaf is None:
            raise RunConflict(source, "the run has no session log to branch from yet")
        try:
            self.path = session_path(self.entries, leaf)
        except SessionLogError as exc:  # a log this module did not write
            raise RunConflict(
                source, f"the run's session log is broken: {exc}"
            ) from exc
        if self.number > MAX_BRANCHES:
            raise RunConflict(
                source, f"the session has {MAX_BRANCHES} branches, the most it may"
            )


def run_retry(*, run: Run, actor: User | None) -> Run:
    """A new branch that continues the run from its last good step: the calls
    that ran keep their recorded results (nothing runs twice); what ended the
    run (a failed model call, a cancelled or denied call, a final answer that
    did not pass) is left on the original branch, and the model is asked anew."""
    with transaction.atomic():
        source = _locked(run)
        if source.status not in RETRYABLE_STATUSES:
            raise RunConflict(
                source,
                f"a {source.status} run is not retried"
                + (" (fork it)" if source.status == Run.Status.SUCCEEDED else ""),
            )
        _runnable(source)
        session = _Session(source)
        statuses = {
            (row["run_id"], row["call_id"]): row["status"]
            for row in ToolCall.objects.filter(run_id__in=session.run_ids).values(
                "run_id", "call_id", "status"
            )
        }
        last_round = _last_call_round(session.path)
        policy_stop = source.stop_reason == StopReason.POLICY_DENIED

        def kept(entry: Entry, call_id: str) -> bool:
            status = statuses.get((session.rows[entry.entry_id].run_id, call_id))
            if status == ToolCall.Status.DENIED and policy_stop:
                return entry.entry_id != last_round  # the denial that ended it
            return status in _KEPT_CALLS

        after = retry_point(session.path, kept)
        if after is None:
            raise RunConflict(source, "the run's session log has nothing to keep")
        state = EngineState.from_dict(source.engine_state)
        failed_call = int(source.stop_reason in _FAILED_CALL_STOPS)
        replies = state.replies_before + source.steps
        return _branch_create(
            source=source,
            session=session,
            point=BranchPoint(after),
            kind=RETRY,
            actor=actor,
            replies_before=replies + failed_call,
        )


def recovery_allowed(run: Run) -> bool:
    """Whether an overflow of the run goes on in a recovery branch: not for a
    run another waits for as it is, a sub-agent run (its parent's call) or an
    eval trial (its grade reads that run's calls and answer)."""
    if run.parent_run_id is not None:
        return False
    return not EvalTrial.objects.filter(run_id=run.id).exists()


def run_recover_overflow(*, run: Run, hide: str) -> Run | None:
    """The recovery branch of a run whose model call overflowed the window,
    made in the commit that ends the run: it continues after the failed attempt
    (entry `hide`, kept on the run's log) with a `context_edit` removing it,
    and compacts before it asks the model again. None when the session holds
    the most branches it may (the run then ends as it is)."""
    source = _locked(run)
    try:
        session = _Session(source)
    except RunConflict:
        return None
    state = EngineState.from_dict(source.engine_state)
    return _branch_create(
        source=source,
        session=session,
        point=BranchPoint(session.path[-1].entry_id, target=hide),
        kind=RECOVERY,
        actor=None,
        replies_before=state.replies_before + source.steps + 1,
        recover_overflow=True,
    )


def run_fork(
    *,
    run: Run,
    actor: User | None,
    from_entry: str | None = None,
    from_step: int | None = None,
    call_id: str | None = None,
    message: str | None = None,
    tool_result: Any = None,
) -> Run:
    """A new branch from an entry (or a step) of any run's path, with an edited
    message or tool result; the model goes on from there on a worker.
    `BranchRefused` names the input at fault; nothing is written then."""
    if message is not None and tool_result is not None:
        raise BranchRefused("message", "give message or tool_result, not both")
    with transaction.atomic():
        source = _locked(run)
        _runnable(source)
        session = _Session(source)
        if from_entry is not None:
            target, field = from_entry, "from_entry"
        else:
            assert from_step is not None
            target = _step_entry(source, session, from_step, call_id, tool_result)
            field = "from_step"
        point = fork_point(
            session.path,
            target,
            message=message,
            tool_result=tool_result,
            field=field,
        )
        return _branch_create(
            source=source,
            session=session,
            point=point,
            kind=FORK,
            actor=actor,
            replies_before=replies_on_path(session.path, point.after),
        )


def _locked(run: Run) -> Run:
    # The run's row only: the agent's is read, not locked.
    locked = Run.objects.select_for_update(of=("self",)).select_related("agent")
    return locked.get(id=run.id)


def _runnable(source: Run) -> None:
    if source.agent_version_id is None:
        raise RunConflict(source, "an external agent's run is not run here")
    if source.agent.disabled or source.agent.deleted_at is not None:
        raise RunConflict(source, f"agent {source.agent.slug!r} is not enabled")


def _last_call_round(path: Sequence[Entry]) -> str | None:
    """The last assistant message on the path that called tools."""
    for entry in reversed(path):
        message = entry.payload.get("message") if entry.type == "message" else None
        if isinstance(message, dict) and message.get("tool_calls"):
            return entry.entry_id
    return None


def _step_entry(
    source: Run,
    session: _Session,
    index: int,
    call_id: str | None,
    tool_result: Any,
) -> str:
    """The entry `from_step` names in the run's own steps: the step's tool
    result (`call_id`, or its only call) when a result is edited, else the
    step's assistant message."""
    step = Step.objects.filter(run=source, index=index).first()
    if step is None:
        raise BranchRefused("from_step", f"the run has no step {index}")
    own = [
        entry
        for entry in session.path
        if session.rows[entry.entry_id].run_id == source.id and entry.type == "message"
    ]
    if tool_result is None:
        replies = [e for e in own if e.payload["message"].get("role") == "assistant"]
        if index >= len(replies):
            raise BranchRefused("from_step", f"step {index} is not on the run's log")
        return replies[index].entry_id
    calls = list(step.tool_calls.order_by("position").values_list("call_id", flat=True))
    if call_id is None:
        if len(calls) != 1:
            raise BranchRefused(
                "call_id",
                f"step {index} made {len(calls)} tool calls: name one ({calls})",
            )
        call_id = calls[0]
    if call_id not in calls:
        raise BranchRefused("call_id", f"step {index} made no call {call_id!r}")
    for entry in own:
        found = entry.payload["message"]
        if found.get("role") == "tool" and found.get("tool_call_id") == call_id:
            return entry.entry_id
    raise BranchRefused("call_id", f"call {call_id!r} has no result on the log")


@transaction.atomic
def _branch_create(
    *,
    source: Run,
    session: _Session,
    point: BranchPoint,
    kind: str,
    actor: User | None,
    replies_before: int,
    recover_overflow: bool = False,
) -> Run:
    marker = {"run": str(source.id), "from": point.after, "reason": kind}
    if point.target is not None:
        marker["edited"] = point.target
    state, made = branch_state(
        session.entries,
        point,
        number=session.number,
        marker=marker,
        source=EngineState.from_dict(source.engine_state),
        replies_before=replies_before,
    )
    state.recover_overflow = recover_overflow
    branch = Run.objects.create(
        tenant_id=source.tenant_id,
        agent_id=source.agent_id,
        agent_version_id=source.agent_version_id,
        input=source.input,
        end_user=source.end_user,
        started_by=actor,
        limits=source.limits,
        engine_state=state.to_dict(),
        trace_id=uuid.uuid4().hex,
        world_id=source.world_id,
    )
    session_entries_append(run_id=branch.id, entries=made)
    if session.root_id == source.id:
        SessionBranch.objects.get_or_create(
            run_id=source.id,
            defaults={
                "session_root_id": source.id,
                "kind": SessionBranch.Kind.ROOT,
                "number": 0,
            },
        )
    edit = None
    if point.target is not None:
        edit = {"target": point.target, "field": point.field or "removed"}
    SessionBranch.objects.create(
        run=branch,
        session_root_id=session.root_id,
        branch_of=source,
        from_entry=point.after,
        kind=kind,
        number=session.number,
        edit=edit,
        created_by=actor,
    )
    audit_record(
        tenant=source.tenant,
        actor=actor,
        action=f"run.{kind}",
        object_type="run",
        object_id=str(branch.id),
        after={"branch_of": str(source.id), "from_entry": point.after, "edit": edit},
    )
    transaction.on_commit(metrics.run_started)
    refusal = budget_admit_run(run=branch)
    if refusal is not None:  # over the runs-per-period limit: it ends before a step
        Run.objects.filter(id=branch.id).update(
            status=Run.Status.BUDGET_EXHAUSTED,
            stop_reason=refusal.dimension,
            stop_detail=refusal.detail,
            finished_at=timezone.now(),
            settled_at=timezone.now(),  # nothing ran: nothing goes on
        )
    elif run_slot_claim(run=branch):
        step_enqueue(branch)
    branch.refresh_from_db()
    return branch


def edit_problem(message: Any, tool_result: Any) -> tuple[str, str] | None:
    """(field, why) when an edit is too large to record."""
    for name, value in (("message", message), ("tool_result", tool_result)):
        if value is None:
            continue
        size = len(value) if isinstance(value, str) else len(json.dumps(value))
        if size > MAX_EDIT_CHARS:
            return name, f"at most {MAX_EDIT_CHARS} characters"
    return None
