"""An external agent's gated call in the browser: it waits in the approvals inbox
and on its external run's trace, under the agent's own span, and an Approve
click finalises the gate as approved by the person who clicked."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.services import api_token_issue
from runs.models import ExternalGate

pytestmark = [pytest.mark.browser]

TRACE = "7d3c1a2b9e8f40a1b2c3d4e5f6a7b8c9"
ROOT_SPAN = "a1b2c3d4e5f60718"


def post(url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.loads(reply.read() or b"{}")
        return answer


def get(url: str, token: str) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


def test_an_external_call_is_approved_from_the_inbox_and_shown_on_its_trace(
    daphne: Any, open_page: Any, tenant: Any, operator_user: Any, admin_user: Any
) -> None:
    token = api_token_issue(tenant=tenant, user=operator_user).secret
    # The agent's own span arrives over OTLP first; the gate names it.
    post(
        f"{daphne.url}/v1/traces",
        token,
        {"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name",
                                         "value": {"stringValue": "payments-bot"}}]},
            "scopeSpans": [{"spans": [{
                "traceId": TRACE, "spanId": ROOT_SPAN, "name": "pay supplier",
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000001000000000"}]}]}]},
    )  # fmt: skip
    gate = post(
        f"{daphne.url}/api/v1/gates/",
        token,
        {
            "tool": "wire_transfer",
            "arguments": {"account": "DE89 3704", "amount": 120},
            "trace_id": TRACE,
            "span_id": ROOT_SPAN,
            "agent": "payments-bot",
        },
    )
    assert gate["status"] == "pending"

    page = open_page(admin_user, f"/runs/{gate['run_id']}/")
    banner = page.locator("#approval-banner")
    expect(banner).to_contain_text("Waiting for approval: wire_transfer")
    expect(banner).to_contain_text('"amount": 120')
    tree = page.locator("#tree")
    expect(tree.locator('[role="treeitem"]', has_text="pay supplier")).to_be_visible()
    expect(
        tree.locator(
            '[role="treeitem"][aria-level="2"]', has_text="approval wire_transfer"
        )
    ).to_be_visible()

    page.goto("/approvals/")
    item = page.locator(f'[data-approval="{gate["approval_id"]}"]')
    expect(item).to_contain_text("wire_transfer")
    expect(item).to_contain_text("wire_transfer has effect write and needs approval")
    expect(item).to_contain_text("DE89 3704")
    item.get_by_role("button", name="Approve wire_transfer").click()
    expect(page.locator("#inbox-error")).to_have_text("Approved wire_transfer.")
    expect(page.locator("#inbox-empty")).to_be_visible()

    final = get(f"{daphne.url}/api/v1/gates/{gate['id']}/", token)
    assert (final["status"], final["final"], final["decided_by"]) == (
        "approved",
        True,
        "alice-admin",
    )
    assert ExternalGate.objects.get(id=gate["id"]).status == "approved"
    # The trace shows who decided.
    page.goto(f"/runs/{gate['run_id']}/")
    expect(page.locator("#approval-banner")).to_be_hidden()
    row = page.locator('#tree [role="treeitem"]', has_text="approval wire_transfer")
    row.click()
    expect(page.locator("#detail")).to_contain_text("alice-admin")
