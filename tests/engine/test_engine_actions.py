from __future__ import annotations

from runs.engine.actions import (
    FinalAnswer,
    InvalidReply,
    ModelReply,
    ToolCall,
    ToolCallsAction,
    Usage,
    decode_reply,
)


def test_arguments_are_decoded_into_an_object() -> None:
    call = ToolCall.parse("c1", "lookup_order", '{"order_id": "4821"}')
    assert call.arguments == {"order_id": "4821"}
    assert call.parse_error is None


def test_half_written_arguments_are_a_parse_error() -> None:
    call = ToolCall.parse("c1", "bash", '{"command": "rm -rf')
    assert call.arguments == {}
    assert call.parse_error is not None
    assert call.parse_error.startswith("arguments are not valid JSON")


def test_non_object_arguments_are_a_parse_error() -> None:
    assert (
        ToolCall.parse("c1", "t", "[1, 2]").parse_error
        == "arguments must be a JSON object"
    )


def test_empty_arguments_mean_no_arguments() -> None:
    call = ToolCall.parse("c1", "t", "")
    assert call.arguments == {}
    assert call.parse_error is None


def test_length_finish_marks_every_call_unexecutable() -> None:
    reply = ModelReply(
        tool_calls=(ToolCall.parse("c1", "bash", '{"command": "ls"}'),),
        finish_reason="length",
    )
    action = decode_reply(reply)
    assert isinstance(action, ToolCallsAction)
    assert action.calls[0].parse_error is not None
    assert "finish_reason=length" in action.calls[0].parse_error


def test_length_finish_without_calls_is_not_a_final_answer() -> None:
    action = decode_reply(ModelReply(text="The answer is", finish_reason="length"))
    assert isinstance(action, InvalidReply)
    assert action.reason.startswith("EINVAL")


def test_text_with_tool_calls_is_not_a_final_answer() -> None:
    reply = ModelReply(
        tool_calls=(ToolCall.parse("c1", "t", "{}"),), text="Let me check."
    )
    action = decode_reply(reply)
    assert isinstance(action, ToolCallsAction)
    assert action.text == "Let me check."


def test_duplicate_call_ids_keep_the_first() -> None:
    reply = ModelReply(
        tool_calls=(
            ToolCall.parse("c1", "a", "{}"),
            ToolCall.parse("c1", "b", "{}"),
            ToolCall.parse("c2", "c", "{}"),
        )
    )
    action = decode_reply(reply)
    assert isinstance(action, ToolCallsAction)
    assert [c.name for c in action.calls] == ["a", "c"]


def test_plain_text_is_a_final_answer_and_empty_reply_is_invalid() -> None:
    assert decode_reply(ModelReply(text="Done.")) == FinalAnswer("Done.")
    assert isinstance(decode_reply(ModelReply(text="  ")), InvalidReply)


def test_model_reply_round_trips() -> None:
    reply = ModelReply(
        tool_calls=(ToolCall.parse("c1", "t", '{"a": 1}'),),
        text=None,
        finish_reason="tool_calls",
        usage=Usage(10, 5),
        model="gpt-x-2026",
        provider="openai",
        provider_request_id="req_1",
        response_id="chatcmpl-1",
        raw={"id": "chatcmpl-1"},
        attempts=2,
    )
    assert ModelReply.from_dict(reply.to_dict()) == reply


def test_arguments_hash_ignores_key_order_and_whitespace() -> None:
    a = ToolCall.parse("c1", "t", '{"a": 1, "b": "x"}')
    b = ToolCall.parse("c2", "t", '{"b":"x","a":1}')
    assert a.arguments_sha256 == b.arguments_sha256
    assert (
        a.arguments_sha256
        != ToolCall.parse("c3", "t", '{"a": 2, "b": "x"}').arguments_sha256
    )
