"""A run runs with the agent version it pinned at its start; the version's
per-tool approval overrides apply through a real run."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest
from approvals.rules import approval_rule_create
from runs.models import Run, ToolCall
from runs.services import RunInputError, run_start
from runs.services.agents import agent_delete, agent_set_disabled, agent_update
from runs.tools.registry import BUILTIN_TOOLS
from shop.models import Replacement
from tests.agents import make_agent
from tests.runs.conftest import drive

REPLACE = {"order_id": "4821", "reason": "arrived with a dented spout"}
SHOP_TOOLS = ["lookup_order", "get_delivery_date", "create_replacement", "refund"]


def _calls(*calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"id": f"call_{n}", "name": name, "arguments": args}]}
        for n, (name, args) in enumerate(calls)
    ] + [{"text": "Done."}]


def test_a_run_keeps_the_version_it_started_with_after_the_agent_is_edited(shop):
    agent = make_agent(
        shop, "versioned", script=[{"text": "answer of v1"}], system_prompt="v1"
    )
    first = run_start(tenant=shop, agent_slug="versioned", input="x", started_by=None)
    agent_update(
        agent=agent,
        actor=None,
        config={"script": [{"text": "answer of v2"}], "system_prompt": "v2"},
        partial=True,
    )
    second = run_start(tenant=shop, agent_slug="versioned", input="x", started_by=None)
    # The first run takes its first step only now, after the edit.
    first, second = drive(first), drive(second)
    assert (first.agent_version.number, first.final_answer) == (1, "answer of v1")
    assert (second.agent_version.number, second.final_answer) == (2, "answer of v2")
    assert first.engine_state["messages"][0]["content"] == "v1"
    assert second.engine_state["messages"][0]["content"] == "v2"


def test_an_edit_that_changes_nothing_makes_no_version(shop):
    agent = make_agent(shop, "same", script=[{"text": "hi"}])
    assert (
        agent_update(
            agent=agent, actor=None, config={"model": "scripted"}, partial=True
        )
        is None
    )
    assert agent.versions.count() == 1


def test_a_disabled_or_deleted_agent_starts_no_run(shop):
    agent = make_agent(shop, "paused", script=[{"text": "hi"}])
    agent_set_disabled(agent=agent, actor=None, disabled=True)
    with pytest.raises(RunInputError, match="disabled") as refused:
        run_start(tenant=shop, agent_slug="paused", input="x", started_by=None)
    assert refused.value.field == "agent"
    agent_set_disabled(agent=agent, actor=None, disabled=False)
    kept = run_start(tenant=shop, agent_slug="paused", input="x", started_by=None)
    agent_delete(agent=agent, actor=None)
    with pytest.raises(RunInputError, match="no agent"):
        run_start(tenant=shop, agent_slug="paused", input="x", started_by=None)
    # Its run goes on with the version it pinned.
    assert drive(kept).final_answer == "hi"
    assert Run.objects.count() == 1


def test_approval_always_makes_a_read_only_tool_wait_for_a_human(shop, operator_user):
    make_agent(
        shop, "careful", tools=SHOP_TOOLS,
        script=_calls(("lookup_order", {"order_id": "4821"})),
        tool_settings={"lookup_order": {"approval": "always"}},
    )  # fmt: skip
    run = drive(
        run_start(tenant=shop, agent_slug="careful", input="x", started_by=None)
    )
    assert run.status == Run.Status.WAITING_APPROVAL
    approval = ApprovalRequest.objects.get(run=run)
    assert approval.tool_name == "lookup_order"
    assert "set to always need approval" in approval.rule_reason
    call = ToolCall.objects.get(run=run)
    assert (call.tool_name, call.status, call.result) == (
        "lookup_order",
        "waiting_approval",
        None,
    )


def test_approval_never_runs_a_side_effect_without_asking(shop, operator_user):
    make_agent(
        shop, "trusted", tools=SHOP_TOOLS,
        script=_calls(("create_replacement", REPLACE)),
        tool_settings={"create_replacement": {"approval": "never"}},
    )  # fmt: skip
    run = drive(
        run_start(tenant=shop, agent_slug="trusted", input="x", started_by=None)
    )
    assert run.status != Run.Status.WAITING_APPROVAL, run.stop_detail
    assert not ApprovalRequest.objects.filter(run=run).exists()
    assert ToolCall.objects.get(run=run).status == "succeeded"
    assert Replacement.objects.filter(order__tenant=shop).count() == 1


def test_approval_never_does_not_override_a_tenant_deny_rule(
    shop, operator_user, admin_user
):
    approval_rule_create(
        tenant=shop,
        actor=admin_user,
        data={
            "name": "No replacements",
            "tool": "create_replacement",
            "action": "deny",
        },
        known_tools={n: t.contract for n, t in BUILTIN_TOOLS.items()},
    )
    make_agent(
        shop, "trusted", tools=SHOP_TOOLS,
        script=_calls(("create_replacement", REPLACE)),
        tool_settings={"create_replacement": {"approval": "never"}},
    )  # fmt: skip
    run = drive(
        run_start(tenant=shop, agent_slug="trusted", input="x", started_by=None)
    )
    assert ToolCall.objects.get(run=run).status == "denied"
    assert not Replacement.objects.filter(order__tenant=shop).exists()


def test_without_an_override_the_tenant_policy_decides(shop, operator_user):
    make_agent(
        shop, "plain", tools=SHOP_TOOLS,
        script=_calls(("create_replacement", REPLACE)),
        tool_settings={"create_replacement": {"approval": "policy"}},
    )  # fmt: skip
    run = drive(run_start(tenant=shop, agent_slug="plain", input="x", started_by=None))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert ApprovalRequest.objects.get(run=run).rule == "default.side_effect"
