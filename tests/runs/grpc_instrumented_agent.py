"""The agent of tests/tracing/instrumented_agent.py instrumented by
opentelemetry-instrumentation-openai-v2 in its default mode (message content as
log events, not on the span), both signals sent by the official OTLP/gRPC
exporters. Its own process: the library patches the SDK process-wide and reads
its settings from the environment.

    python -m tests.runs.grpc_instrumented_agent MODEL_BASE_URL GRPC_ENDPOINT TOKEN
"""

from __future__ import annotations

import os
import sys

import openai
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.tracing.instrumented_agent import run_agent


def main() -> None:
    model_url, endpoint, token = sys.argv[1:4]
    headers = (("authorization", f"Bearer {token}"),)
    resource = Resource.create({"service.name": "grpc-support"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True, headers=headers)
        )
    )
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(
            OTLPLogExporter(endpoint=endpoint, insecure=True, headers=headers)
        )
    )
    # The default mode: content captured, sent as gen_ai.*.message and
    # gen_ai.choice log records of the chat span.
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
    os.environ.pop("OTEL_SEMCONV_STABILITY_OPT_IN", None)
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(
        tracer_provider=tracer_provider, logger_provider=logger_provider
    )
    client = openai.OpenAI(base_url=model_url, api_key="sk-not-a-real-key")
    trace_id = run_agent(
        "openai-v2", client, tracer_provider.get_tracer("support"), False
    )
    # Logs first: their spans then arrive after them, the harder order.
    logger_provider.shutdown()
    tracer_provider.shutdown()
    print(f"{trace_id:032x}")


if __name__ == "__main__":
    main()
