"""The `anthropic` adapter (official SDK) against a real local Messages API server."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runs.devserver import Behaviour, MessagesServer, Reply
from runs.engine.adapters import ModelError, build_model_adapter
from runs.engine.adapters.anthropic_messages import AnthropicModel, to_anthropic
from runs.engine.loop import AgentConfig, run_in_process
from runs.engine.stop import RunStatus
from runs.engine.tools import ToolRegistry
from tests.engine.fakes import Shop

MODEL = "claude-test-1"
MESSAGES = [
    {"role": "system", "content": "You are the shop's agent."},
    {"role": "user", "content": "Where is order 4821?"},
]


@pytest.fixture
def server() -> Iterator[MessagesServer]:
    with MessagesServer() as running:
        assert isinstance(running, MessagesServer)
        yield running


class Sink:
    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.discards: list[str] = []

    def __call__(self, text: str) -> None:
        self.deltas.append(text)

    def discard(self, reason: str) -> None:
        self.discards.append(reason)
        self.deltas.clear()


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def model(server: MessagesServer, *, stream: bool = True, **kw: Any) -> AnthropicModel:
    kw.setdefault("sleep", Sleeps())
    return AnthropicModel(
        model=MODEL,
        api_key="sk-ant-test-key",
        base_url=server.base_url,
        stream=stream,
        rng=random.Random(5),
        **kw,
    )


def test_streamed_text_usage_and_the_request_in_messages_format(
    server: MessagesServer, registry: ToolRegistry
) -> None:
    server.reply("It ships on Thursday.", input_tokens=40, output_tokens=9)
    sink = Sink()
    reply = model(server).complete(MESSAGES, registry.model_tools(), 300, on_delta=sink)
    assert "".join(sink.deltas) == "It ships on Thursday." == reply.text
    assert len(sink.deltas) > 1
    assert reply.finish_reason == "stop"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (40, 9)
    assert reply.provider == "anthropic" and reply.model == MODEL
    assert reply.provider_request_id == "req_1" and reply.response_id == "msg_1"
    [request] = server.requests
    assert request["path"] == "/v1/messages"
    assert request["headers"]["authorization"] == "Bearer sk-ant-test-key"
    # No retries under ours, no trace headers of the SDK's.
    assert request["headers"].get("x-stainless-retry-count", "0") == "0"
    assert "traceparent" not in request["headers"]
    body = request["body"]
    assert body["system"] == "You are the shop's agent."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where is order 4821?"}]}
    ]
    assert body["max_tokens"] == 300 and body["stream"] is True
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    names = [tool["name"] for tool in body["tools"]]
    assert names == ["lookup_order", "create_replacement"]
    assert body["tools"][0]["input_schema"]["type"] == "object"


def test_streamed_tool_use_becomes_tool_calls(server: MessagesServer) -> None:
    server.reply(
        "Looking it up.",
        tool_calls=[
            {"id": "toolu_1", "name": "lookup_order", "arguments": {"order_id": "4821"}}
        ],
    )
    reply = model(server).complete(MESSAGES, [], 100, on_delta=Sink())
    assert reply.finish_reason == "tool_calls"
    [call] = reply.tool_calls
    assert (call.call_id, call.name, dict(call.arguments)) == (
        "toolu_1",
        "lookup_order",
        {"order_id": "4821"},
    )
    assert reply.text == "Looking it up."


@pytest.mark.parametrize("stream", [True, False])
def test_max_tokens_is_length(server: MessagesServer, stream: bool) -> None:
    server.reply("cut", finish_reason="max_tokens")
    reply = model(server, stream=stream).complete(MESSAGES, [], 5)
    assert reply.finish_reason == "length"


def test_non_streaming_mode(server: MessagesServer) -> None:
    server.reply(
        None,
        tool_calls=[
            {"id": "toolu_9", "name": "lookup_order", "arguments": {"order_id": "1"}}
        ],
    )
    reply = model(server, stream=False).complete(MESSAGES, [], 100, on_delta=Sink())
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls[0].arguments == {"order_id": "1"}
    assert "stream" not in server.requests[0]["body"]


def test_429_with_retry_after_and_529_overloaded_are_retried(
    server: MessagesServer,
) -> None:
    server.error(429, "rate limited", headers={"retry-after": "5"})
    server.error(529, "Overloaded")
    server.reply("finally")
    sleeps = Sleeps()
    reply = model(server, sleep=sleeps).complete(MESSAGES, [], 100, on_delta=Sink())
    assert reply.text == "finally" and reply.attempts == 3
    assert sleeps.calls[0] >= 5 and len(sleeps.calls) == 2


def test_529_until_out_of_retries_is_an_overloaded_model_error(
    server: MessagesServer,
) -> None:
    for _ in range(4):
        server.error(529, "Overloaded")
    with pytest.raises(ModelError) as caught:
        model(server).complete(MESSAGES, [], 100)
    assert caught.value.kind == "overloaded" and caught.value.attempts == 4
    assert caught.value.status_code == 529 and caught.value.retryable


@pytest.mark.parametrize(("status", "kind"), [(401, "auth"), (400, "bad_request")])
def test_401_and_400_are_not_retried(
    server: MessagesServer, status: int, kind: str
) -> None:
    server.error(status, "nope")
    sleeps = Sleeps()
    with pytest.raises(ModelError) as caught:
        model(server, sleep=sleeps).complete(MESSAGES, [], 100)
    assert caught.value.kind == kind and caught.value.attempts == 1
    assert sleeps.calls == [] and len(server.requests) == 1
    assert "sk-ant-test-key" not in str(caught.value)
    assert caught.value.provider_request_id == "req_1"


def test_a_slow_answer_times_out_and_is_retried(server: MessagesServer) -> None:
    server.push(Behaviour(reply=Reply(text="late"), delay=1.0))
    server.reply("on time")
    reply = model(server, timeout_seconds=0.3).complete(MESSAGES, [], 100)
    assert reply.text == "on time" and reply.attempts == 2


def test_an_overloaded_error_event_mid_stream_is_retried(
    server: MessagesServer,
) -> None:
    server.push(
        Behaviour(stream_error={"type": "overloaded_error", "message": "Overloaded"})
    )
    server.reply("second try")
    sink = Sink()
    reply = model(server).complete(MESSAGES, [], 100, on_delta=sink)
    assert reply.text == "second try" and reply.attempts == 2
    assert sink.discards == ["overloaded"]


def test_a_dropped_stream_is_retried_never_half_final(server: MessagesServer) -> None:
    server.push(Behaviour(reply=Reply(text="A long answer that breaks"), drop_after=5))
    server.reply("Whole.")
    sink = Sink()
    reply = model(server).complete(MESSAGES, [], 100, on_delta=sink)
    assert reply.text == "Whole." and reply.attempts == 2
    assert sink.discards == ["stream_interrupted"] and sink.deltas == ["Whole."]


def test_an_endless_stream_is_cut_at_the_deadline(server: MessagesServer) -> None:
    server.push(Behaviour(endless=True, chunk_delay=0.05))
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model(server, deadline_seconds=1.5).complete(MESSAGES, [], 100, on_delta=Sink())
    assert caught.value.kind == "timeout"
    assert 1.4 <= time.monotonic() - started < 3.0


@pytest.mark.parametrize("how", ["hang", "trickle"])
def test_a_silent_or_trickling_stream_is_cut_at_the_deadline(
    server: MessagesServer, how: str
) -> None:
    server.push(Behaviour(**{how: True}, chunk_delay=0.05))
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model(server, deadline_seconds=1.5).complete(MESSAGES, [], 100)
    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 3.0


def test_the_transcript_maps_to_messages_with_tool_use_and_results() -> None:
    system, turns = to_anthropic(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Q"},
            {
                "role": "assistant",
                "content": "checking",
                "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "t", "arguments": '{"a": 1}'}},
                    {"id": "c2", "type": "function",
                     "function": {"name": "t", "arguments": '{"a": '}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"ok": true}'},
            {"role": "tool", "tool_call_id": "c2", "content": '{"ok": false}'},
            {"role": "user", "content": "note"},
        ]
    )  # fmt: skip
    assert system == "S"
    assert [turn["role"] for turn in turns] == ["user", "assistant", "user"]
    uses = turns[1]["content"]
    assert uses[0] == {"type": "text", "text": "checking"}
    assert uses[1]["input"] == {"a": 1} and uses[2]["input"] == {}
    results = turns[2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert results[1]["is_error"] is True and "is_error" not in results[0]


def test_a_whole_run_through_the_messages_api(
    server: MessagesServer, registry: ToolRegistry, shop: Shop
) -> None:
    server.reply(
        None,
        tool_calls=[
            {"id": "toolu_a", "name": "lookup_order", "arguments": {"order_id": "4821"}}
        ],
    )
    server.reply("Order 4821 is on its way.")
    adapter = build_model_adapter(
        "anthropic",
        model=MODEL,
        api_key="k",
        base_url=server.base_url,
        options={"stream": True},
    )
    result = run_in_process(
        AgentConfig(name="a", system_prompt="Be brief."),
        adapter,
        registry,
        user_input="Where is 4821?",
    )
    assert result.status is RunStatus.UNVERIFIED
    assert [args["order_id"] for _, args, _ in shop.invocations] == ["4821"]
    second = server.requests[1]["body"]["messages"]
    assert second[1]["content"][0]["type"] == "tool_use"
    assert second[2]["content"][0]["tool_use_id"] == "toolu_a"
    assert json.loads(second[2]["content"][0]["content"])["ok"] is True
