"""A message to the agent from the run page, in real Chromium against Daphne,
Redis and a Celery worker: sent while the run waits for an approval, it stays
queued (live) until the approved call's result, then is delivered and the
model's reply quotes it (issue 28 item 3, scenario 10)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from runs.models import Run, RunMessage
from runs.services import run_start
from tests.agents import make_agent
from tests.conftest import wait_for
from tests.frontend.test_browser import shop

__all__ = ["shop"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

GIFT = "Please add gift wrap to the replacement"
REPLY = "Replacement on its way, gift wrap added as you asked."
SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "create_replacement",
                     "arguments": {"order_id": "4821", "reason": "dented spout"}}]},
    {"text": "Replacement on its way.", "if_message": {"gift wrap": {"text": REPLY}}},
]  # fmt: skip


def test_operator_sends_a_message_to_a_waiting_run_and_reads_the_reply(
    shop: Any, operator_user: Any, viewer_user: Any, open_page: Any, ui_worker: Any
) -> None:
    make_agent(shop, "steered", tools=["create_replacement"], script=SCRIPT)
    run = run_start(tenant=shop, agent_slug="steered", input="My kettle is dented",
                    started_by=operator_user)  # fmt: skip
    wait_for(lambda: Run.objects.get(id=run.id).status == "waiting_approval")
    page = open_page(operator_user, f"/runs/{run.id}/")
    tree = page.get_by_role("tree")
    approve = tree.get_by_role("button", name="Approve create_replacement")
    expect(approve).to_be_visible()

    page.get_by_label("Message to the agent").fill(GIFT)
    page.get_by_role("button", name="Send", exact=True).click()

    messages = page.get_by_test_id("run-message")
    expect(messages).to_have_count(1)
    expect(messages.first).to_contain_text(GIFT)
    expect(messages.first).to_contain_text(operator_user.username)
    expect(messages.first.get_by_test_id("run-message-state")).to_contain_text("queued")
    assert RunMessage.objects.get(run=run).state == "queued"

    approve.click()

    # Live: delivered before the model call after the tool's result (step 2).
    expect(messages.first.get_by_test_id("run-message-state")).to_have_text(
        "delivered before step 2", timeout=30_000
    )
    expect(page.locator("#run-facts")).to_contain_text(REPLY, timeout=30_000)
    assert RunMessage.objects.get(run=run).state == "delivered"

    # A viewer reads the messages but has no box to send one.
    viewer = open_page(viewer_user, f"/runs/{run.id}/")
    expect(viewer.get_by_test_id("run-message")).to_have_count(1)
    expect(viewer.get_by_test_id("run-message").first).to_contain_text(GIFT)
    expect(viewer.get_by_label("Message to the agent")).to_have_count(0)
