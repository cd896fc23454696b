"""The conversation in OpenAI chat format: what the host persists and rebuilds.

Invariants kept here (spec §2.3): the assistant message with its tool calls is
appended verbatim before any result; every call gets exactly one `tool` message
from the same round; no user text sits between a call and its result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runs.engine.actions import ToolCall


def _json_copy(value: Any) -> Any:
    """A copy of JSON-shaped data; copy.deepcopy's memo costs several times more
    and a checkpoint copies the whole transcript."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    return value


class TranscriptError(ValueError):
    """An append would break the chat-format invariants."""


@dataclass
class Transcript:
    """`messages` are appended to, never changed in place but by `note_on_result`:
    each is encoded to JSON once (`messages_json`)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    _encoded: list[str] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    # Indexes of messages changed in place since the session log last looked
    # (`take_edited`): the log records them as `context_edit`s.
    _edited: set[int] = field(
        default_factory=set, init=False, repr=False, compare=False
    )

    @classmethod
    def start(cls, system_prompt: str, user_input: str) -> Transcript:
        messages: list[dict[str, Any]] = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": user_input})
        return cls(messages)

    def append_assistant(
        self, text: str | None, calls: Sequence[ToolCall]
    ) -> dict[str, Any]:
        """Append the model's turn (arguments verbatim); returns the message."""
        if self.open_calls():
            raise TranscriptError("previous tool calls have no results yet")
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [call.to_message_dict() for call in calls]
        self.messages.append(message)
        return message

    def append_tool_message(self, message: Mapping[str, Any]) -> None:
        """Append the one `tool` message answering an open call of this round."""
        call_id = message.get("tool_call_id")
        if call_id not in self.open_calls():
            raise TranscriptError(f"no open tool call {call_id!r} in this round")
        self.messages.append(dict(message))

    def add_context(self, text: str) -> None:
        """Add host context (a `before_agent` hook's) to the instructions, before
        the model's first call: appended to the system message, or one made."""
        if any(m.get("role") == "assistant" for m in self.messages):
            raise TranscriptError("context is added before the model's first turn")
        first = self.messages[0] if self.messages else None
        if first is not None and first.get("role") == "system":
            first["content"] = f"{first.get('content') or ''}\n\n{text}"
            self._edited.add(0)
        else:
            self.messages.insert(0, {"role": "system", "content": text})
            self._edited = {index + 1 for index in self._edited}
        self._encoded.clear()

    def append_user_note(self, text: str) -> None:
        """Host feedback outside any tool call (e.g. an unusable reply)."""
        if self.open_calls():
            raise TranscriptError("cannot add user text while tool calls are open")
        self.messages.append({"role": "user", "content": text})

    def last_assistant_calls(self) -> list[dict[str, Any]]:
        for message in reversed(self.messages):
            if message.get("role") == "assistant":
                return list(message.get("tool_calls") or [])
        return []

    def open_calls(self) -> list[str]:
        """Call ids of the last assistant turn that have no result yet, in order."""
        answered: set[str] = set()
        for message in reversed(self.messages):
            role = message.get("role")
            if role == "tool":
                answered.add(str(message.get("tool_call_id")))
            elif role == "assistant":
                return [
                    str(call["id"])
                    for call in message.get("tool_calls") or []
                    if str(call["id"]) not in answered
                ]
            else:
                return []
        return []

    def note_on_result(self, call_id: str, note: str) -> str | None:
        """Add a host note to the `tool` message answering `call_id` (inside its
        JSON body when it has one); returns the new content, None if no such message."""
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message.get("role") == "tool" and message.get("tool_call_id") == call_id:
                try:
                    body = json.loads(message["content"])
                    body["approval_note"] = note
                    message["content"] = json.dumps(
                        body, ensure_ascii=False, separators=(",", ":"), default=str
                    )
                except (ValueError, TypeError):
                    message["content"] = f"[{note}] {message['content']}"
                self._encoded.clear()
                self._edited.add(index)
                return str(message["content"])
        return None

    def replace_message(
        self, index: int, message: Mapping[str, Any], *, edited: bool = True
    ) -> None:
        """Put `message` at `index` (what a `context_edit` does to the context);
        `edited=False` when the caller logs the edit itself."""
        self.messages[index] = dict(message)
        self._encoded.clear()
        if edited:
            self._edited.add(index)

    def reset(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """The context after a compaction: these messages, logged by the caller."""
        self.messages = [dict(message) for message in messages]
        self._encoded.clear()
        self._edited.clear()

    def take_edited(self) -> set[int]:
        edited, self._edited = self._edited, set()
        return edited

    def messages_json(self) -> str:
        """The messages as `json.dumps(messages, ensure_ascii=False)` gives them.

        A step encodes the transcript several times (the token estimate, the
        model call's span, two checkpoints) and it grows with every step: only
        the messages appended since the last call are encoded."""
        encoded = self._encoded
        if len(encoded) > len(self.messages):
            encoded.clear()
        for message in self.messages[len(encoded) :]:
            encoded.append(json.dumps(message, ensure_ascii=False))
        return "[" + ", ".join(encoded) + "]"

    def to_list(self) -> list[dict[str, Any]]:
        return [_json_copy(message) for message in self.messages]

    @classmethod
    def from_list(
        cls, messages: Sequence[Mapping[str, Any]], *, copy: bool = True
    ) -> Transcript:
        """`copy=False` adopts the messages: for data nobody else holds (just
        decoded from the database)."""
        if not copy:
            return cls([dict(message) for message in messages])
        return cls([_json_copy(dict(message)) for message in messages])
