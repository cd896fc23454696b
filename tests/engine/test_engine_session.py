"""The session log and the context rebuilt from a leaf (spec §1.1-1.2,
acceptance scenario 18), and compaction kept equal to that rebuild."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from runs.engine.actions import ToolCall
from runs.engine.session import (
    DROPPED_OUTPUT,
    SUMMARY_PREFIX,
    SessionCursor,
    SessionEntry,
    SessionLogError,
    apply_compaction,
    build_context,
    drop_old_tool_outputs,
    first_kept_index,
    session_path,
    summary_request,
)
from runs.engine.transcript import Transcript

SYSTEM = {"role": "system", "content": "You are Kettlecraft's support agent."}
USER = {"role": "user", "content": "Order 4821 arrived damaged."}
LOOKUP = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup_order", "arguments": '{"order_id":"4821"}'},
        }
    ],
}
LOOKED_UP = {"role": "tool", "tool_call_id": "call_1", "content": '{"ok":true}'}
WARRANTY_Q = {"role": "user", "content": "Is it still under warranty?"}
WARRANTY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "check_warranty", "arguments": '{"order_id":"4821"}'},
        }
    ],
}
COVERED = {
    "role": "tool",
    "tool_call_id": "call_2",
    "content": '{"ok":true,"data":{"covered":true,"raw":"' + "x" * 200 + '"}}',
}
COVERED_EDITED = {
    "role": "tool",
    "tool_call_id": "call_2",
    "content": '{"ok":true,"data":{"covered":true}}',
}
ANSWER = {"role": "assistant", "content": "It is covered: a replacement is on its way."}
REFUND = {"role": "user", "content": "Actually, I would rather have a refund."}
SUMMARY = "Order 4821 (delivered) arrived damaged; looked up with call_1."


def entry(seq: int, parent: int | None, type_: str, payload: Any) -> SessionEntry:
    return SessionEntry(
        seq, f"{seq:08x}", None if parent is None else f"{parent:08x}", type_, payload
    )


def golden_log() -> list[SessionEntry]:
    """system, user, assistant, toolResult ... a compaction keeping from entry 4,
    an edit of entry 6, custom, usage and label entries; entry 13 branches off
    the compaction, before the edit."""
    return [
        entry(0, None, "message", {"message": SYSTEM}),
        entry(1, 0, "message", {"message": USER}),
        entry(2, 1, "message", {"message": LOOKUP}),
        entry(3, 2, "message", {"message": LOOKED_UP}),
        entry(4, 3, "message", {"message": WARRANTY_Q}),
        entry(5, 4, "message", {"message": WARRANTY}),
        entry(6, 5, "message", {"message": COVERED}),
        entry(
            7,
            6,
            "compaction",
            {
                "summary": SUMMARY,
                "firstKeptEntryId": "00000004",
                "tokensBefore": 1200,
                "checkpoint": [SYSTEM],
            },
        ),
        entry(
            8,
            7,
            "context_edit",
            {"target": "00000006", "action": "replace", "message": COVERED_EDITED},
        ),
        entry(9, 8, "custom", {"kind": "ui_state", "data": {"tab": "trace"}}),
        entry(10, 9, "usage", {"input_tokens": 900, "output_tokens": 40}),
        entry(11, 10, "label", {"name": "warranty checked"}),
        entry(12, 11, "message", {"message": ANSWER}),
        entry(13, 7, "message", {"message": REFUND}),
    ]


def billed(entries: list[SessionEntry]) -> int:
    """The tokens the log records as spent (every branch: billing is what happened)."""
    return sum(
        e.payload["input_tokens"] + e.payload["output_tokens"]
        for e in entries
        if e.type == "usage"
    )


def test_golden_log_rebuilds_to_the_exact_message_list():
    log = golden_log()
    raw = copy.deepcopy(log)
    assert build_context(log, "0000000c") == [
        SYSTEM,
        {"role": "user", "content": SUMMARY_PREFIX + SUMMARY},
        WARRANTY_Q,
        WARRANTY,
        COVERED_EDITED,
        ANSWER,
    ]
    # Rebuilding changes no entry, and the billing the log records stays.
    assert log == raw
    assert billed(log) == 940


def test_a_leaf_on_a_branch_before_the_edit_shows_the_original():
    log = golden_log()
    assert build_context(log, "0000000d") == [
        SYSTEM,
        {"role": "user", "content": SUMMARY_PREFIX + SUMMARY},
        WARRANTY_Q,
        WARRANTY,
        COVERED,
        REFUND,
    ]
    assert billed(log) == 940


def test_a_leaf_before_the_compaction_rebuilds_every_message():
    assert build_context(golden_log(), "00000006") == [
        SYSTEM,
        USER,
        LOOKUP,
        LOOKED_UP,
        WARRANTY_Q,
        WARRANTY,
        COVERED,
    ]


def test_the_latest_edit_of_an_entry_wins_and_remove_drops_it():
    log = golden_log()[:13]
    log.append(
        entry(13, 12, "context_edit", {"target": "0000000c", "action": "remove"})
    )
    again = {**COVERED_EDITED, "content": '{"ok":true}'}
    log.append(
        entry(
            14,
            13,
            "context_edit",
            {"target": "00000006", "action": "replace", "message": again},
        )
    )
    messages = build_context(log, "0000000e")
    assert messages[-1] == again
    assert ANSWER not in messages


def test_only_the_latest_compaction_counts_and_a_summary_is_not_kept_twice():
    log = golden_log()[:13]
    log.append(
        entry(
            13,
            12,
            "compaction",
            {
                "summary": "Covered; replacement promised.",
                "firstKeptEntryId": "00000005",
                "tokensBefore": 800,
                "checkpoint": [SYSTEM],
            },
        )
    )
    assert build_context(log, "0000000d") == [
        SYSTEM,
        {"role": "user", "content": SUMMARY_PREFIX + "Covered; replacement promised."},
        WARRANTY,
        COVERED_EDITED,
        ANSWER,
    ]


def test_a_broken_log_is_refused():
    log = golden_log()
    with pytest.raises(SessionLogError, match="no entry 000000ff"):
        session_path({e.entry_id: e for e in log}, "000000ff")
    looped = {
        "00000001": entry(1, 2, "label", {}),
        "00000002": entry(2, 1, "label", {}),
    }
    with pytest.raises(SessionLogError, match="its own ancestor"):
        session_path(looped, "00000001")


def _call(call_id: str, name: str = "lookup_order") -> ToolCall:
    return ToolCall.parse(call_id, name, '{"order_id":"4821"}')


def _turns(transcript: Transcript, start: int, count: int, size: int = 400) -> None:
    for i in range(start, start + count):
        call_id = f"call_{i}"
        transcript.append_assistant(f"turn {i}", [_call(call_id)])
        transcript.append_tool_message(
            {"role": "tool", "tool_call_id": call_id, "content": f"{i}:" + "y" * size}
        )


def _stored(cursor: SessionCursor, log: dict[str, SessionEntry]) -> None:
    for written in cursor.take_unwritten():
        log[written.entry_id] = written


def test_the_log_rebuilds_the_transcript_through_edits_and_compactions():
    """What the host relies on: at each write, the log rebuilds exactly the
    context the transcript holds (the checkpoint is an incremental rebuild)."""
    transcript = Transcript.start("Be brief.", "Order 4821 is damaged")
    transcript.add_context("The customer is a VIP.")
    cursor = SessionCursor()
    log: dict[str, SessionEntry] = {}
    for round_ in range(4):
        _turns(transcript, round_ * 10, 10)
        transcript.note_on_result(f"call_{round_ * 10 + 9}", "a reviewer edited it")
        cursor.log_transcript(transcript)
        _stored(cursor, log)
        assert build_context(log, cursor.leaf) == transcript.messages
        dropped = drop_old_tool_outputs(transcript, cursor)
        assert dropped >= 1
        _stored(cursor, log)
        assert build_context(log, cursor.leaf) == transcript.messages
        keep_from = first_kept_index(transcript.messages)
        assert keep_from is not None
        apply_compaction(
            transcript, cursor, summary=f"round {round_}", keep_from=keep_from,
            tokens_before=1000,
        )  # fmt: skip
        _stored(cursor, log)
        assert build_context(log, cursor.leaf) == transcript.messages
    messages = transcript.messages
    assert messages[0]["role"] == "system" and "VIP" in messages[0]["content"]
    assert messages[1] == {"role": "user", "content": SUMMARY_PREFIX + "round 3"}
    # The verbatim tail starts at an assistant turn, never at a lone result.
    assert messages[2]["role"] == "assistant"
    # The raw log kept every output in full.
    raw = [e for e in log.values() if e.type == "message"]
    assert sum(1 for e in raw if e.payload["message"]["role"] == "tool") == 40
    assert all(
        DROPPED_OUTPUT.split(";")[0] not in e.payload["message"].get("content", "")
        for e in raw
        if e.payload["message"]["role"] == "tool"
    )


def test_the_summary_request_carries_the_ids_and_asks_for_open_items():
    transcript = Transcript.start("Be brief.", "Replace order 4821")
    _turns(transcript, 0, 5, size=10)
    keep_from = first_kept_index(transcript.messages)
    assert keep_from is not None
    request = summary_request(transcript.messages, keep_from)
    instructions = request[0]["content"]
    assert "identifier" in instructions and "open items" in instructions
    text = request[1]["content"]
    assert "4821" in text and "call_0" in text and "Be brief." not in text
    json.dumps(request)  # plain JSON, ready to send


def test_a_note_on_a_logged_result_is_an_edit_and_the_original_stays():
    transcript = Transcript.start("Be brief.", "Replace order 4821")
    _turns(transcript, 0, 2, size=10)
    cursor = SessionCursor()
    log: dict[str, SessionEntry] = {}
    cursor.log_transcript(transcript)
    _stored(cursor, log)
    before = cursor.leaf
    original = copy.deepcopy(transcript.messages)
    transcript.note_on_result("call_0", "a reviewer changed the reason")
    cursor.log_transcript(transcript)
    (edit,) = cursor.take_unwritten()
    log[edit.entry_id] = edit
    assert edit.type == "context_edit"
    assert edit.payload["target"] == cursor.entry_ids[3]
    assert build_context(log, cursor.leaf) == transcript.messages
    assert "a reviewer changed the reason" in transcript.messages[3]["content"]
    assert build_context(log, before) == original
