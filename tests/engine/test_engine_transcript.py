"""The transcript's JSON is what encoding its messages at once gives, however it
was reached (appends, a host note, a decoded checkpoint)."""

from __future__ import annotations

import json

from runs.engine.actions import ToolCall
from runs.engine.loop import AgentConfig, EngineState
from runs.engine.transcript import Transcript


def encoded(transcript: Transcript) -> str:
    return json.dumps(transcript.messages, ensure_ascii=False)


def call(call_id: str) -> ToolCall:
    return ToolCall(call_id=call_id, name="echo", arguments={"text": "ü"},
                    raw_arguments='{"text": "ü"}')  # fmt: skip


def test_messages_json_follows_appends() -> None:
    transcript = Transcript.start("be brief", "où est ma commande ?")
    assert transcript.messages_json() == encoded(transcript)
    transcript.append_assistant("looking", [call("c1")])
    transcript.append_tool_message(
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'}
    )
    assert transcript.messages_json() == encoded(transcript)
    assert Transcript().messages_json() == "[]"


def test_a_note_on_a_result_is_in_the_next_json() -> None:
    transcript = Transcript.start("", "go")
    transcript.append_assistant(None, [call("c1")])
    transcript.append_tool_message(
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'}
    )
    before = transcript.messages_json()
    content = transcript.note_on_result("c1", "a reviewer changed the arguments")
    assert content == '{"ok":true,"approval_note":"a reviewer changed the arguments"}'
    assert transcript.messages[-1]["content"] == content
    assert transcript.messages_json() == encoded(transcript) != before
    assert transcript.note_on_result("nope", "x") is None


def test_engine_state_json_decodes_to_its_dict() -> None:
    state = EngineState.start(AgentConfig(name="a"), "go")
    state.transcript.append_assistant("done ✓", [])
    text = state.to_json()
    assert json.loads(text) == state.to_dict()
    again = EngineState.from_dict(json.loads(text), copy=False)
    again.transcript.append_user_note("more")
    assert json.loads(again.to_json()) == again.to_dict()
