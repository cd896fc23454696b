"""The scripted model: a fixed list of replies, deterministic, for tests and demos.

A script entry is a `ModelReply` or a plain dict:
`{"tool_calls": [{"name": ..., "arguments": {...} | "<raw>", "id": ...}],
"text": ..., "finish_reason": ..., "usage": {...}}`, optionally with
`"on_error": {"<call id>": <entry>}`: the reply given instead when that call's
observation was an error (a denied approval, a failed tool), so a script can
answer truthfully on either path. An `on_error` reply may carry
`"if_message": {"<words>": <entry>}`: the first entry whose words appear in the
failed call's error message (ignoring case) is given instead, so a script can
answer a reviewer's reason ("ask the customer for a photo first"). On an
entry itself (not an `on_error` reply), `if_message` matches the latest user
message instead (a steering or follow-up text, runs.engine.steering), so a
script can answer what a person sent mid-run.
`from_recorded` replays the replies of a recorded run (`ModelReply.to_dict()`
rows).

An entry `{"error": {"kind": ..., "message": ...}}` fails that call with a
`ModelError` (e.g. `context_overflow`, as a provider reports a prompt longer
than the window). A request to summarise the conversation (a compaction,
runs.engine.session) is answered without using up a reply: by the current
entry's `on_compaction` (a reply, or an `error`) if it has one, else by a
summary that lists the request's identifiers and its last line, as a model
asked to keep ids and open items would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from runs.engine.actions import ModelReply, ToolCall, Usage
from runs.engine.adapters import DeltaSink, ModelError
from runs.engine.session import SUMMARY_INSTRUCTIONS

ScriptEntry = ModelReply | Mapping[str, Any]
# `{{call_id.field}}` in a scripted text is filled from that call's observed data,
# so a script can answer with values only the tools know (a date, an id).
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z0-9_.-]+)\.([A-Za-z0-9_]+)\}\}")
# What the default summary keeps: call ids and numbers of four digits or more.
_IDENTIFIER = re.compile(r"\bcall_[A-Za-z0-9_]+|\b\d{4,}\b")


def _observations(messages: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each answered call's observation body, by call id."""
    observed: dict[str, dict[str, Any]] = {}
    for message in messages:
        if message.get("role") == "tool":
            try:
                body = json.loads(str(message.get("content") or ""))
            except json.JSONDecodeError:
                continue
            if isinstance(body, dict):
                observed[str(message.get("tool_call_id"))] = body
    return observed


