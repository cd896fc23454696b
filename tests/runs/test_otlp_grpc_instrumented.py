"""opentelemetry-instrumentation-openai-v2 in its default mode sends message
content as log events: the real OpenAI SDK against a local Chat Completions
server, spans and log records through the official OTLP/gRPC exporters to a real
gRPC receiver; each chat span ends up with its messages and finish reason."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.services import api_token_issue
from runs.devserver.chat_completions import ChatCompletionsServer
from runs.models import Run
from runs.otlp.grpc_server import OtlpGrpcServer, otlp_grpc_server
from tests.conftest import BASE_DIR
from tests.tracing.instrumented_agent import QUESTION
from tests.tracing.test_ingest_instrumented import ANSWERED, SCRIPT
from tracing.models import Span
from tracing.selectors import span_payloads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpGrpcServer]:
    server = otlp_grpc_server(host="127.0.0.1", port=0)
    yield server
    server.stop(grace=0)


@pytest.fixture(scope="module")
def model() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer(script=SCRIPT, model=ANSWERED) as running:
        yield running  # type: ignore[misc]


def test_openai_v2_log_events_over_grpc_become_the_chat_spans_messages(
    receiver: OtlpGrpcServer,
    model: ChatCompletionsServer,
    admin_user: Any,
    tenant: Any,
) -> None:
    secret = api_token_issue(tenant=tenant, user=admin_user).secret
    done = subprocess.run(
        [sys.executable, "-m", "tests.runs.grpc_instrumented_agent",
         model.base_url, f"127.0.0.1:{receiver.port}", secret],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trace_id = done.stdout.strip().splitlines()[-1]
    run = Run.objects.get(tenant=tenant, trace_id=trace_id)
    assert run.agent.slug == "external-grpc-support"
    chats = [
        span
        for span in Span.objects.filter(run=run).order_by("started_at")
        if span.attributes.get("gen_ai.operation.name") == "chat"
    ]
    assert len(chats) == 2
    first, second = (
        {k: json.loads(v) for k, v in span_payloads(tenant=tenant, span=s).items()}
        for s in chats
    )
    # The first call: the question in, a tool call out.
    assert first["gen_ai.input.messages"] == [{"role": "user", "content": QUESTION}]
    [call] = first["gen_ai.output.messages"][0]["tool_calls"]
    assert call["id"] == "call_7" and call["function"]["name"] == "lookup_order"
    assert first["gen_ai.output.messages"][0]["finish_reason"] == "tool_calls"
    # The second: the conversation so far in, the answer out.
    roles = [message["role"] for message in second["gen_ai.input.messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert second["gen_ai.input.messages"][2]["tool_call_id"] == "call_7"
    assert second["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "content": "Order 4821 has shipped and arrives tomorrow.",
            "finish_reason": "stop",
            "index": 0,
        }
    ]
    for chat in chats:
        assert chat.attributes["cp.ingest.payloads_from_logs"] == [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
        ]
        assert chat.attributes["gen_ai.response.finish_reasons"]
