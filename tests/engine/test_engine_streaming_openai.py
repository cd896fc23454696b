"""The `openai` adapter streaming against a real local Chat Completions SSE server."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runs.devserver import Behaviour, ChatCompletionsServer, Reply
from runs.engine.actions import Usage
from runs.engine.adapters import ModelError, build_model_adapter
from runs.engine.adapters.openai_compatible import OpenAIModel
from runs.engine.budget import BudgetLimits, BudgetVector
from runs.engine.step import billable_usage, call_model, plan_model_call
from runs.engine.transcript import Transcript

MODEL = "gpt-test-stream"
MESSAGES = [{"role": "user", "content": "Where is order 4821?"}]


@pytest.fixture
def server() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as running:
        assert isinstance(running, ChatCompletionsServer)
        yield running


class Sink:
    """Collects deltas; `discard` is the optional half of the sink protocol."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.discards: list[str] = []
        self.times: list[float] = []

    def __call__(self, text: str) -> None:
        self.deltas.append(text)
        self.times.append(time.monotonic())

    def discard(self, reason: str) -> None:
        self.discards.append(reason)
        self.deltas.clear()


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def model(server: ChatCompletionsServer, **kw: Any) -> OpenAIModel:
    kw.setdefault("sleep", Sleeps())
    return OpenAIModel(
        model=MODEL,
        api_key="sk-stream-test",
        base_url=server.base_url,
        stream=True,
        rng=random.Random(3),
        **kw,
    )


def test_text_streams_to_the_sink_and_the_reply_is_the_whole_text(
    server: ChatCompletionsServer,
) -> None:
    text = "Order 4821 left the warehouse on Monday and arrives Thursday."
    server.reply(text, input_tokens=31, output_tokens=17, chunk_delay=0.01)
    sink = Sink()
    reply = model(server).complete(MESSAGES, [], 128, on_delta=sink)
    assert len(sink.deltas) > 3
    assert "".join(sink.deltas) == text == reply.text
    # The deltas arrived over time, not at once at the end.
    assert sink.times[-1] - sink.times[0] > 0.05
    assert reply.finish_reason == "stop"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (31, 17)
    assert reply.raw is not None and reply.raw["streamed"] is True
    assert reply.provider_request_id == "req_1"
    body = server.requests[0]["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_streamed_tool_calls_are_assembled_by_index(
    server: ChatCompletionsServer,
) -> None:
    server.reply(
        "Let me look.",
        tool_calls=[
            {"id": "call_a", "name": "lookup_order", "arguments": {"order_id": "4821"}},
            {"id": "call_b", "name": "lookup_order", "arguments": '{"order_id": "48'},
        ],
    )
    reply = model(server).complete(MESSAGES, [], 128, on_delta=Sink())
    assert reply.finish_reason == "tool_calls"
    first, second = reply.tool_calls
    assert (first.call_id, first.name, dict(first.arguments)) == (
        "call_a",
        "lookup_order",
        {"order_id": "4821"},
    )
    # Half JSON is kept verbatim and marked, never executed.
    assert second.raw_arguments == '{"order_id": "48' and second.parse_error
    assert reply.text == "Let me look."


def test_a_stream_cut_mid_way_is_retried_and_its_deltas_discarded(
    server: ChatCompletionsServer,
) -> None:
    server.push(Behaviour(reply=Reply(text="Half an answer that never"), drop_after=3))
    server.reply("The whole answer.")
    sink = Sink()
    sleeps = Sleeps()
    reply = model(server, sleep=sleeps).complete(MESSAGES, [], 64, on_delta=sink)
    assert reply.text == "The whole answer." and reply.attempts == 2
    assert sink.discards == ["stream_interrupted"]
    assert "".join(sink.deltas) == "The whole answer."
    assert len(sleeps.calls) == 1 and len(server.requests) == 2


def test_a_stream_that_ends_without_a_finish_reason_is_never_final(
    server: ChatCompletionsServer,
) -> None:
    for _ in range(4):
        server.push(
            Behaviour(reply=Reply(text="Cut short but cleanly"), truncate_after=3)
        )
    with pytest.raises(ModelError) as caught:
        model(server).complete(MESSAGES, [], 64, on_delta=Sink())
    assert caught.value.kind == "stream_interrupted"
    assert caught.value.retryable is True
    assert caught.value.attempts == 4
    assert "without a finish reason" in caught.value.message


