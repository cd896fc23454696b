"""Steering and follow-up messages at a turn boundary (spec §1.3, scenario 10).

A message a person sends while the run is in a step, waits for an approval or
has ended is queued outside the engine; the lease holder delivers it before
the next model call: a `user` message at the end of the transcript, after every
tool result of the last assistant turn. `Transcript.append_user_note` refuses
while a call is open, so a steering text can never land between a tool call
and its result. The session log records it as a `message` entry whose payload
also says it was steering and who sent it; the context rebuild reads only its
`message`, so the model sees it as any user turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from runs.engine.session import MESSAGE, SessionCursor, SessionEntry
from runs.engine.transcript import Transcript

# The longest steering text accepted (characters); the API refuses longer.
MAX_STEERING_CHARS = 32_000


@dataclass(frozen=True)
class Steering:
    """One queued message, as the engine needs it."""

    message_id: str
    author: str
    text: str


def steering_text_problem(text: object) -> str:
    """Why a steering text is refused ("" when it is acceptable)."""
    if not isinstance(text, str):
        return "the text must be a string"
    if not text.strip():
        return "the text is blank"
    if len(text) > MAX_STEERING_CHARS:
        return f"the text is longer than {MAX_STEERING_CHARS} characters"
    if "\x00" in text:
        return "the text contains a NUL character"
    return ""


def deliver_steering(
    transcript: Transcript, session: SessionCursor, message: Steering
) -> SessionEntry:
    """Append the message as the next user turn and log it; returns its entry.

    What the transcript gained before it is logged first, so that the entry
    follows them on the branch (the transcript and the log stay aligned)."""
    session.log_transcript(transcript)
    transcript.append_user_note(message.text)
    entry = session.append(
        MESSAGE,
        {
            "message": dict(transcript.messages[-1]),
            "steering": {"message_id": message.message_id, "author": message.author},
        },
    )
    session.entry_ids.append(entry.entry_id)
    return entry
