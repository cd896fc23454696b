"""A tiny agent that runs outside, for the eval client's end-to-end test: it
reads the task on stdin, looks the order up (an `execute_tool` span with its
arguments), and prints its answer. Its spans join the trial's trace from
TRACEPARENT and go to the control plane over OTLP/HTTP with the API token.

EVAL_AGENT_MODE=skip_lookup makes it answer without looking the order up (the
regression a gate must catch); EVAL_AGENT_MODE=crash makes it exit 3."""

from __future__ import annotations

import json
import os
import re
import sys

from controlplane_client import trace_context_from_env
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

AGENT = "eval-test-agent"


def main() -> int:
    base_url = os.environ["CONTROLPLANE_URL"].rstrip("/")
    token = os.environ["CONTROLPLANE_TOKEN"]
    mode = os.environ.get("EVAL_AGENT_MODE", "")
    task = sys.stdin.read()
    if mode == "crash":
        print("the agent crashed on purpose", file=sys.stderr)
        return 3
    provider = TracerProvider(resource=Resource.create({"service.name": AGENT}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(
                endpoint=f"{base_url}/v1/traces",
                headers={"Authorization": f"Bearer {token}"},
            )
        )
    )
    tracer = provider.get_tracer(AGENT)
    found = re.search(r"#(\d+)", task)
    order = found.group(1) if found else "unknown"
    with tracer.start_as_current_span(
        "support ticket", context=trace_context_from_env()
    ):
        if mode != "skip_lookup":
            with tracer.start_as_current_span("execute_tool lookup_order") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", "lookup_order")
                span.set_attribute(
                    "gen_ai.tool.call.arguments", json.dumps({"order_id": order})
                )
            answer = f"Order {order} ships tomorrow."
        else:
            answer = "Sorry, I cannot tell."
    provider.shutdown()  # flushes every span before the trial is reported
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