def test_an_error_event_inside_the_stream_is_retried(
    server: ChatCompletionsServer,
) -> None:
    server.push(
        Behaviour(stream_error={"message": "overloaded", "type": "server_error"})
    )
    server.reply("fine now")
    reply = model(server).complete(MESSAGES, [], 64, on_delta=Sink())
    assert reply.text == "fine now" and reply.attempts == 2


def test_a_stream_that_never_ends_is_cut_at_the_deadline(
    server: ChatCompletionsServer,
) -> None:
    server.push(Behaviour(endless=True, chunk_delay=0.05))
    sink = Sink()
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model(server, deadline_seconds=1.5).complete(MESSAGES, [], 64, on_delta=sink)
    took = time.monotonic() - started
    assert caught.value.kind == "timeout"
    assert "deadline of 1.5s" in caught.value.message
    assert 1.4 <= took < 3.0
    assert sink.discards == ["timeout"]


def test_a_stream_that_goes_silent_is_cut_at_the_deadline(
    server: ChatCompletionsServer,
) -> None:
    server.push(Behaviour(hang=True))
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model(server, deadline_seconds=1.5).complete(MESSAGES, [], 64)
    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 3.0
    assert len(server.requests) == 1


def test_a_stream_that_trickles_bytes_forever_is_cut_at_the_deadline(
    server: ChatCompletionsServer,
) -> None:
    # Each read gets a byte in time, so only the deadline's watchdog ends it.
    server.push(Behaviour(trickle=True, chunk_delay=0.05))
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        model(server, deadline_seconds=1.5).complete(MESSAGES, [], 64, on_delta=Sink())
    assert caught.value.kind == "timeout"
    assert time.monotonic() - started < 3.0


def test_429_with_retry_after_then_a_stream(server: ChatCompletionsServer) -> None:
    server.error(429, "Rate limit reached", headers={"retry-after": "4"})
    server.reply("after the wait")
    sleeps = Sleeps()
    reply = model(server, sleep=sleeps).complete(MESSAGES, [], 64, on_delta=Sink())
    assert reply.text == "after the wait"
    assert len(sleeps.calls) == 1 and sleeps.calls[0] >= 4


def test_401_is_not_retried_and_names_no_key(server: ChatCompletionsServer) -> None:
    server.error(401, "Incorrect API key provided")
    with pytest.raises(ModelError) as caught:
        model(server).complete(MESSAGES, [], 64, on_delta=Sink())
    assert caught.value.kind == "auth" and caught.value.attempts == 1
    assert "sk-stream-test" not in str(caught.value)


def test_a_key_the_provider_quotes_back_whole_or_in_part_is_hidden(
    server: ChatCompletionsServer,
) -> None:
    server.error(401, "Invalid key sk-stream-test; did you mean sk-stream-te****?")
    with pytest.raises(ModelError) as caught:
        model(server).complete(MESSAGES, [], 64, on_delta=Sink())
    said = str(caught.value)
    assert "sk-stream-te" not in said and "stream-t" not in said
    assert "Invalid key [REDACTED]; did you mean [REDACTED]****?" in said


def test_a_stream_without_usage_is_charged_the_reservation(
    server: ChatCompletionsServer,
) -> None:
    server.push(Behaviour(reply=Reply(text="no usage here", usage=False)))
    transcript = Transcript.start("", "Where is order 4821?")
    plan = plan_model_call(
        BudgetVector(), BudgetLimits(), transcript, [], reserve_output_tokens=200
    )
    assert not isinstance(plan, str)
    reply = call_model(model(server), transcript.messages, [], plan, on_delta=Sink())
    assert not isinstance(reply, ModelError)
    assert reply.usage == Usage(0, 0)
    charged = billable_usage(reply, plan)
    assert charged == Usage(plan.estimated_input_tokens, 200)


def test_the_endpoint_option_turns_streaming_off(
    server: ChatCompletionsServer,
) -> None:
    server.reply("plain JSON")
    adapter = build_model_adapter(
        "openai",
        model=MODEL,
        api_key="k",
        base_url=server.base_url,
        options={"stream": False},
    )
    sink = Sink()
    reply = adapter.complete(MESSAGES, [], 64, on_delta=sink)
    assert reply.text == "plain JSON" and sink.deltas == []
    assert "stream" not in server.requests[0]["body"]


def test_a_server_that_ignores_stream_and_answers_json_is_read_whole(
    server: ChatCompletionsServer,
) -> None:
    server.push(Behaviour(reply=Reply(text="whole JSON"), stream=False))
    sink = Sink()
    reply = model(server).complete(MESSAGES, [], 64, on_delta=sink)
    assert reply.text == "whole JSON" and reply.attempts == 1
    assert server.requests[0]["body"]["stream"] is True
