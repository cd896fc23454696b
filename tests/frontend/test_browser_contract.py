"""A tool's repeated error asks a person in the inbox (docs/engine.md, "Contract
enforcement"): the question, the error, what each answer does; approving it lets
the run go on."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, ToolFailure
from runs.engine.tools import Tool, ToolContext
from runs.models import Run
from runs.services import run_start
from runs.tools.registry import BUILTIN_TOOLS
from tests.agents import make_agent
from tests.runs.conftest import drive

pytestmark = [pytest.mark.browser]


def closed_ledger(args: dict[str, Any], ctx: ToolContext) -> Any:
    raise ToolFailure(
        ErrorCode.EPERM,
        "the ledger is closed for the night",
        retryable=False,
        suggested_action="stop_and_request_human",
    )


def test_the_inbox_asks_whether_a_run_may_go_on_after_a_repeated_error(
    tenant: Any, operator_user: Any, open_page: Any, monkeypatch: Any
) -> None:
    contract = ToolContract(
        name="ledger",
        description="Post to the ledger.",
        input_schema={"type": "object", "properties": {}},
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    )
    monkeypatch.setitem(BUILTIN_TOOLS, "ledger", Tool(contract, closed_ledger))
    post = {"tool_calls": [{"name": "ledger", "arguments": {}}]}
    make_agent(
        tenant, "poster", name="Poster", tools=["ledger"],
        script=[post, post, {"text": "ok"}],
    )  # fmt: skip
    run = run_start(
        tenant=tenant, agent_slug="poster", input="post it", started_by=operator_user
    )
    run = drive(run)
    assert run.status == Run.Status.WAITING_APPROVAL

    page = open_page(operator_user, "/approvals/")
    item = page.locator("#inbox li")
    expect(item).to_have_count(1)
    expect(item).to_have_attribute("data-kind", "tool_error")
    expect(item.locator("code.tool")).to_have_text("ledger failed repeatedly: go on?")
    expect(item.locator(".rule")).to_contain_text("failed 2 times in a row with EPERM")
    expect(item.locator("pre.args")).to_contain_text("the ledger is closed")
    expect(item.locator("pre.args")).to_contain_text(
        "deny: the run ends repeated_error"
    )
    item.get_by_role("button", name="Approve ledger failed repeatedly: go on?").click()
    expect(item).to_have_count(0)
    assert ApprovalRequest.objects.get(run=run).status == "approved"
    run = drive(run)
    assert (run.status, run.stop_reason) == ("unverified", "done")
