"""Where a retry or a fork continues a session tree (runs.engine.branching):
a retry keeps only whole, good rounds; a fork edits through a `context_edit`
and never starts inside a round; branch entry ids never collide."""

from __future__ import annotations

from typing import Any

import pytest

from runs.engine.branching import (
    BranchPoint,
    BranchRefused,
    branch_state,
    first_seq_of,
    fork_point,
    replies_on_path,
    retry_point,
)
from runs.engine.loop import EngineState
from runs.engine.session import SessionCursor, SessionEntry, build_context, session_path
from runs.engine.transcript import Transcript


def call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "echo", "arguments": "{}"}}  # fmt: skip


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Do two things."},
    {"role": "assistant", "content": "First.", "tool_calls": [call("a")]},
    {"role": "tool", "tool_call_id": "a", "content": '{"ok": true, "data": 1}'},
    {"role": "assistant", "content": "Both.", "tool_calls": [call("b"), call("c")]},
    {"role": "tool", "tool_call_id": "b", "content": '{"ok": true, "data": 2}'},
    {"role": "tool", "tool_call_id": "c", "content": '{"ok": false}'},
    {"role": "assistant", "content": "Done."},
]


def logged(messages: list[dict[str, Any]]) -> tuple[dict[str, SessionEntry], str]:
    cursor = SessionCursor()
    cursor.log_transcript(Transcript.from_list(messages))
    entries = {e.entry_id: e for e in cursor.take_unwritten()}
    assert cursor.leaf is not None
    return entries, cursor.leaf


def test_a_retry_keeps_whole_good_rounds_and_leaves_the_final_answer():
    entries, leaf = logged(MESSAGES)
    path = session_path(entries, leaf)
    every = retry_point(path, lambda entry, call_id: True)
    assert every == path[6].entry_id  # after c's result, before "Done."
    # A cancelled call (never ran): its whole round stays on the original.
    no_c = retry_point(path, lambda entry, call_id: call_id != "c")
    assert no_c == path[3].entry_id
    nothing = retry_point(path, lambda entry, call_id: False)
    assert nothing == path[1].entry_id  # the user's message


def test_a_retry_never_stops_between_a_call_and_its_result():
    entries, leaf = logged(MESSAGES[:6])  # c has no result: the run stopped there
    path = session_path(entries, leaf)
    assert retry_point(path, lambda e, c: True) == path[3].entry_id


def test_a_fork_edits_a_result_through_a_context_edit_after_the_round():
    entries, leaf = logged(MESSAGES)
    path = session_path(entries, leaf)
    point = fork_point(path, path[5].entry_id, tool_result={"ok": True, "data": 9})
    assert point.after == path[6].entry_id  # after c: the round is whole
    state, made = branch_state(
        entries, point, number=3, marker={"reason": "fork"},
        source=EngineState(transcript=Transcript()), replies_before=2,
    )  # fmt: skip
    assert [e.type for e in made] == ["custom", "context_edit"]
    assert [e.seq for e in made] == [first_seq_of(3), first_seq_of(3) + 1]
    assert made[0].parent_id == path[6].entry_id
    expected = [dict(m) for m in MESSAGES[:7]]
    expected[5] = {**expected[5], "content": '{"ok": true, "data": 9}'}
    assert state.transcript.messages == expected
    assert state.session.leaf == made[1].entry_id
    assert state.session.entry_ids[5] == path[5].entry_id
    assert state.replies_before == 2 and state.preflight_done
    # The original branch rebuilds as it was; the new one shows the edit.
    everything = {**entries, **{e.entry_id: e for e in made}}
    assert build_context(everything, leaf) == MESSAGES
    assert build_context(everything, made[1].entry_id) == expected
    assert not set(entries) & {e.entry_id for e in made}


def test_a_fork_from_a_user_message_asks_again_from_there():
    entries, leaf = logged(MESSAGES)
    path = session_path(entries, leaf)
    point = fork_point(path, path[1].entry_id, message="Do one thing.")
    assert point == BranchPoint(
        path[1].entry_id,
        path[1].entry_id,
        {"role": "user", "content": "Do one thing."},
        "message",
    )
    assert replies_on_path(path, point.after) == 0
    assert replies_on_path(path, path[6].entry_id) == 2
    plain = fork_point(path, path[2].entry_id)  # a round: after all of it
    assert plain == BranchPoint(path[3].entry_id)


@pytest.mark.parametrize(
    ("index", "edit", "field"),
    [
        (0, {"message": "x"}, "from_entry"),  # the system message
        (3, {"message": "x"}, "message"),  # a tool result edited as a message
        (1, {"tool_result": "x"}, "tool_result"),  # a user message as a result
        (2, {"message": "x"}, "message"),  # an assistant message that called tools
    ],
)
def test_a_fork_refuses_what_it_cannot_edit(index, edit, field):
    entries, leaf = logged(MESSAGES)
    path = session_path(entries, leaf)
    with pytest.raises(BranchRefused) as refused:
        fork_point(path, path[index].entry_id, **edit)
    assert refused.value.field == field


def test_a_fork_refuses_an_entry_off_the_path_and_an_unanswered_round():
    entries, leaf = logged(MESSAGES[:6])
    path = session_path(entries, leaf)
    with pytest.raises(BranchRefused) as missing:
        fork_point(path, "0000ffff", field="from_step")
    assert missing.value.field == "from_step"
    with pytest.raises(BranchRefused) as open_round:
        fork_point(path, path[5].entry_id, tool_result="x")
    assert open_round.value.field == "from_entry"
    assert "no results yet" in open_round.value.message
