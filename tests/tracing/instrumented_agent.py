"""An agent of a team's own, instrumented as such agents are: the real OpenAI SDK
patched by an instrumentation library (`openinference` or `openai-v2`), its
spans sent by the official OTLP/HTTP exporter. Run in its own process (each
library patches the SDK process-wide and reads its settings from the
environment), it answers one question with one tool call and prints its trace
id.

    python -m tests.tracing.instrumented_agent LIBRARY MODEL_BASE_URL OTLP_URL TOKEN
        [--first-streams] [--resend]

`--first-streams`: the first model call streams, the second does not (else the
other way round). `--resend`: every export is sent twice, as an exporter that
retries after a lost answer does. `--logs` (openai-v2): its default mode, message
content sent as log events by the OTLP/HTTP log exporter to /v1/logs (without
it: the GenAI conventions' latest mode, content on the spans).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

import openai
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

MODEL = "gpt-4o-mini"
QUESTION = "Where is order 4821?"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "The status of an order.",
            "parameters": {
                "type": "object",
                "properties": {"order": {"type": "string"}},
                "required": ["order"],
            },
        },
    }
]


class TwiceExporter(SpanExporter):
    """Sends each batch twice: the second is what a retry after a lost answer is."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.inner.export(spans)
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()


def lookup_order(order: str) -> dict[str, Any]:
    return {"order": order, "status": "shipped", "eta": "tomorrow"}


def ask(client: openai.OpenAI, messages: list[Any], *, stream: bool) -> Any:
    """One model call; a streamed one put back together as the SDK's message."""
    if not stream:
        return (
            client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            .choices[0]
            .message
        )
    text, calls = "", dict[int, dict[str, str]]()
    for chunk in client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "args": ""})
                entry["id"] = call.id or entry["id"]
                if call.function:
                    entry["name"] += call.function.name or ""
                    entry["args"] += call.function.arguments or ""
    return openai.types.chat.ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
            or None,
        }
    )


def run_agent(
    library: str, client: openai.OpenAI, tracer: Any, first_streams: bool
) -> int:
    openinference = library == "openinference"
    root_attributes = (
        {"openinference.span.kind": "AGENT", "agent.name": "support",
         "input.value": QUESTION}
        if openinference
        else {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support",
              "gen_ai.input.messages": json.dumps(
                  [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}])}
    )  # fmt: skip
    with tracer.start_as_current_span(
        "support agent", attributes=root_attributes
    ) as root:
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        reply = ask(client, messages, stream=first_streams)
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls or []:
            arguments = call.function.arguments
            tool_attributes = (
                {"openinference.span.kind": "TOOL", "tool.name": call.function.name,
                 "input.value": arguments}
                if openinference
                else {"gen_ai.operation.name": "execute_tool",
                      "gen_ai.tool.name": call.function.name,
                      "gen_ai.tool.call.id": call.id,
                      "gen_ai.tool.call.arguments": arguments}
            )  # fmt: skip
            with tracer.start_as_current_span(
                f"execute_tool {call.function.name}", attributes=tool_attributes
            ) as tool_span:
                result = json.dumps(lookup_order(**json.loads(arguments)))
                tool_span.set_attribute(
                    "output.value" if openinference else "gen_ai.tool.call.result",
                    result,
                )
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": result}
            )
        answer = ask(client, messages, stream=not first_streams).content or ""
        if openinference:
            root.set_attribute("output.value", answer)
        else:
            root.set_attribute(
                "gen_ai.output.messages",
                json.dumps([{"role": "assistant", "parts": [
                    {"type": "text", "content": answer}], "finish_reason": "stop"}]),
            )  # fmt: skip
        trace_id: int = root.get_span_context().trace_id
        return trace_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("library", choices=["openinference", "openai-v2"])
    parser.add_argument("model_url")
    parser.add_argument("otlp_url")
    parser.add_argument("token")
    parser.add_argument("--first-streams", action="store_true")
    parser.add_argument("--resend", action="store_true")
    parser.add_argument("--logs", action="store_true")
    args = parser.parse_args()

    exporter: SpanExporter = OTLPSpanExporter(
        endpoint=f"{args.otlp_url}/v1/traces",
        headers={"Authorization": f"Bearer {args.token}"},
    )
    if args.resend:
        exporter = TwiceExporter(exporter)
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"{args.library}-support"})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    # Imported here: each library is the only one patching the SDK in its
    # process, and openai-v2 reads its settings from the environment set above.
    if args.library == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor
    elif args.logs:
        # Its default: content as log events (gen_ai.user.message, gen_ai.choice).
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    else:
        # The GenAI conventions' latest shape, message content on the spans.
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    logs = LoggerProvider(resource=provider.resource)
    logs.add_log_record_processor(
        BatchLogRecordProcessor(
            OTLPLogExporter(
                endpoint=f"{args.otlp_url}/v1/logs",
                headers={"Authorization": f"Bearer {args.token}"},
            )
        )
    )
    if args.library == "openinference":
        OpenAIInstrumentor().instrument(tracer_provider=provider)
    else:
        OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logs)
    client = openai.OpenAI(base_url=args.model_url, api_key="sk-not-a-real-key")
    trace_id = run_agent(
        args.library, client, provider.get_tracer("support"), args.first_streams
    )
    provider.shutdown()  # flushes: the trace goes out before the process ends
    logs.shutdown()  # then its log events (they may come before or after)
    print(f"{trace_id:032x}")


if __name__ == "__main__":
    main()
