"""The session log: a run's history as an append-only tree of entries, and the
model's context rebuilt from a leaf (spec §1.1-1.2).

Each entry has an 8-character id and its parent's; the current leaf names the
branch. Entries are never changed: a `context_edit` replaces (or removes) an
older entry in the context of the branch it is on, and a `compaction` stands
for everything before `firstKeptEntryId`. Raw entries, exports and billing keep
what happened; only the rebuilt context differs.

The host keeps the context it sends (the `Transcript`) as the checkpoint of this
rebuild: `SessionCursor.log_transcript` turns what the transcript gained since
the last write into entries, so that `build_context(entries, leaf)` equals the
transcript at every model call (an incremental rebuild); rebuilding from the log
is for resumes on another branch, audits and tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runs.engine.transcript import Transcript

MESSAGE = "message"
COMPACTION = "compaction"
BRANCH_SUMMARY = "branch_summary"
CONTEXT_EDIT = "context_edit"
CUSTOM = "custom"
CUSTOM_MESSAGE = "custom_message"
MODEL_CHANGE = "model_change"
USAGE = "usage"
LABEL = "label"
ENTRY_TYPES = (
    MESSAGE,
    COMPACTION,
    BRANCH_SUMMARY,
    CONTEXT_EDIT,
    CUSTOM,
    CUSTOM_MESSAGE,
    MODEL_CHANGE,
    USAGE,
    LABEL,
)
# How a summary reaches the model: a user message after the system checkpoint.
SUMMARY_PREFIX = "[Summary of the conversation so far]\n"
BRANCH_SUMMARY_PREFIX = "[Summary of a branch that was left]\n"
# What an old tool output becomes when it is dropped from the context.
DROPPED_OUTPUT = "[tool output dropped from the context to save room; id {call_id}]"


class SessionLogError(ValueError):
    """The log does not describe a path (a missing parent, a cycle)."""


def entry_id_for(seq: int) -> str:
    """The entry's 8-character id: its sequence number in hex (unique per run)."""
    return f"{seq:08x}"


@dataclass(frozen=True)
class SessionEntry:
    seq: int
    entry_id: str
    parent_id: str | None
    type: str
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "id": self.entry_id,
            "parentId": self.parent_id,
            "type": self.type,
            "payload": self.payload,
        }


def session_path(
    entries: Mapping[str, SessionEntry],
    leaf_id: str | None,
    *,
    to_first_kept: bool = False,
) -> list[SessionEntry]:
    """The entries from the root to `leaf_id`, following parent links.

    `to_first_kept`: stop at the latest compaction's first kept entry (what a
    rebuild needs: an edit always comes after the entry it targets, so none
    before that entry matters), instead of walking a long log to its root."""
    path: list[SessionEntry] = []
    seen: set[str] = set()
    stop_at: str | None = None
    current = leaf_id
    while current is not None:
        if current in seen:
            raise SessionLogError(f"entry {current} is its own ancestor")
        seen.add(current)
        entry = entries.get(current)
        if entry is None:
            raise SessionLogError(f"no entry {current} in the log")
        path.append(entry)
        if to_first_kept:
            if stop_at is None and entry.type == COMPACTION:
                stop_at = str(entry.payload.get("firstKeptEntryId"))
            elif current == stop_at:
                break
        current = entry.parent_id
    path.reverse()
    return path


def _message_of(entry: SessionEntry, edits: Mapping[str, Mapping[str, Any]]) -> Any:
    """The context message(s) of one entry, its latest edit applied: a message,
    a list of them (a compaction), or None (no message)."""
    edit = edits.get(entry.entry_id)
    if edit is not None:
        if edit.get("action") == "remove":
            return None
        return dict(edit["message"])
    payload = entry.payload
    if entry.type in (MESSAGE, CUSTOM_MESSAGE):
        return dict(payload["message"])
    if entry.type == COMPACTION:
        checkpoint = [dict(m) for m in payload.get("checkpoint") or []]
        summary = {"role": "user", "content": SUMMARY_PREFIX + payload["summary"]}
        return [*checkpoint, summary]
    if entry.type == BRANCH_SUMMARY:
        return {"role": "user", "content": BRANCH_SUMMARY_PREFIX + payload["summary"]}
    return None  # custom, model_change, usage, label, context_edit itself