def fill_placeholders(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """`{{call_id.field}}` from the call's data, or from its error (`message`,
    `code`) when the call failed."""
    observed: dict[str, Any] = {}
    for call_id, body in _observations(messages).items():
        for part in ("data", "error"):
            if isinstance(body.get(part), dict):
                observed[call_id] = body[part]
                break

    def value(match: re.Match[str]) -> str:
        data = observed.get(match.group(1), {})
        found = data.get(match.group(2))
        if isinstance(found, list) and all(isinstance(v, str) for v in found):
            return "; ".join(found)  # a memory file's entries read as a sentence
        return match.group(0) if found is None else str(found)

    return _PLACEHOLDER.sub(value, text)


def branch_of(entry: ScriptEntry, messages: Sequence[Mapping[str, Any]]) -> ScriptEntry:
    """The entry's `on_error` alternative for the first named call that failed."""
    if isinstance(entry, ModelReply) or not entry.get("on_error"):
        return entry
    observed = _observations(messages)
    for call_id, alternative in entry["on_error"].items():
        body = observed.get(str(call_id))
        if body is not None and body.get("ok") is False:
            return branch_of(_by_message(alternative, body), messages)
    return entry


def by_user_message(
    entry: ScriptEntry, messages: Sequence[Mapping[str, Any]]
) -> ScriptEntry:
    """An entry's own `if_message`: the first reply whose words appear in the
    latest user message (ignoring case), else the entry."""
    if isinstance(entry, ModelReply) or not entry.get("if_message"):
        return entry
    latest = next(
        (
            str(m.get("content") or "")
            for m in reversed(messages)
            if m.get("role") == "user"
        ),
        "",
    )
    for words, chosen in entry["if_message"].items():
        if str(words).lower() in latest.lower():
            picked: ScriptEntry = chosen
            return picked
    return entry


def _by_message(alternative: ScriptEntry, body: Mapping[str, Any]) -> ScriptEntry:
    if isinstance(alternative, ModelReply) or not alternative.get("if_message"):
        return alternative
    error = body.get("error")
    message = str(error.get("message", "")) if isinstance(error, dict) else ""
    for words, chosen in alternative["if_message"].items():
        if str(words).lower() in message.lower():
            picked: ScriptEntry = chosen
            return picked
    return alternative


def script_entry_problems(entry: Any, where: str) -> list[str]:
    """What makes a script entry unusable (an agent definition is refused with
    these instead of its runs failing at the reply with a bare TypeError)."""
    if not isinstance(entry, Mapping):
        return [f"{where} must be an object"]
    problems: list[str] = []
    for key in ("text", "finish_reason", "model"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            problems.append(f"{where}.{key} must be a string")
    calls = entry.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        problems.append(f"{where}.tool_calls must be a list of calls")
    for position, call in enumerate(calls if isinstance(calls, list) else ()):
        at = f"{where}.tool_calls[{position}]"
        if not isinstance(call, Mapping):
            problems.append(f"{at} must be an object: name, arguments, id")
            continue
        if not isinstance(call.get("name"), str) or not call["name"]:
            problems.append(f"{at}.name must be the tool's name")
        if not isinstance(call.get("arguments", {}), Mapping | str):
            problems.append(f"{at}.arguments must be an object (or its JSON text)")
        if call.get("id") is not None and not isinstance(call["id"], str):
            problems.append(f"{at}.id must be a string")
    usage = entry.get("usage")
    counts = ("input_tokens", "output_tokens")
    if usage is not None and (
        not isinstance(usage, Mapping)
        or not all(
            type(usage.get(k) or 0) is int and 0 <= (usage.get(k) or 0) < 2**31
            for k in counts
        )
    ):
        problems.append(
            f"{where}.usage must be {{input_tokens, output_tokens}} as counts"
        )
    error = entry.get("error")
    if error is not None and (
        not isinstance(error, Mapping) or not isinstance(error.get("kind"), str)
    ):
        problems.append(f"{where}.error must be {{kind, message}}")
    compaction = entry.get("on_compaction")
    if compaction is not None:
        problems += script_entry_problems(compaction, f"{where}.on_compaction")
    branches = entry.get("on_error")
    if branches is not None and not isinstance(branches, Mapping):
        problems.append(f"{where}.on_error must map a call id to a reply")
    for call_id, branch in (branches if isinstance(branches, Mapping) else {}).items():
        problems += script_entry_problems(branch, f"{where}.on_error[{call_id}]")
    by_message = entry.get("if_message")
    if by_message is not None and not isinstance(by_message, Mapping):
        problems.append(f"{where}.if_message must map words to a reply")
    for words, chosen in (
        by_message if isinstance(by_message, Mapping) else {}
    ).items():
        problems += script_entry_problems(chosen, f"{where}.if_message[{words}]")
    return problems


def reply_from_entry(entry: ScriptEntry, index: int, model: str) -> ModelReply:
    """Turn one script entry into a reply; call ids default to `call_<n>_<i>`.
    Raises the entry's `error`, if it has one."""
    if isinstance(entry, ModelReply):
        return entry
    error = entry.get("error")
    if error is not None:
        raise ModelError(str(error["kind"]), str(error.get("message") or error["kind"]))
    calls: list[ToolCall] = []
    for position, spec in enumerate(entry.get("tool_calls") or ()):
        arguments = spec.get("arguments", {})
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call_id = str(spec.get("id") or f"call_{index}_{position}")
        calls.append(ToolCall.parse(call_id, str(spec["name"]), raw))
    finish = entry.get("finish_reason") or ("tool_calls" if calls else "stop")
    return ModelReply(
        tool_calls=tuple(calls),
        text=entry.get("text"),
        finish_reason=str(finish),
        usage=Usage.from_dict(entry.get("usage")),
        model=str(entry.get("model") or model),
        provider="scripted",
        provider_request_id=f"scripted-{index}",
        response_id=f"scripted-{index}",
    )


class ScriptedModel:
    """Returns the script's replies in order; running out is a `ModelError`."""

    def __init__(
        self, script: Sequence[ScriptEntry], *, model: str = "scripted"
    ) -> None:
        # Parsed when used: a task of a long run asks for one reply of many.
        self._script = list(script)
        self._model = model
        self.calls = 0
        self.max_output_tokens_seen: list[int] = []

    def _summarise(self, messages: Sequence[Mapping[str, Any]]) -> ModelReply:
        """A compaction's summary; the script's position does not move."""
        current = self._script[self.calls] if self.calls < len(self._script) else None
        if isinstance(current, Mapping) and current.get("on_compaction"):
            return reply_from_entry(current["on_compaction"], self.calls, self._model)
        text = str(messages[-1].get("content") or "")
        ids = list(dict.fromkeys(_IDENTIFIER.findall(text)))
        last = text.strip().splitlines()[-1] if text.strip() else ""
        summary = f"Identifiers: {', '.join(ids) or 'none'}. Last: {last[:300]}"
        return ModelReply(
            tool_calls=(),
            text=summary,
            finish_reason="stop",
            usage=Usage(
                input_tokens=len(text) // 4 + 1, output_tokens=len(summary) // 4 + 1
            ),
            model=self._model,
            provider="scripted",
            provider_request_id=f"scripted-summary-{self.calls}",
            response_id=f"scripted-summary-{self.calls}",
        )

    @classmethod
    def from_recorded(
        cls, replies: Sequence[Mapping[str, Any]], *, model: str = "scripted"
    ) -> ScriptedModel:
        """Replay a recorded run: its `ModelReply.to_dict()` rows, in step order."""
        return cls([ModelReply.from_dict(r) for r in replies], model=model)

    @classmethod
    def with_position(
        cls, script: Sequence[ScriptEntry], position: int, *, model: str = "scripted"
    ) -> ScriptedModel:
        """A model that continues a script from reply `position` (a resumed run)."""
        scripted = cls(script, model=model)
        scripted.calls = position
        return scripted

    @property
    def provider(self) -> str:
        return "scripted"

    @property
    def remaining(self) -> int:
        return len(self._script) - self.calls

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        *,
        on_delta: DeltaSink | None = None,
    ) -> ModelReply:
        # A script's reply is whole at once: nothing streams.
        self.max_output_tokens_seen.append(max_output_tokens)
        if messages and messages[0].get("content") == SUMMARY_INSTRUCTIONS:
            return self._summarise(messages)
        if self.calls >= len(self._script):
            raise ModelError(
                "script_exhausted",
                f"the scripted model has no reply left after {len(self._script)}",
            )
        index = self.calls
        self.calls += 1  # an `error` entry is used up too: a retry gets the next
        entry = branch_of(by_user_message(self._script[index], messages), messages)
        reply = reply_from_entry(entry, index, self._model)
        if reply.text and "{{" in reply.text:
            reply = replace(reply, text=fill_placeholders(reply.text, messages))
        return reply
