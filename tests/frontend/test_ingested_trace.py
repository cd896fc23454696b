"""An agent instrumented elsewhere sends its trace through the real OTLP/HTTP
exporter to the live server; its run page shows the whole tree, down to the
leaves, and a later batch of the same trace joins it live."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from playwright.sync_api import expect

from controlplane.services import api_token_issue
from runs.models import Run
from tests.conftest import wait_for
from tracing.models import Span

pytestmark = [pytest.mark.browser]

LEAVES = ["chat 1", "lookup_order", "chat 2", "bank transfer"]


def exporter_provider(url: str, secret: str) -> TracerProvider:
    """The real exporter, batching: a trace goes out in one request, in the
    order its spans ended (leaves first); the server stores it root first."""
    provider = TracerProvider(resource=Resource.create({"service.name": "helpdesk"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(
                endpoint=f"{url}/v1/traces",
                headers={"Authorization": f"Bearer {secret}"},
            ),
            schedule_delay_millis=60_000,  # one export, at shutdown
        )
    )
    return provider


def send_nested_trace(url: str, secret: str) -> tuple[int, int]:
    """Eight spans, four levels: root > step > (chat, tool > call). Returns the
    trace id and the id of "step 2" (a later batch adds under it)."""
    provider = exporter_provider(url, secret)
    tracer = provider.get_tracer("elsewhere")
    with tracer.start_as_current_span(
        "agent run", attributes={"openinference.span.kind": "AGENT"}
    ) as root:
        with tracer.start_as_current_span("step 1"):
            with tracer.start_as_current_span(
                "chat 1", attributes={"openinference.span.kind": "LLM"}
            ):
                pass
            with tracer.start_as_current_span(
                "lookup_order", attributes={"openinference.span.kind": "TOOL"}
            ):
                pass
        with tracer.start_as_current_span("step 2") as step2:
            with tracer.start_as_current_span(
                "chat 2", attributes={"openinference.span.kind": "LLM"}
            ):
                pass
            with (
                tracer.start_as_current_span(
                    "refund", attributes={"openinference.span.kind": "TOOL"}
                ),
                tracer.start_as_current_span("bank transfer"),
            ):
                pass
    provider.shutdown()  # flushes the batch: one POST /v1/traces
    context = root.get_span_context()
    return context.trace_id, step2.get_span_context().span_id


def send_later_batch(url: str, secret: str, trace_id: int, parent_id: int) -> None:
    """Two more spans of the same trace, under "step 2", in a second request."""
    provider = exporter_provider(url, secret)
    parent = NonRecordingSpan(
        SpanContext(trace_id, parent_id, is_remote=True, trace_flags=TraceFlags(1))
    )
    tracer = provider.get_tracer("elsewhere")
    with (
        tracer.start_as_current_span(
            "notify customer", context=trace.set_span_in_context(parent)
        ),
        tracer.start_as_current_span("send email"),
    ):
        pass
    provider.shutdown()


def expand_everything(page: Any) -> None:
    """Open every collapsed row, as a person clicking the toggles would."""
    for _ in range(50):
        closed = page.locator('#tree [role="treeitem"][aria-expanded="false"]')
        if closed.count() == 0:
            return
        closed.first.locator('[data-action="toggle"]').click()
        page.wait_for_timeout(100)
    raise AssertionError("rows kept appearing collapsed")


def test_an_otlp_ingested_trace_expands_to_its_leaves_and_grows_live(
    daphne: Any, open_page: Any, admin_user: Any, tenant: Any
) -> None:
    secret = api_token_issue(tenant=tenant, user=admin_user).secret
    trace_id, step2 = send_nested_trace(daphne.url, secret)
    run = Run.objects.get(tenant=tenant, trace_id=f"{trace_id:032x}")
    assert Span.objects.filter(run=run).count() == 8

    page = open_page(admin_user, f"/runs/{run.id}/")
    expect(page.locator("#tree-count")).to_contain_text("8 spans loaded")
    tree = page.locator("#tree")
    root = tree.locator('[role="treeitem"][aria-level="1"]')
    expect(root).to_have_count(1)
    # Closed, then opened again level by level down to the leaves.
    root.locator('[data-action="toggle"]').click()
    expect(tree.locator('[role="treeitem"]')).to_have_count(1)
    expand_everything(page)
    expect(tree.locator('[role="treeitem"]')).to_have_count(8)
    for name in LEAVES:
        row = tree.locator('[role="treeitem"]', has_text=name)
        expect(row).to_be_visible()
        expect(row).not_to_have_attribute("aria-expanded", "true")
        expect(row).not_to_have_attribute("aria-expanded", "false")
    expect(
        tree.locator('[role="treeitem"][aria-level="4"]', has_text="bank transfer")
    ).to_be_visible()

    # A second request of the same trace, while the page is open.
    send_later_batch(daphne.url, secret, trace_id, step2)
    wait_for(lambda: Span.objects.filter(run=run).count() == 10, what="2 more spans")
    expect(page.locator("#tree-count")).to_contain_text("10 spans loaded")
    expand_everything(page)
    leaf = tree.locator('[role="treeitem"][aria-level="4"]', has_text="send email")
    expect(leaf).to_be_visible()
    expect(
        tree.locator('[role="treeitem"][aria-level="3"]', has_text="notify customer")
    ).to_be_visible()
