"""What a member reads in the browser carries no secret of a tool call."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from runs.models import Run
from runs.services import run_start
from tests.runs.conftest import drive, scripted_agent
from tests.tracing.test_secrets_never_shown import ARGS, SECRETS, partner_api

pytestmark = [pytest.mark.browser]

__all__ = ["partner_api", "scripted_agent"]


def test_the_run_page_and_the_inbox_show_a_waiting_calls_arguments_redacted(
    scripted_agent: Any,
    partner_api: list[dict[str, Any]],
    tenant: Any,
    operator_user: Any,  # someone who may approve: the call waits
    viewer_user: Any,
    open_page: Any,
) -> None:
    call = {"id": "c1", "name": "call_partner_api", "arguments": ARGS}
    scripted_agent(
        [{"text": "", "tool_calls": [call]}, {"text": "Sent."}], ["call_partner_api"]
    )
    run = drive(
        run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
    )
    assert run.status == Run.Status.WAITING_APPROVAL, run.stop_detail
    page = open_page(viewer_user, f"/runs/{run.id}/")
    card = page.locator("#approval-banner .approval-card pre.args")
    expect(card).to_contain_text('"password": "[REDACTED]"')
    expect(card).to_contain_text('"region": "eu-west-1"')
    expect(card).to_contain_text('"Authorization": "[REDACTED]"')
    for item in page.get_by_role("treeitem").all():
        item.click()  # each span's detail panel, payloads included
    page.wait_for_load_state("networkidle")
    shown = page.content() + page.locator("body").inner_text()
    for secret in SECRETS:
        assert secret not in shown, secret
    page.goto("/approvals/")
    expect(page.locator("#inbox li")).to_have_count(1)
    expect(page.locator("#inbox li pre.args")).to_contain_text("[REDACTED]")
    inbox = page.content()
    for secret in SECRETS:
        assert secret not in inbox, secret
