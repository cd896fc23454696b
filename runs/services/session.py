"""The session log's writes (runs.engine.session holds its rules).

Only the run's lease holder appends, in the transaction that stores the engine
state (`StepContext.checkpoint`), and the services that end a run nobody holds
(cancel, a denied extension) under the run's row lock: the log and the
checkpoint are committed together, so a resume rebuilds what the checkpoint
says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError

from runs.engine.loop import EngineState
from runs.engine.session import SessionEntry as Entry
from runs.models import Run, SessionEntry


class SessionWriterConflict(Exception):
    """An entry's sequence number was taken: another writer appended (the step
    treats it as a lost lease)."""


def session_entries_append(*, run_id: Any, entries: Sequence[Entry]) -> None:
    """Insert the entries at their sequence numbers; a number taken means a
    second writer, and this one loses (its transaction rolls back)."""
    if not entries:
        return
    rows = [
        SessionEntry(
            run_id=run_id,
            seq=entry.seq,
            entry_id=entry.entry_id,
            parent_id=entry.parent_id or "",
            type=entry.type,
            payload=entry.payload,
        )
        for entry in entries
    ]
    try:
        SessionEntry.objects.bulk_create(rows)
    except IntegrityError as exc:
        raise SessionWriterConflict(str(run_id)) from exc


def session_log_flush(*, run_id: Any, state: EngineState) -> None:
    """Append what the transcript gained since the last write (call it in the
    transaction that stores `state`)."""
    state.session.log_transcript(state.transcript)
    session_entries_append(run_id=run_id, entries=state.session.take_unwritten())


def engine_state_stored(*, run_id: Any) -> EngineState:
    """The engine state as last committed, with the log cursor that matches it
    (after a write that rolled back, the entries it made are not in the log)."""
    stored = Run.objects.filter(id=run_id).values_list("engine_state", flat=True)
    return EngineState.from_dict(stored.first() or {})