def build_context(
    entries: Mapping[str, SessionEntry] | Iterable[SessionEntry],
    leaf_id: str | None,
) -> list[dict[str, Any]]:
    """The model's messages for the branch ending at `leaf_id` (spec §1.2)."""
    return [message for _, message in context_entries(entries, leaf_id)]


def context_entries(
    entries: Mapping[str, SessionEntry] | Iterable[SessionEntry],
    leaf_id: str | None,
) -> list[tuple[str, dict[str, Any]]]:
    """`build_context`'s messages, each with the id of the entry it comes from
    (a branch's log cursor needs them: a later edit targets that entry)."""
    by_id = (
        entries
        if isinstance(entries, Mapping)
        else {entry.entry_id: entry for entry in entries}
    )
    path = session_path(by_id, leaf_id, to_first_kept=True)
    # Branch-relative: only the edits on this path count, the latest winning.
    edits: dict[str, Mapping[str, Any]] = {}
    for entry in path:
        if entry.type == CONTEXT_EDIT:
            edits[str(entry.payload["target"])] = entry.payload
    chosen: list[SessionEntry] = path
    kept: list[SessionEntry] = []
    latest = next(
        (i for i in range(len(path) - 1, -1, -1) if path[i].type == COMPACTION), None
    )
    if latest is not None:
        compaction = path[latest]
        first_kept = compaction.payload.get("firstKeptEntryId")
        start = next(
            (i for i in range(latest) if path[i].entry_id == first_kept), latest
        )
        # From the first kept entry to the compaction, without system messages
        # (the checkpoint carries them) nor an older compaction's summary.
        kept = [
            entry
            for entry in path[start:latest]
            if entry.type != COMPACTION
            and not (
                entry.type == MESSAGE
                and entry.payload["message"].get("role") == "system"
            )
        ]
        chosen = [compaction, *kept, *path[latest + 1 :]]
    messages: list[tuple[str, dict[str, Any]]] = []
    for entry in chosen:
        produced = _message_of(entry, edits)
        if isinstance(produced, list):
            messages.extend((entry.entry_id, message) for message in produced)
        elif produced is not None:
            messages.append((entry.entry_id, produced))
    return messages


