"""What an ingested span says, in our words: OpenInference's models (the one asked
for and the one that answered), finish reasons and messages; and what it adds to
its external run (a step, a tool call, tokens, cost), counted once however often
the span is sent and moved back when a later version says less."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from budgets.models import ModelPriceEntry
from controlplane.services import api_token_issue
from runs.models import Run
from tests.tracing.test_ingest import post
from tracing.ingest import map_attributes
from tracing.models import Span
from tracing.selectors import span_payloads

TRACE = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def secret(admin_user: Any, tenant: Any) -> str:
    return api_token_issue(tenant=tenant, user=admin_user).secret


def value(item: Any) -> dict[str, Any]:
    if isinstance(item, bool):
        return {"boolValue": item}
    if isinstance(item, int):
        return {"intValue": str(item)}
    if isinstance(item, float):
        return {"doubleValue": item}
    return {"stringValue": item}


def span(number: int, attributes: dict[str, Any], parent: int = 1) -> dict[str, Any]:
    return {
        "traceId": TRACE,
        "spanId": f"{number:016x}",
        "parentSpanId": "" if number == 1 else f"{parent:016x}",
        "name": f"span {number}",
        "startTimeUnixNano": str(1_700_000_000_000_000_000 + number),
        "endTimeUnixNano": str(1_700_000_001_000_000_000 + number),
        "attributes": [{"key": k, "value": value(v)} for k, v in attributes.items()],
    }


def send(secret: str, *spans: dict[str, Any]) -> None:
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "service.name", "value": {"stringValue": "bot"}}
                    ]
                },
                "scopeSpans": [{"spans": list(spans)}],
            }
        ]
    }
    response = post(Client(), json.dumps(body).encode(), secret=secret)
    assert response.status_code == 200, response.content


OI_LLM = {
    "openinference.span.kind": "LLM",
    "llm.model_name": "gpt-4o-mini-2024-07-18",
    "llm.invocation_parameters": json.dumps({"model": "gpt-4o-mini"}),
    "llm.system": "openai",
    "llm.token_count.prompt": 1000,
    "llm.token_count.completion": 500,
    "llm.finish_reason": "stop",
    "llm.input_messages.0.message.role": "system",
    "llm.input_messages.0.message.content": "Be brief.",
    "llm.input_messages.1.message.role": "tool",
    "llm.input_messages.1.message.tool_call_id": "call_1",
    "llm.input_messages.1.message.content": '{"status": "shipped"}',
    "llm.output_messages.0.message.role": "assistant",
    "llm.output_messages.0.message.content": "It shipped.",
    "llm.tools.0.tool.json_schema": json.dumps({"type": "function"}),
    "input.value": '{"model": "gpt-4o-mini", "messages": []}',
    "output.value": '{"choices": []}',
}


def test_openinference_names_the_model_that_answered_apart_from_the_one_asked() -> None:
    mapped = map_attributes(OI_LLM)
    assert mapped["gen_ai.request.model"] == "gpt-4o-mini"
    assert mapped["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
    assert mapped["gen_ai.response.finish_reasons"] == ["stop"]
    assert mapped["gen_ai.operation.name"] == "chat"
    assert mapped["gen_ai.input.messages"] == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {
            "role": "tool",
            "parts": [
                {
                    "type": "tool_call_response",
                    "id": "call_1",
                    "response": '{"status": "shipped"}',
                }
            ],
        },
    ]
    assert mapped["gen_ai.output.messages"] == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "It shipped."}],
            "finish_reason": "stop",
        }
    ]
    assert mapped["gen_ai.tool.definitions"] == [{"type": "function"}]
    # The flattened sources are folded, not kept beside the payloads.
    assert not [k for k in mapped if k.startswith(("llm.input_messages", "llm.tools"))]
    assert "input.value" not in mapped and "output.value" not in mapped


def test_a_model_call_that_never_answered_names_only_the_model_asked() -> None:
    mapped = map_attributes(
        {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini"}
    )
    assert mapped["gen_ai.request.model"] == "gpt-4o-mini"
    assert "gen_ai.response.model" not in mapped


def test_explicit_request_and_response_model_names_win() -> None:
    mapped = map_attributes(
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "router",
            "llm.request.model_name": "gpt-4o",
            "llm.response.model_name": "gpt-4o-mini",
            "output.value": json.dumps({"choices": [{"finish_reason": "length"}]}),
        }
    )
    assert mapped["gen_ai.request.model"] == "gpt-4o"
    assert mapped["gen_ai.response.model"] == "gpt-4o-mini"
    # An instrumentation without llm.finish_reason: the raw response's choices.
    assert mapped["gen_ai.response.finish_reasons"] == ["length"]


def test_genai_finish_reasons_come_from_the_output_messages_when_not_named() -> None:
    output = [{"role": "assistant", "parts": [], "finish_reason": "tool_calls"}]
    mapped = map_attributes(
        {"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(output)}
    )
    assert mapped["gen_ai.response.finish_reasons"] == ["tool_calls"]
    named = map_attributes(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.response.finish_reasons": ["stop"],
            "gen_ai.output.messages": json.dumps(output),
        }
    )
    assert named["gen_ai.response.finish_reasons"] == ["stop"]


def test_llm_and_tool_spans_count_as_steps_and_tool_calls_with_tokens_and_cost(
    secret: str, tenant: Any
) -> None:
    ModelPriceEntry.objects.create(
        tenant=tenant,
        model="gpt-4o-mini-2024-07-18",
        input_per_million=Decimal("2"),
        cached_input_per_million=Decimal("1"),
        output_per_million=Decimal("8"),
    )
    tool = {"openinference.span.kind": "TOOL", "tool.name": "lookup_order"}
    priced = {**OI_LLM, "llm.cost.total": 0.25}  # the sender priced this one
    send(
        secret,
        span(1, {"openinference.span.kind": "AGENT"}),
        span(2, OI_LLM),
        span(3, tool),
    )
    run = Run.objects.get(tenant=tenant, trace_id=TRACE)
    # Priced by the tenant's row for the model that answered: 1000×2 + 500×8 per 1M.
    assert (run.steps, run.tool_calls) == (1, 1)
    assert (run.input_tokens, run.output_tokens) == (1000, 500)
    assert run.cost == Decimal("0.006")

    # A later batch of the same trace adds to it; the spans sent again do not.
    send(secret, span(2, OI_LLM), span(3, tool), span(4, priced), span(5, tool))
    run.refresh_from_db()
    assert (run.steps, run.tool_calls) == (2, 2)
    assert (run.input_tokens, run.output_tokens) == (2000, 1000)
    assert run.cost == Decimal("0.256")
    assert Span.objects.filter(run=run).count() == 5

    # A span's later version that says less moves the counts back.
    smaller = {**OI_LLM, "llm.token_count.prompt": 100, "llm.token_count.completion": 0}
    send(secret, span(2, smaller), span(5, {"openinference.span.kind": "CHAIN"}))
    run.refresh_from_db()
    assert (run.steps, run.tool_calls) == (2, 1)
    assert (run.input_tokens, run.output_tokens) == (1100, 500)
    assert run.cost == Decimal("0.2502")


def test_an_openinference_span_is_stored_with_its_messages_as_payloads(
    secret: str, tenant: Any
) -> None:
    send(secret, span(1, {"openinference.span.kind": "AGENT"}), span(2, OI_LLM))
    stored = Span.objects.get(run__tenant=tenant, span_id=f"{2:016x}")
    assert stored.attributes["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
    assert stored.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert "llm.output_messages.0.message.content" not in stored.attributes
    bodies = span_payloads(tenant=tenant, span=stored)
    assert json.loads(bodies["gen_ai.output.messages"])[0]["parts"] == [
        {"type": "text", "content": "It shipped."}
    ]
