"""A plain-Python support agent that runs in its own process and uses the control
plane for what it does best: its trace goes over OTLP to the control plane (one
external run), its model call's spend is reserved against the tenant's budget
first, and its risky tool (a refund) runs only once a person approved it in
the browser, with the arguments they approved.

    pip install -e 'clients/python[examples]'
    CONTROLPLANE_URL=http://127.0.0.1:8000 CONTROLPLANE_TOKEN=cp_... \\
        python clients/python/examples/refund_agent.py --order A-1001 --amount 80

The token is an operator's API token (Settings > API tokens); it is read from
the environment, never from the command line (where `ps` would show it). Open
the approvals inbox (or the run page) and click Approve: the agent goes on and
prints what it did. Deny, or let the approval expire, and it prints that the
refund was refused and exits 3.
"""

from __future__ import annotations

import argparse
import os
import sys
from decimal import Decimal

from controlplane_client import (
    BudgetExhausted,
    ControlPlaneClient,
    GateDenied,
    current_trace_ids,
    gated,
)
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

AGENT = "refund-agent"
# What the agent's order lookup finds: order id -> amount paid.
ORDERS_PAID = {"A-1001": Decimal("120.00")}


def telemetry(base_url: str, token: str) -> TracerProvider:
    """Spans to the control plane's OTLP/HTTP endpoint, with the API token."""
    provider = TracerProvider(resource=Resource.create({"service.name": AGENT}))
    exporter = OTLPSpanExporter(
        endpoint=f"{base_url}/v1/traces",
        headers={"Authorization": f"Bearer {token}"},
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", default="A-1001")
    parser.add_argument("--amount", default="80")
    parser.add_argument(
        "--approval-timeout",
        type=float,
        default=None,
        help="seconds to wait for a decision (default: until the gate expires)",
    )
    options = parser.parse_args()
    base_url = os.environ.get("CONTROLPLANE_URL", "http://127.0.0.1:8000").rstrip("/")
    token = os.environ["CONTROLPLANE_TOKEN"]

    provider = telemetry(base_url, token)
    tracer = trace.get_tracer(AGENT)
    client = ControlPlaneClient(base_url, token)

    # The risky tool: gated. It runs with the approved arguments (an approver
    # may have edited the amount), and not at all when denied.
    @gated(client, tool="issue_refund", effect="irreversible_external",
           agent=AGENT, timeout=options.approval_timeout,
           input_schema={
               "type": "object",
               "properties": {"order_id": {"type": "string"},
                              "amount": {"type": "string"}},
               "required": ["order_id", "amount"],
               "additionalProperties": False,
           })  # fmt: skip
    def issue_refund(order_id: str, amount: str) -> str:
        return f"refunded {Decimal(amount):.2f} on {order_id}"

    status = 0
    with tracer.start_as_current_span(f"support ticket for order {options.order}"):
        ids = current_trace_ids()
        assert ids is not None
        trace_id = ids[0]
        print(f"trace {trace_id}", flush=True)

        with tracer.start_as_current_span("execute_tool lookup_order") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "lookup_order")
            paid = ORDERS_PAID.get(options.order)
            if paid is None:
                print(f"no order {options.order}", flush=True)
                return 2

        # The plan costs a model call: reserve its worst case, settle the use.
        try:
            held = client.reserve(
                trace_id=trace_id, agent=AGENT, kind="model_call",
                amounts={"output_tokens": 400, "cost": Decimal("0.02")},
            )  # fmt: skip
        except BudgetExhausted as refused:
            print(f"over budget: {refused.dimension}", flush=True)
            return 4
        with tracer.start_as_current_span("plan refund"):
            amount = min(Decimal(options.amount), paid)
        client.settle(held, {"input_tokens": 180, "output_tokens": 60,
                             "cost": Decimal("0.0114")})  # fmt: skip
        print(f"reserved and settled {held.id}", flush=True)

        with tracer.start_as_current_span("execute_tool issue_refund") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "issue_refund")
            print("waiting for approval of issue_refund", flush=True)
            try:
                print(issue_refund(order_id=options.order, amount=str(amount)),
                      flush=True)  # fmt: skip
            except GateDenied as denied:
                print(f"refund refused: {denied}", flush=True)
                span.set_status(trace.StatusCode.ERROR, str(denied))
                status = 3
    client.close()
    provider.shutdown()  # flushes the batch: every span reaches the control plane
    return status


if __name__ == "__main__":
    sys.exit(main())
