"""Reads of a session's branches (runs.services.branches makes them)."""

from __future__ import annotations

import uuid
from typing import Any

from controlplane.models import Tenant
from runs.models import Run, SessionBranch


def session_run_ids(*, run_id: Any) -> list[Any]:
    """The runs whose entries make up the session the run is on (itself alone
    when it was never branched)."""
    root = (
        SessionBranch.objects.filter(run_id=run_id)
        .values_list("session_root_id", flat=True)
        .first()
    )
    if root is None:
        return [run_id]
    ids = SessionBranch.objects.filter(session_root_id=root).values_list(
        "run_id", flat=True
    )
    return list(ids)


def run_branches_for(
    *, tenant: Tenant, run_id: str | uuid.UUID
) -> list[dict[str, Any]] | None:
    """The session's runs in the order they were made (the root first), each
    with its status and where it branched; None: no such run in the tenant."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    if not Run.objects.filter(tenant=tenant, id=key).exists():
        return None
    ids = session_run_ids(run_id=key)
    runs = {
        run.id: run
        for run in Run.objects.filter(tenant=tenant, id__in=ids).only(
            "id", "status", "stop_reason", "created_at", "steps", "finished_at"
        )
    }
    branches = {
        b.run_id: b for b in SessionBranch.objects.filter(run_id__in=list(runs))
    }
    rows: list[dict[str, Any]] = []
    for run_key, run in runs.items():
        branch = branches.get(run_key)
        rows.append(
            {
                "run": run.id,
                "number": 0 if branch is None else branch.number,
                "kind": SessionBranch.Kind.ROOT if branch is None else branch.kind,
                "branch_of": None if branch is None else branch.branch_of_id,
                "from_entry": None if branch is None else branch.from_entry or None,
                "edit": None if branch is None else branch.edit,
                "status": run.status,
                "stop_reason": run.stop_reason,
                "steps": run.steps,
                "created_at": run.created_at,
                "finished_at": run.finished_at,
                "current": run_key == key,
            }
        )
    rows.sort(key=lambda row: int(row["number"]))
    return rows


def run_recovery(*, run_id: Any) -> str | None:
    """The run of the recovery branch that goes on for this run, if any
    (runs.services.settle)."""
    kind = SessionBranch.Kind.RECOVERY
    branch = SessionBranch.objects.filter(branch_of_id=run_id, kind=kind)
    goes_on = branch.values_list("run_id", flat=True).first()
    return None if goes_on is None else str(goes_on)


def run_recovered(*, run_id: Any) -> str | None:
    """The run this recovery branch's run recovers, if it is one."""
    kind = SessionBranch.Kind.RECOVERY
    branch = SessionBranch.objects.filter(run_id=run_id, kind=kind)
    recovers = branch.values_list("branch_of_id", flat=True).first()
    return None if recovers is None else str(recovers)
