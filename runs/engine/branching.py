"""Branches of a session log: where a retry or a fork continues the tree, and
the context and log cursor the new branch starts with (spec §1.1-1.2).

A branch never changes an entry: its first entry (a `custom` entry of kind
`branch`, not in the context) has the branch point as its parent, and an edit
(a fork's changed message or tool result) is a `context_edit` after it, so the
original branch rebuilds exactly as before and the new one sees the edit.

Entry ids are unique in the whole tree, not only in one run's rows: branch
number `n` numbers its entries from `n << BRANCH_SEQ_SHIFT`, and its id is that
number in hex (`entry_id_for`), so a branch's parent link names one entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runs.engine.loop import EngineState
from runs.engine.progress import ProgressTracker
from runs.engine.session import (
    CONTEXT_EDIT,
    CUSTOM,
    MESSAGE,
    SessionCursor,
    SessionEntry,
    context_entries,
)
from runs.engine.transcript import Transcript

BRANCH_SEQ_SHIFT = 24
# Branch numbers fit the 8 hex digits of an entry id with 2**24 entries each.
MAX_BRANCHES = 255
RETRY = "retry"
FORK = "fork"
RECOVERY = "recovery"


class BranchRefused(ValueError):
    """The branch cannot be made as asked; `field` names the input at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def first_seq_of(number: int) -> int:
    return number << BRANCH_SEQ_SHIFT


@dataclass(frozen=True)
class BranchPoint:
    """Where the new branch continues (`after`, an entry of the path) and its
    edit: the entry whose message it replaces (a fork's), with the message; or,
    with no message, the entry it removes from its context (a recovery's)."""

    after: str
    target: str | None = None
    message: dict[str, Any] | None = None
    field: str = ""


def _message(entry: SessionEntry) -> dict[str, Any] | None:
    if entry.type != MESSAGE:
        return None
    message = entry.payload.get("message")
    return message if isinstance(message, dict) else None


def _call_ids(message: Mapping[str, Any]) -> list[str]:
    return [str(call.get("id")) for call in message.get("tool_calls") or ()]


def retry_point(
    path: Sequence[SessionEntry],
    call_is_good: Callable[[SessionEntry, str], bool],
) -> str | None:
    """The last entry of `path` after which the context is whole and good: no
    call without its result, every result one the retry keeps (`call_is_good`:
    the call ran, or was refused, and did not end the run). A final answer ends
    the walk (the retry asks the model again). None: nothing to keep."""
    point: str | None = None
    open_calls: set[str] = set()
    for entry in path:
        message = _message(entry)
        if message is not None and message.get("role") == "assistant":
            ids = _call_ids(message)
            if not ids or not all(call_is_good(entry, i) for i in ids):
                break
            open_calls = set(ids)
            continue
        if message is not None and message.get("role") == "tool":
            open_calls.discard(str(message.get("tool_call_id")))
        if not open_calls:
            point = entry.entry_id
    return point


def _round_end(path: Sequence[SessionEntry], start: int) -> str:
    """The entry that closes the round of calls at or around `path[start]` (the
    assistant message that made them, or one of their results)."""
    index = start
    message = _message(path[index])
    assert message is not None
    if message.get("role") == "tool":
        while index > 0:  # back to the assistant message of this round
            index -= 1
            previous = _message(path[index])
            if previous is not None and previous.get("role") == "assistant":
                break
    calls = path[index].payload["message"]
    open_calls = set(_call_ids(calls))
    for entry in path[index + 1 :]:
        found = _message(entry)
        if found is not None and found.get("role") == "tool":
            open_calls.discard(str(found.get("tool_call_id")))
            if not open_calls:
                return entry.entry_id
    raise BranchRefused(
        "from_entry",
        f"the tool calls of entry {path[index].entry_id} have no results yet; "
        "fork from an earlier entry",
    )


def fork_point(
    path: Sequence[SessionEntry],
    target: str,
    *,
    message: str | None = None,
    tool_result: Any = None,
    field: str = "from_entry",
) -> BranchPoint:
    """Where a fork from `target` (an entry of `path`) continues, with the
    message it replaces: a user or assistant message's text (`message`), or a
    tool result (`tool_result`: text, or JSON data that is encoded). Without
    an edit the fork asks the model again from there."""
    index = next((i for i, e in enumerate(path) if e.entry_id == target), None)
    if index is None:
        raise BranchRefused(field, f"no entry {target} on this run's branch")
    original = _message(path[index])
    role = None if original is None else original.get("role")
    if original is None or role not in ("user", "assistant", "tool"):
        raise BranchRefused(
            field,
            f"entry {target} is not a user, assistant or tool message "
            f"({path[index].type}{f', {role}' if role else ''})",
        )
    if message is not None and role == "tool":
        raise BranchRefused(
            "message", f"entry {target} is a tool result: edit it with tool_result"
        )
    if tool_result is not None and role != "tool":
        raise BranchRefused(
            "tool_result", f"entry {target} is a {role} message, not a tool result"
        )
    if message is not None and role == "assistant" and original.get("tool_calls"):
        raise BranchRefused(
            "message",
            f"the assistant message {target} called tools: fork from one of "
            "their results (tool_result) instead",
        )
    ends_round = role == "tool" or (role == "assistant" and original.get("tool_calls"))
    after = _round_end(path, index) if ends_round else target
    if message is not None:
        edited = {**original, "content": message}
        return BranchPoint(after, target, edited, "message")
    if tool_result is not None:
        content = (
            tool_result
            if isinstance(tool_result, str)
            else json.dumps(tool_result, ensure_ascii=False)
        )
        return BranchPoint(
            after, target, {**original, "content": content}, "tool_result"
        )
    return BranchPoint(after)


def replies_on_path(path: Sequence[SessionEntry], upto: str) -> int:
    """How many model replies (assistant messages) the path holds up to `upto`."""
    count = 0
    for entry in path:
        message = _message(entry)
        if message is not None and message.get("role") == "assistant":
            count += 1
        if entry.entry_id == upto:
            break
    return count


def branch_state(
    entries: Mapping[str, SessionEntry],
    point: BranchPoint,
    *,
    number: int,
    marker: dict[str, Any],
    source: EngineState,
    replies_before: int,
) -> tuple[EngineState, list[SessionEntry]]:
    """The new branch's engine state (its context rebuilt from its leaf) and
    its first entries: the `branch` marker and the fork's edit."""
    cursor = SessionCursor(leaf=point.after, next_seq=first_seq_of(number))
    cursor.append(CUSTOM, {"kind": "branch", **marker})
    if point.target is not None and point.message is not None:
        cursor.append(
            CONTEXT_EDIT,
            {"target": point.target, "action": "replace", "message": point.message},
        )
    elif point.target is not None:
        cursor.append(CONTEXT_EDIT, {"target": point.target, "action": "remove"})
    made = list(cursor.unwritten)
    rebuilt = context_entries({**entries, **{e.entry_id: e for e in made}}, cursor.leaf)
    cursor.entry_ids = [entry_id for entry_id, _ in rebuilt]
    state = EngineState(
        transcript=Transcript.from_list([message for _, message in rebuilt]),
        progress=ProgressTracker(window=source.progress.window),
        # The start checks ran on the session's first run, and a context hook's
        # text is in the rebuilt system message already.
        preflight_done=True,
        loaded_tools=list(source.loaded_tools),
        session=cursor,
        replies_before=replies_before,
    )
    return state, cursor.take_unwritten()
