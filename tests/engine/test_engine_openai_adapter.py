"""The `openai` adapter against a real HTTP server speaking Chat Completions."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runs.engine.adapters import ModelError
from runs.engine.adapters.openai_compatible import OpenAIModel
from runs.engine.loop import AgentConfig, run_in_process
from runs.engine.stop import RunStatus
from runs.engine.tools import ToolRegistry
from tests.engine.fakes import Shop

MODEL = "gpt-test-2026-01-01"


def completion(
    *,
    content: str | None = None,
    tool_calls: list[tuple[str, str, str]] | None = None,
    finish_reason: str = "stop",
    response_id: str = "chatcmpl-1",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for cid, name, args in tool_calls
        ]
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


def error_body(message: str, code: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


class FakeProvider:
    """Serves queued responses: (status, headers, body, delay_seconds)."""

    def __init__(self) -> None:
        self.responses: list[tuple[int, dict[str, str], dict[str, Any], float]] = []
        self.requests: list[dict[str, Any]] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length))
                provider.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                status, headers, payload, delay = provider.responses.pop(0)
                time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.02},
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def push(
        self,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.responses.append((status, headers or {}, body, delay))


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def make_model(provider: FakeProvider, sleeps: Sleeps, **kw: Any) -> OpenAIModel:
    return OpenAIModel(
        model=MODEL,
        api_key="sk-test",
        base_url=provider.base_url,
        sleep=sleeps,
        rng=random.Random(7),
        **kw,
    )


MESSAGES = [{"role": "user", "content": "Where is order 4821?"}]


def test_tool_calls_are_parsed_and_the_provider_record_is_kept(
    provider: FakeProvider,
) -> None:
    provider.push(
        200,
        completion(
            tool_calls=[
                ("call_1", "lookup_order", '{"order_id": "4821"}'),
                ("call_2", "get_delivery_date", '{"shipment": "S-1"}'),
            ],
            finish_reason="tool_calls",
        ),
        headers={"x-request-id": "req_abc123"},
    )
    reply = make_model(provider, Sleeps()).complete(MESSAGES, [], 256)
    assert [(c.call_id, c.name, dict(c.arguments)) for c in reply.tool_calls] == [
        ("call_1", "lookup_order", {"order_id": "4821"}),
        ("call_2", "get_delivery_date", {"shipment": "S-1"}),
    ]
    assert reply.finish_reason == "tool_calls"
    assert reply.provider_request_id == "req_abc123"
    assert reply.response_id == "chatcmpl-1"
    assert reply.model == MODEL
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (12, 7)
    assert reply.attempts == 1
    assert reply.raw is not None and reply.raw["id"] == "chatcmpl-1"


def test_request_carries_tools_serial_calls_and_the_output_reservation(
    provider: FakeProvider, registry: ToolRegistry
) -> None:
    provider.push(200, completion(content="Hi"))
    make_model(provider, Sleeps()).complete(MESSAGES, registry.model_tools(), 321)
    [request] = provider.requests
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert body["model"] == MODEL
    assert body["max_completion_tokens"] == 321
    assert body["parallel_tool_calls"] is False
    assert body["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in body["tools"]] == [
        "lookup_order",
        "create_replacement",
    ]
    assert request["headers"]["authorization"] == "Bearer sk-test"


def test_429_with_retry_after_waits_at_least_that_long_then_succeeds(
    provider: FakeProvider,
) -> None:
    provider.push(
        429,
        error_body("Rate limit reached", "rate_limit_exceeded", "requests"),
        headers={"retry-after": "7"},
    )
    provider.push(200, completion(content="ok"))
    sleeps = Sleeps()
    reply = make_model(provider, sleeps).complete(MESSAGES, [], 64)
    assert reply.text == "ok"
    assert reply.attempts == 2
    assert len(sleeps.calls) == 1 and sleeps.calls[0] >= 7
    assert len(provider.requests) == 2
    # The SDK itself never retried: each HTTP request is a first attempt.
    assert all(
        r["headers"].get("x-stainless-retry-count", "0") == "0"
        for r in provider.requests
    )


def test_500_is_retried_at_most_three_times_then_model_error(
    provider: FakeProvider,
) -> None:
    for _ in range(5):
        provider.push(
            500,
            error_body("boom", "server_error", "server_error"),
            headers={"x-request-id": "req_500"},
        )
    sleeps = Sleeps()
    with pytest.raises(ModelError) as caught:
        make_model(provider, sleeps).complete(MESSAGES, [], 64)
    assert caught.value.kind == "server"
    assert caught.value.status_code == 500
    assert caught.value.attempts == 4
    assert caught.value.provider_request_id == "req_500"
    assert len(provider.requests) == 4
    assert len(sleeps.calls) == 3
    # Exponential backoff from 2 s with jitter in [50%, 100%].
    for attempt, delay in enumerate(sleeps.calls):
        assert 2.0 * 2**attempt * 0.5 <= delay <= 2.0 * 2**attempt


def test_401_is_not_retried(provider: FakeProvider) -> None:
    provider.push(
        401, error_body("Incorrect API key", "invalid_api_key", "invalid_request_error")
    )
    sleeps = Sleeps()
    with pytest.raises(ModelError) as caught:
        make_model(provider, sleeps).complete(MESSAGES, [], 64)
    assert caught.value.kind == "auth"
    assert caught.value.retryable is False
    assert len(provider.requests) == 1
    assert sleeps.calls == []
    assert "sk-test" not in str(caught.value)


def test_insufficient_quota_is_not_retried(provider: FakeProvider) -> None:
    provider.push(
        429,
        error_body(
            "You exceeded your current quota",
            "insufficient_quota",
            "insufficient_quota",
        ),
    )
    sleeps = Sleeps()
    with pytest.raises(ModelError) as caught:
        make_model(provider, sleeps).complete(MESSAGES, [], 64)
    assert caught.value.kind == "quota_exhausted"
    assert len(provider.requests) == 1
    assert sleeps.calls == []


def test_retry_after_beyond_the_max_delay_is_not_waited_for(
    provider: FakeProvider,
) -> None:
    provider.push(
        429,
        error_body("slow down", "rate_limit_exceeded", "requests"),
        headers={"retry-after": "3600"},
    )
    sleeps = Sleeps()
    with pytest.raises(ModelError) as caught:
        make_model(provider, sleeps).complete(MESSAGES, [], 64)
    assert caught.value.kind == "rate_limited"
    assert sleeps.calls == []


def test_timeout_is_retried(provider: FakeProvider) -> None:
    provider.push(200, completion(content="late"), delay=1.0)
    provider.push(200, completion(content="on time"))
    sleeps = Sleeps()
    reply = make_model(provider, sleeps, timeout_seconds=0.3).complete(MESSAGES, [], 64)
    assert reply.text == "on time"
    assert reply.attempts == 2
    assert len(sleeps.calls) == 1


def test_connection_error_is_retried_then_model_error() -> None:
    sleeps = Sleeps()
    model = OpenAIModel(
        model=MODEL,
        api_key="k",
        base_url="http://127.0.0.1:9/v1",
        sleep=sleeps,
        rng=random.Random(1),
        timeout_seconds=2,
    )
    with pytest.raises(ModelError) as caught:
        model.complete(MESSAGES, [], 64)
    assert caught.value.kind == "connection"
    assert caught.value.attempts == 4
    assert len(sleeps.calls) == 3


def test_finish_reason_length_reaches_the_loop_and_nothing_runs(
    provider: FakeProvider, registry: ToolRegistry, shop: Shop
) -> None:
    provider.push(
        200,
        completion(
            tool_calls=[("call_1", "lookup_order", '{"order_id": "48')],
            finish_reason="length",
        ),
    )
    provider.push(
        200,
        completion(content="Sorry, let me answer briefly.", response_id="chatcmpl-2"),
    )
    result = run_in_process(
        AgentConfig(name="a"),
        make_model(provider, Sleeps()),
        registry,
        user_input="Where is 4821?",
    )
    assert shop.invocations == []
    tool_message = result.messages[2]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
    assert json.loads(tool_message["content"])["error"]["code"] == "EINVAL"
    # The second request carried the assistant call verbatim and its one result.
    sent = provider.requests[1]["body"]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"order_id": "48'
    assert sent[2]["tool_call_id"] == "call_1"


def test_full_run_against_the_provider(
    provider: FakeProvider, registry: ToolRegistry, shop: Shop
) -> None:
    provider.push(
        200,
        completion(
            tool_calls=[
                ("call_1", "lookup_order", '{"order_id": "4821"}'),
                ("call_2", "lookup_order", '{"order_id": "4822"}'),
            ],
            finish_reason="tool_calls",
        ),
    )
    provider.push(
        200, completion(content="Both orders found.", response_id="chatcmpl-2")
    )
    result = run_in_process(
        AgentConfig(name="a"),
        make_model(provider, Sleeps()),
        registry,
        user_input="Check 4821 and 4822",
    )
    assert result.status is RunStatus.UNVERIFIED
    assert [args["order_id"] for _, args, _ in shop.invocations] == ["4821", "4822"]
    assert [
        m["tool_call_id"]
        for m in provider.requests[1]["body"]["messages"]
        if m["role"] == "tool"
    ] == ["call_1", "call_2"]
    assert result.state.usage.input_tokens == 24
    assert [s.reply.response_id for s in result.steps] == ["chatcmpl-1", "chatcmpl-2"]


def test_tool_calls_finish_with_no_calls_is_asked_again_once(
    provider: FakeProvider,
) -> None:
    provider.push(200, completion(finish_reason="tool_calls"))
    provider.push(200, completion(finish_reason="tool_calls", response_id="chatcmpl-2"))
    reply = make_model(provider, Sleeps()).complete(MESSAGES, [], 64)
    assert len(provider.requests) == 2
    assert reply.response_id == "chatcmpl-2"
    assert reply.attempts == 2


class ClockedSleeps(Sleeps):
    """Sleeps that move a fake clock: the backoffs are all the time there is."""

    def clock(self) -> float:
        return sum(self.calls)


def test_the_call_deadline_cuts_a_slow_attempt_short_and_is_not_retried_past(
    provider: FakeProvider,
) -> None:
    provider.push(200, completion(content="far too late"), delay=4.0)
    provider.push(200, completion(content="never asked"))
    sleeps = Sleeps()
    model = make_model(provider, sleeps, timeout_seconds=60, deadline_seconds=1.5)
    with pytest.raises(ModelError) as caught:
        model.complete(MESSAGES, [], 64)
    assert caught.value.kind == "timeout" and caught.value.attempts == 1
    assert "deadline of 1.5s" in caught.value.message
    assert sleeps.calls == [] and len(provider.requests) == 1


def test_a_backoff_that_would_reach_the_deadline_is_not_slept(
    provider: FakeProvider,
) -> None:
    for _ in range(4):
        provider.push(500, error_body("boom", "server_error", "server_error"))
    sleeps = ClockedSleeps()
    model = make_model(provider, sleeps, deadline_seconds=6.0, clock=sleeps.clock)
    with pytest.raises(ModelError) as caught:
        model.complete(MESSAGES, [], 64)
    # 2 s then 4 s (jittered to 50-100%) fit in 6 s only while 1 s is left after.
    assert caught.value.kind == "server"
    assert caught.value.attempts == len(sleeps.calls) + 1 < 4
    assert sum(sleeps.calls) <= 6.0 - 1.0
    assert "deadline of 6s" in caught.value.message
    assert len(provider.requests) == caught.value.attempts