@dataclass
class SessionCursor:
    """Where the run's log stands: the leaf, the next sequence number, and the
    entry of each message of the transcript (the context) already logged.

    Entries made but not yet stored wait in `unwritten`; the host stores them
    in the transaction that stores the engine state (the lease holder's write),
    so the checkpoint and the log never disagree."""

    leaf: str | None = None
    next_seq: int = 0
    entry_ids: list[str] = field(default_factory=list)
    unwritten: list[SessionEntry] = field(default_factory=list)

    def append(self, type_: str, payload: dict[str, Any]) -> SessionEntry:
        """A new entry after the leaf, which it becomes."""
        if type_ not in ENTRY_TYPES:
            raise SessionLogError(f"unknown entry type {type_!r}")
        entry = SessionEntry(
            self.next_seq, entry_id_for(self.next_seq), self.leaf, type_, payload
        )
        self.next_seq += 1
        self.leaf = entry.entry_id
        self.unwritten.append(entry)
        return entry

    def log_transcript(self, transcript: Transcript) -> None:
        """Entries for what the transcript gained since the last call: a
        `context_edit` for each logged message changed in place (a note on a
        result), a `message` for each new one."""
        logged = len(self.entry_ids)
        for index in sorted(transcript.take_edited()):
            if index < logged:
                self.append(
                    CONTEXT_EDIT,
                    {
                        "target": self.entry_ids[index],
                        "action": "replace",
                        "message": dict(transcript.messages[index]),
                    },
                )
        for message in transcript.messages[logged:]:
            entry = self.append(MESSAGE, {"message": dict(message)})
            self.entry_ids.append(entry.entry_id)

    def take_unwritten(self) -> list[SessionEntry]:
        entries, self.unwritten = self.unwritten, []
        return entries

    def to_dict(self) -> dict[str, Any]:
        return {
            "leaf": self.leaf,
            "next_seq": self.next_seq,
            "entry_ids": list(self.entry_ids),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SessionCursor:
        if not data:
            return cls()
        return cls(
            leaf=data.get("leaf"),
            next_seq=int(data.get("next_seq", 0)),
            entry_ids=[str(i) for i in data.get("entry_ids") or []],
        )


# --- compaction -------------------------------------------------------------

# The messages at the end of the context that stay verbatim.
KEEP_RECENT_MESSAGES = 6
# Tool outputs among the last this many messages are not dropped.
KEEP_RECENT_TOOL_OUTPUTS = 4

SUMMARY_INSTRUCTIONS = (
    "You are compacting an agent's conversation to fit its context window. "
    "Write a summary the agent can continue from: the user's goal, what was "
    "done and found, every identifier verbatim (order, call, ticket and record "
    "ids, amounts, dates), decisions made, and the open items still to do. "
    "Reply with the summary only; do not call tools."
)


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """About 4 characters a token, as the budget pre-check estimates."""
    return len(json.dumps(list(messages), ensure_ascii=False)) // 4 + 1


def drop_old_tool_outputs(
    transcript: Transcript,
    cursor: SessionCursor,
    *,
    keep_recent: int = KEEP_RECENT_TOOL_OUTPUTS,
) -> int:
    """First stage: replace logged tool outputs older than the last `keep_recent`
    messages by a placeholder, as `context_edit`s (the call and its id stay, so
    every call still has its result). Returns how many were dropped."""
    cursor.log_transcript(transcript)  # every message has its entry first
    messages = transcript.messages
    dropped = 0
    for index in range(max(0, len(messages) - keep_recent)):
        message = messages[index]
        if message.get("role") != "tool":
            continue
        placeholder = DROPPED_OUTPUT.format(call_id=message.get("tool_call_id"))
        if message.get("content") == placeholder:
            continue
        replaced = {**message, "content": placeholder}
        cursor.append(
            CONTEXT_EDIT,
            {
                "target": cursor.entry_ids[index],
                "action": "replace",
                "message": replaced,
            },
        )
        transcript.replace_message(index, replaced, edited=False)
        dropped += 1
    return dropped


def first_kept_index(
    messages: Sequence[Mapping[str, Any]], *, keep_recent: int = KEEP_RECENT_MESSAGES
) -> int | None:
    """Where the verbatim tail starts: about the last `keep_recent` messages,
    moved back so that it never starts at a tool result (its call stays with
    it), after the system messages and an earlier summary. None: nothing
    before it to summarise."""
    head = 0
    while head < len(messages) and (
        messages[head].get("role") == "system"
        or str(messages[head].get("content") or "").startswith(SUMMARY_PREFIX)
    ):
        head += 1
    start = max(head, len(messages) - keep_recent)
    while start > head and messages[start].get("role") == "tool":
        start -= 1
    if start <= head or start >= len(messages):
        return None
    return start


def summary_request(
    messages: Sequence[Mapping[str, Any]], keep_from: int
) -> list[dict[str, Any]]:
    """The messages the model is asked to summarise (everything before the kept
    tail, system messages aside), as one transcript to read."""
    lines = []
    for message in messages[:keep_from]:
        role = message.get("role")
        if role == "system":
            continue
        content = message.get("content") or ""
        calls = message.get("tool_calls")
        if calls:
            content = f"{content} [calls: {json.dumps(calls, ensure_ascii=False)}]"
        if role == "tool":
            role = f"tool result {message.get('tool_call_id')}"
        lines.append(f"{role}: {content}")
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS},
        {"role": "user", "content": "\n".join(lines)},
    ]


def apply_compaction(
    transcript: Transcript,
    cursor: SessionCursor,
    *,
    summary: str,
    keep_from: int,
    tokens_before: int,
) -> SessionEntry:
    """Record a `compaction` entry and make the transcript what the log now
    rebuilds to: the system checkpoint, the summary, the kept tail."""
    cursor.log_transcript(transcript)
    messages = transcript.messages
    checkpoint = [dict(m) for m in messages if m.get("role") == "system"]
    entry = cursor.append(
        COMPACTION,
        {
            "summary": summary,
            "firstKeptEntryId": cursor.entry_ids[keep_from],
            "tokensBefore": tokens_before,
            "checkpoint": checkpoint,
        },
    )
    summary_message = {"role": "user", "content": SUMMARY_PREFIX + summary}
    # A system message in the tail is in the checkpoint already.
    tail = range(keep_from, len(messages))
    kept_at = [i for i in tail if messages[i].get("role") != "system"]
    kept = [messages[i] for i in kept_at]
    kept_ids = [cursor.entry_ids[i] for i in kept_at]
    transcript.reset([*checkpoint, summary_message, *kept])
    cursor.entry_ids = [entry.entry_id] * (len(checkpoint) + 1) + kept_ids
    return entry
