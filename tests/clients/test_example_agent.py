"""The client package's example end to end: clients/python/examples/refund_agent.py
runs as its own process against a real Daphne, sends its trace over OTLP/HTTP,
reserves and settles its model call's spend, and its gated refund waits until a
person clicks Approve in Chromium; then it runs, and the run page shows the
agent's spans with the approval among them."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from budgets.models import Budget, BudgetLedgerEntry
from controlplane.services import api_token_issue
from runs.models import ExternalGate, Run
from tests.conftest import BASE_DIR, wait_for
from tracing.models import Span

pytestmark = [pytest.mark.browser]

EXAMPLE = Path(BASE_DIR) / "clients" / "python" / "examples" / "refund_agent.py"


def test_the_example_agents_refund_runs_once_approved_in_the_browser(
    daphne: Any, open_page: Any, tenant: Any, operator_user: Any, admin_user: Any
) -> None:
    Budget.objects.create(tenant=tenant, period_limits={"day": {"cost": "5"}})
    token = api_token_issue(tenant=tenant, user=operator_user).secret
    environ = {
        **os.environ,
        "CONTROLPLANE_URL": daphne.url,
        "CONTROLPLANE_TOKEN": token,
        "PYTHONUNBUFFERED": "1",
    }
    agent = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--order", "A-1001", "--amount", "80"],
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        gate = wait_for(
            lambda: ExternalGate.objects.filter(tenant=tenant).first(),
            timeout=60,
            what="the agent's gate",
        )
        assert gate.status == "pending" and gate.tool == "issue_refund"
        assert agent.poll() is None  # the refund waits for a person

        page = open_page(admin_user, "/approvals/")
        item = page.locator(f'[data-approval="{gate.approval_id}"]')
        expect(item).to_contain_text("issue_refund")
        expect(item).to_contain_text("A-1001")
        item.get_by_role("button", name="Approve issue_refund").click()
        expect(page.locator("#inbox-error")).to_have_text("Approved issue_refund.")
        output, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, output
    assert "refunded 80.00 on A-1001" in output

    run = Run.objects.get(id=gate.run_id)
    assert run.stop_reason == "external"
    assert f"trace {run.trace_id}" in output
    # The model call's spend: reserved, then settled onto the run and the budget.
    [entry] = BudgetLedgerEntry.objects.filter(run_id=run.id)
    assert entry.status == "settled" and entry.actual is not None
    assert Decimal(entry.actual["cost"]) == Decimal("0.0114")
    assert run.cost == Decimal("0.0114")
    names = set(Span.objects.filter(run_id=run.id).values_list("name", flat=True))
    assert {
        "support ticket for order A-1001",
        "execute_tool lookup_order",
        "plan refund",
        "execute_tool issue_refund",
    } <= names

    page.goto(f"/runs/{run.id}/")
    tree = page.locator("#tree")
    for name in ("support ticket for order A-1001", "execute_tool issue_refund",
                 "approval issue_refund"):  # fmt: skip
        expect(tree.locator('[role="treeitem"]', has_text=name).first).to_be_visible()
