"""Sub-agents (agents as tools), through real Celery workers on the scripted
model: a parent's call of `agent__<slug>` starts a child run whose answer is the
parent's observation; the child's caps are carved from what the parent has
left; a call the tenant's policy puts to a person waits for the decision
(approved, the child starts; denied, expired or cancelled, nothing does);
cancelling the parent cancels the child; caps and cycles are refused with an
error observation (nothing started); the tree is one trace."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from approvals.models import ApprovalRequest
from approvals.rules import approval_rule_create
from budgets.models import ModelPriceEntry
from runs.engine.observation import TRUST_LABEL
from runs.models import AgentVersion, Run, SessionBranch, ToolCall
from runs.services import recover_stalled_runs, run_cancel, run_start
from runs.services.decide import approvals_expire
from runs.spans import root_span_id, subagent_span_id
from runs.tools.registry import tool_contracts_for
from tests.agents import make_agent
from tests.conftest import WorkerProcess, start_worker, wait_for
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ANSWER = "Order 4821 shipped on 2 May; the carrier is DHL."


def delegate(call_id: str, slug: str, task: str) -> dict[str, Any]:
    return {"id": call_id, "name": f"agent__{slug}", "arguments": {"task": task}}


@pytest.fixture
def two_workers(tmp_path: Path, transactional_db: Any) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path, concurrency=2)
    yield worker
    worker.stop()


def settled(run: Run, timeout: float = 90) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def spans_of(run: Run) -> list[tuple[Span, dict[str, str]]]:
    wait_for(
        lambda: (
            Span.objects.filter(run=run).exists()
            and not Span.objects.filter(run=run, ended_at__isnull=True).exists()
        ),
        what="every span of the run ended",
    )
    return run_spans_with_payloads(tenant=run.tenant, run_id=run.id)


def model_inputs(run: Run) -> list[list[dict[str, Any]]]:
    key = "gen_ai.input.messages"
    return [
        json.loads(payloads.get(key) or span.attributes[key])
        for span, payloads in spans_of(run)
        if span.name.startswith("chat ")
    ]


def test_parent_receives_the_childs_answer_as_its_observation(
    tenant, operator_user, two_workers
):
    make_agent(
        tenant, "researcher", script=[{"text": ANSWER}],
        system_prompt="You look up orders.",
    )  # fmt: skip
    parent_agent = make_agent(
        tenant, "lead",
        subagents=[{"agent": "researcher", "description": "Looks up orders."}],
        script=[
            {"tool_calls": [delegate("call_r", "researcher", "When did 4821 ship?")]},
            {"text": "It shipped on 2 May."},
        ],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug=parent_agent.slug,
                       input="Where is order 4821?",
                       started_by=operator_user)  # fmt: skip
    parent = settled(parent)
    assert parent.final_answer == "It shipped on 2 May.", parent.stop_detail
    (child,) = Run.objects.filter(parent_run=parent)
    assert child.input == "When did 4821 ship?"
    assert child.agent.slug == "researcher" and child.depth == 1
    assert child.parent_tool_call.call_id == "call_r"
    assert child.final_answer == ANSWER and child.status == "unverified"
    # The tool is offered with the sub-agent's description and a `task` brief.
    _, second = model_inputs(parent)
    # Exactly what the parent's model saw as the call's result.
    tool_message = second[-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "call_r",
        "content": json.dumps(
            {
                "trust": TRUST_LABEL,
                "tool": "agent__researcher",
                "ok": True,
                "data": {
                    "agent": "researcher",
                    "run_id": str(child.id),
                    "status": "unverified",
                    "answer": ANSWER,
                },
                "error": None,
                "refs": [],
            },
            ensure_ascii=False,
            separators=(",", ":"),
        ),
    }
    row = ToolCall.objects.get(run=parent, call_id="call_r")
    assert row.status == "succeeded"
    assert row.observation["content"] == tool_message["content"]
    # The tool was offered with the sub-agent's description and a `task` brief.
    key = "gen_ai.tool.definitions"
    (tools,) = [
        json.loads(payloads.get(key) or span.attributes[key])
        for span, payloads in spans_of(parent)
        if span.name.startswith("chat ")
        and span.attributes.get("cp.step.index", 0) == 0
        and (key in payloads or key in span.attributes)
    ][:1]
    offered = json.dumps([t for t in tools if "agent__researcher" in json.dumps(t)])
    assert "Looks up orders." in offered and '"task"' in offered
    # The child's spend is its parent's: the parent's counters include it.
    assert parent.tool_calls == 1
    assert parent.input_tokens >= child.input_tokens > 0


def test_the_tree_is_one_trace_the_childs_root_under_the_calling_span(
    tenant, operator_user, two_workers
):
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    make_agent(
        tenant, "lead", subagents=["researcher"],
        script=[{"tool_calls": [delegate("call_r", "researcher", "Look it up.")]},
                {"text": "Done."}],
    )  # fmt: skip
    parent = settled(run_start(tenant=tenant, agent_slug="lead", input="Go",
                               started_by=operator_user))  # fmt: skip
    (child,) = Run.objects.filter(parent_run=parent)
    row = ToolCall.objects.get(run=parent, call_id="call_r")
    calling = Span.objects.get(run=parent, span_id=f"{subagent_span_id(row.id):016x}")
    assert calling.name == "execute_tool agent__researcher"
    assert calling.attributes["cp.subagent.run_id"] == str(child.id)
    assert calling.attributes["cp.subagent.answer"] == ANSWER
    assert calling.status in ("ok", "unset") and calling.ended_at is not None
    spans_of(child)
    child_root = Span.objects.get(run=child, span_id=f"{root_span_id(child):016x}")
    assert child.trace_id == parent.trace_id
    assert child_root.trace_id == parent.trace_id
    assert child_root.parent_span_id == calling.span_id
    assert child_root.name == "invoke_agent researcher"
    # The calling span is a child of the parent's step span, in the same trace.
    step = Span.objects.get(run=parent, span_id=calling.parent_span_id)
    assert step.name.startswith("step 0") and step.trace_id == parent.trace_id


def test_parallel_children_share_what_the_parent_has_left(
    tenant, operator_user, two_workers
):
    ModelPriceEntry.objects.create(
        model="scripted", input_per_million=Decimal(10),
        cached_input_per_million=Decimal(0), output_per_million=Decimal(20),
    )  # fmt: skip
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    make_agent(
        tenant, "lead", subagents=["researcher"],
        script=[{"tool_calls": [delegate("call_a", "researcher", "Part A"),
                                delegate("call_b", "researcher", "Part B")]},
                {"text": "Both done."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Split it",
                       started_by=operator_user,
                       limits={"max_cost": "1.00"})  # fmt: skip
    parent = settled(parent)
    assert parent.final_answer == "Both done.", parent.stop_detail
    children = list(Run.objects.filter(parent_run=parent))
    assert len(children) == 2
    # Both started in the parent's first step; it resumed once, after both ended.
    assert parent.steps == 2
    resumed = parent.step_rows.get(index=1).started_at
    assert all(child.finished_at <= resumed for child in children)
    first_step_cost = parent.step_rows.get(index=0).cost
    left = Decimal("1.00") - first_step_cost
    shares = [Decimal(child.limits["max_cost"]) for child in children]
    # Each a half of what was left after the parent's first call, never more.
    expected = (left / 2).quantize(Decimal("0.000001"), rounding="ROUND_DOWN")
    assert shares == [expected, expected]
    assert sum(shares) <= left
    for child in children:
        assert child.cost <= Decimal(child.limits["max_cost"])
        assert child.cost > 0
    # The parent's cost counts its tree: its own calls and its children's.
    own = sum(step.cost for step in parent.step_rows.all())
    assert parent.cost == own + sum(child.cost for child in children)
    assert parent.cost <= Decimal("1.00")


def test_cancelling_the_parent_cancels_its_children(
    tenant, operator_user, api_client_for, two_workers
):
    # The child waits for a person (an approval), the parent for the child.
    make_agent(
        tenant, "writer", tools=["echo"],
        tool_settings={"echo": {"approval": "always"}},
        script=[{"tool_calls": [{"id": "e1", "name": "echo",
                                 "arguments": {"text": "hi"}}]},
                {"text": "never"}],
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["writer"],
        script=[{"tool_calls": [delegate("call_w", "writer", "Say hi.")]},
                {"text": "never"}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    wait_for(
        lambda: Run.objects.filter(
            parent_run=parent, status="waiting_approval"
        ).exists(),
        timeout=60,
        what="the child waits for an approval",
    )
    parent.refresh_from_db()
    assert parent.status == "waiting_subagents"
    assert not parent.lease_owner and parent.step_token is None  # holds no worker
    (child,) = Run.objects.filter(parent_run=parent)
    # The approval inside the child says which run it serves.
    client = api_client_for(operator_user, tenant)
    listed = client.get("/api/v1/approvals/", {"status": "pending"}).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    (approval,) = [a for a in rows if a["run"] == str(child.id)]
    assert approval["parent_run"] == str(parent.id)
    run_cancel(run=parent, actor=operator_user)
    parent = settled(parent)
    child = settled(child)
    assert parent.status == "cancelled"
    assert child.status == "cancelled"
    assert ApprovalRequest.objects.get(run=child).status == "cancelled"
    assert not ToolCall.objects.filter(run=child, status="succeeded").exists()
    assert ToolCall.objects.get(run=parent, call_id="call_w").status == "cancelled"


def test_a_cancelled_child_is_an_observation_for_its_parent(
    tenant, operator_user, two_workers
):
    make_agent(
        tenant, "writer", tools=["echo"],
        tool_settings={"echo": {"approval": "always"}},
        script=[{"tool_calls": [{"id": "e1", "name": "echo",
                                 "arguments": {"text": "hi"}}]}],
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["writer"],
        script=[{"tool_calls": [delegate("call_w", "writer", "Say hi.")]},
                {"text": "The writer was stopped."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    child = wait_for(
        lambda: Run.objects.filter(
            parent_run=parent, status="waiting_approval"
        ).first(),
        timeout=60,
        what="the child waits",
    )
    run_cancel(run=child, actor=operator_user)
    parent = settled(parent)
    assert parent.final_answer == "The writer was stopped."
    row = ToolCall.objects.get(run=parent, call_id="call_w")
    assert row.status == "failed"
    observed = json.loads(row.observation["content"])
    assert observed["ok"] is False
    assert observed["error"]["code"] == "ECANCELED"
    assert "stopped cancelled" in observed["error"]["message"]


def test_depth_and_fan_out_caps_give_an_error_observation(
    tenant, operator_user, tmp_path
):
    worker = start_worker(
        tmp_path, concurrency=2,
        extra_env={"RUN_SUBAGENT_MAX_DEPTH": "1", "RUN_SUBAGENT_MAX_CHILDREN": "1"},
    )  # fmt: skip
    try:
        make_agent(tenant, "leaf", script=[{"text": "leaf done"}])
        make_agent(
            tenant, "middle", subagents=["leaf"],
            script=[{"tool_calls": [delegate("call_leaf", "leaf", "Deeper")]},
                    {"text": "middle done"}],
        )  # fmt: skip
        make_agent(
            tenant, "top", subagents=["middle", "leaf"],
            script=[{"tool_calls": [delegate("call_m", "middle", "Go down"),
                                    delegate("call_l", "leaf", "Second child")]},
                    {"text": "top done"}],
        )  # fmt: skip
        top = settled(run_start(tenant=tenant, agent_slug="top", input="Go",
                                started_by=operator_user))  # fmt: skip
    finally:
        worker.stop()
    assert top.final_answer == "top done", top.stop_detail
    # Fan-out 1: the second call started nothing.
    (middle,) = Run.objects.filter(parent_run=top)
    assert middle.agent.slug == "middle"
    second = ToolCall.objects.get(run=top, call_id="call_l")
    assert second.status == "refused"
    assert "RUN_SUBAGENT_MAX_CHILDREN" in second.observation["content"]
    # Depth 1: the middle run's call of leaf started nothing.
    assert middle.final_answer == "middle done"
    assert not Run.objects.filter(parent_run=middle).exists()
    deep = ToolCall.objects.get(run=middle, call_id="call_leaf")
    assert deep.status == "refused"
    assert "RUN_SUBAGENT_MAX_DEPTH" in deep.observation["content"]
    assert Run.objects.filter(tenant=tenant).count() == 2


def test_a_cycle_found_at_run_time_starts_nothing(tenant, operator_user, two_workers):
    """A cycle cannot be saved (test_subagent_config); one made behind the
    services' back is refused when the call is made."""
    make_agent(
        tenant, "ping", script=[{"text": "ping done"}],
    )  # fmt: skip
    pong = make_agent(
        tenant, "pong", subagents=["ping"],
        script=[{"text": "pong done"}],
    )  # fmt: skip
    AgentVersion.objects.filter(agent__slug="ping", agent__tenant=tenant).update(
        subagents=[{"agent": "pong", "description": ""}],
        script=[{"tool_calls": [delegate("call_pong", "pong", "Back up")]},
                {"text": "ping done"}],
    )  # fmt: skip
    AgentVersion.objects.filter(agent=pong).update(
        script=[{"tool_calls": [delegate("call_ping", "ping", "Down")]},
                {"text": "pong done"}],
    )  # fmt: skip
    top = settled(run_start(tenant=tenant, agent_slug="pong", input="Go",
                            started_by=operator_user))  # fmt: skip
    assert top.final_answer == "pong done", top.stop_detail
    (ping,) = Run.objects.filter(parent_run=top)
    assert not Run.objects.filter(parent_run=ping).exists()
    row = ToolCall.objects.get(run=ping, call_id="call_pong")
    assert row.status == "refused"
    assert "a cycle (pong -> ping -> pong)" in row.observation["content"]


def test_the_tenants_policy_may_deny_a_sub_agent_call(tenant, admin_user, drive_run):
    """Under the same tenant policy: a rule that denies the call ends the run
    `policy_blocked`, and no child starts."""
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    approval_rule_create(
        tenant=tenant, actor=admin_user,
        data={"name": "No delegation", "tool": "agent__researcher",
              "action": "deny"},
        known_tools=tool_contracts_for(tenant_id=tenant.id),
    )  # fmt: skip
    make_agent(
        tenant, "lead", subagents=["researcher"],
        script=[{"tool_calls": [delegate("call_r", "researcher", "Look it up.")]},
                {"text": "never"}],
    )  # fmt: skip
    run = drive_run(
        run_start(tenant=tenant, agent_slug="lead", input="Go", started_by=None)
    )
    assert run.status == "policy_blocked" and run.stop_reason == "policy_denied"
    assert ToolCall.objects.get(run=run, call_id="call_r").status == "denied"
    assert not Run.objects.filter(parent_run=run).exists()


def test_a_parent_killed_after_starting_a_child_never_starts_it_twice(
    tenant, operator_user, tmp_path, settings
):
    """The worker dies right after the first child's start is committed; the
    recovered step finds that child (the call's row names it), starts only the
    second, and waits for both."""
    settings.RUN_LEASE_SECONDS = 2.0
    lease = {"RUN_LEASE_SECONDS": "2"}
    first = start_worker(
        tmp_path, pool="solo",
        extra_env={**lease, "RUN_FAILPOINTS": "after_subagent_started",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    make_agent(
        tenant, "lead", subagents=["researcher"],
        script=[{"tool_calls": [delegate("call_a", "researcher", "Part A"),
                                delegate("call_b", "researcher", "Part B")]},
                {"text": "Both done."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    wait_for(lambda: first.process.poll() is not None, timeout=60)  # SIGKILLed
    assert Run.objects.filter(parent_run=parent).count() == 1
    second = start_worker(tmp_path, concurrency=2, extra_env=lease)
    try:
        wait_for(
            lambda: (
                recover_stalled_runs() is not None
                and (time.sleep(0.5) or Run.objects.get(id=parent.id).is_terminal)
            ),
            timeout=90,
            what="the parent recovered and ended",
        )
    finally:
        second.stop()
    parent.refresh_from_db()
    assert parent.final_answer == "Both done.", parent.stop_detail
    children = Run.objects.filter(parent_run=parent)
    assert sorted(c.parent_tool_call.call_id for c in children) == ["call_a", "call_b"]
    assert all(c.final_answer == ANSWER for c in children)
    assert set(
        ToolCall.objects.filter(run=parent).values_list("status", flat=True)
    ) == {"succeeded"}
    # Each child's root hangs under its call's span, the first one's stored by
    # the recovered step.
    for child in children:
        spans_of(child)
        root = Span.objects.get(run=child, span_id=f"{root_span_id(child):016x}")
        calling = Span.objects.get(run=parent, span_id=root.parent_span_id)
        assert calling.attributes["cp.subagent.run_id"] == str(child.id)
        assert calling.ended_at is not None


# --- a sub-agent call put to a person ----------------------------------------


def require_approval_of_delegation(tenant: Any, admin_user: Any) -> None:
    approval_rule_create(
        tenant=tenant, actor=admin_user,
        data={"name": "Ask before delegating", "tool": "agent__researcher",
              "action": "require_approval"},
        known_tools=tool_contracts_for(tenant_id=tenant.id),
    )  # fmt: skip


def delegating_lead(tenant: Any, final: str) -> Any:
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    return make_agent(
        tenant, "lead", subagents=["researcher"],
        script=[{"tool_calls": [delegate("call_r", "researcher", "Look it up.")]},
                {"text": final}],
    )  # fmt: skip


def waiting_for_approval(run: Run) -> ApprovalRequest:
    """The parent waits for a person, holding no worker, no child started."""
    approval = wait_for(
        lambda: ApprovalRequest.objects.filter(
            run_id=run.id, status=ApprovalRequest.Status.PENDING
        ).first(),
        timeout=60,
        what="the sub-agent call to ask for approval",
    )
    wait_for(
        lambda: Run.objects.get(id=run.id).status == "waiting_approval",
        timeout=60,
        what="the parent to wait for the approval",
    )
    run.refresh_from_db()
    assert not run.lease_owner and run.step_token is None  # holds no worker
    assert approval.tool_name == "agent__researcher"
    assert approval.args_snapshot == {"task": "Look it up."}
    row = ToolCall.objects.get(run=run, call_id="call_r")
    assert row.status == "waiting_approval"
    assert not Run.objects.filter(parent_run=run).exists()
    return approval


def decide(client: Any, approval: ApprovalRequest, decision: str, **extra: Any) -> None:
    answer = client.post(
        f"/api/v1/approvals/{approval.id}/decide/",
        {"decision": decision, **extra},
        format="json",
    )
    assert answer.status_code == 200, answer.content


def test_an_approved_sub_agent_call_starts_its_child(
    tenant, admin_user, operator_user, api_client_for, two_workers
):
    """A rule that puts the call to a person: the parent waits
    `waiting_approval` (the step's next call, which needs none, not started
    either), the call is in the inbox like any; approved (the reviewer edits
    the brief), the child starts with the approved brief, both children share
    what the parent has left as without an approval, and the child's answer
    is the parent's observation."""
    ModelPriceEntry.objects.create(
        model="scripted", input_per_million=Decimal(10),
        cached_input_per_million=Decimal(0), output_per_million=Decimal(20),
    )  # fmt: skip
    require_approval_of_delegation(tenant, admin_user)
    make_agent(tenant, "researcher", script=[{"text": ANSWER}])
    make_agent(tenant, "writer", script=[{"text": "Written."}])
    make_agent(
        tenant, "lead", subagents=["researcher", "writer"],
        script=[{"tool_calls": [delegate("call_r", "researcher", "Look it up."),
                                delegate("call_w", "writer", "Write it up.")]},
                {"text": "It shipped on 2 May."}],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user,
                       limits={"max_cost": "1.00"})  # fmt: skip
    approval = waiting_for_approval(parent)
    assert ToolCall.objects.get(run=parent, call_id="call_w").status == "pending"
    client = api_client_for(admin_user, tenant)
    listed = client.get("/api/v1/approvals/", {"status": "pending"}).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    (listed_approval,) = [a for a in rows if a["run"] == str(parent.id)]
    assert listed_approval["id"] == str(approval.id)
    decide(client, approval, "approve", args={"task": "When did 4821 ship?"})
    parent = settled(parent)
    assert parent.final_answer == "It shipped on 2 May.", parent.stop_detail
    child = Run.objects.get(parent_run=parent, agent__slug="researcher")
    assert child.input == "When did 4821 ship?"  # what was approved
    assert child.final_answer == ANSWER
    assert child.parent_tool_call.call_id == "call_r"
    row = ToolCall.objects.get(run=parent, call_id="call_r")
    assert row.status == "succeeded"
    observed = json.loads(row.observation["content"])
    assert observed["data"]["answer"] == ANSWER
    assert observed["data"]["run_id"] == str(child.id)
    assert "the arguments were changed by" in row.observation["content"]
    # The model's next input carries that observation.
    _, second = model_inputs(parent)
    (message,) = [m for m in second if m.get("tool_call_id") == "call_r"]
    assert json.loads(message["content"])["data"]["answer"] == ANSWER
    # Carved from the parent's remaining budget, as without an approval: the
    # approved call and the one after it share it.
    left = Decimal("1.00") - parent.step_rows.get(index=0).cost
    expected = (left / 2).quantize(Decimal("0.000001"), rounding="ROUND_DOWN")
    children = Run.objects.filter(parent_run=parent)
    assert [Decimal(c.limits["max_cost"]) for c in children] == [expected, expected]
    assert ToolCall.objects.get(run=parent, call_id="call_w").status == "succeeded"
    # The approval's span and the call's span are both on the parent's trace.
    names = {span.name for span, _ in spans_of(parent)}
    assert {"approval agent__researcher", "execute_tool agent__researcher"} <= names


def test_a_denied_sub_agent_call_starts_nothing(
    tenant, admin_user, operator_user, api_client_for, two_workers
):
    """Denied: no child run, and the model gets the denial as the call's
    observation; the parent goes on."""
    require_approval_of_delegation(tenant, admin_user)
    delegating_lead(tenant, "I may not delegate; doing it myself.")
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    approval = waiting_for_approval(parent)
    decide(api_client_for(admin_user, tenant), approval, "deny",
           reason="not for this order")  # fmt: skip
    parent = settled(parent)
    assert parent.final_answer == "I may not delegate; doing it myself."
    assert not Run.objects.filter(parent_run=parent).exists()
    assert Run.objects.filter(tenant=tenant).count() == 1
    row = ToolCall.objects.get(run=parent, call_id="call_r")
    assert row.status == "denied"
    observed = json.loads(row.observation["content"])
    assert observed["ok"] is False and observed["error"]["code"] == "EPERM"
    assert "denied by a reviewer: not for this order" in observed["error"]["message"]
    _, second = model_inputs(parent)
    assert json.loads(second[-1]["content"])["error"] == observed["error"]


def test_an_expired_sub_agent_approval_starts_nothing(
    tenant, admin_user, operator_user, two_workers
):
    require_approval_of_delegation(tenant, admin_user)
    delegating_lead(tenant, "Nobody answered.")
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    approval = waiting_for_approval(parent)
    later = approval.expires_at + dt.timedelta(seconds=1)
    assert approvals_expire(now=later) == 1
    parent = settled(parent)
    assert parent.final_answer == "Nobody answered."
    assert not Run.objects.filter(parent_run=parent).exists()
    row = ToolCall.objects.get(run=parent, call_id="call_r")
    assert row.status == "denied"
    assert "expired" in json.loads(row.observation["content"])["error"]["message"]


def test_a_parent_cancelled_while_its_call_waits_starts_nothing(
    tenant, admin_user, operator_user, two_workers
):
    require_approval_of_delegation(tenant, admin_user)
    delegating_lead(tenant, "never")
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    approval = waiting_for_approval(parent)
    run_cancel(run=parent, actor=operator_user)
    parent = settled(parent)
    assert parent.status == "cancelled"
    approval.refresh_from_db()
    assert approval.status == "cancelled"
    assert ToolCall.objects.get(run=parent, call_id="call_r").status == "cancelled"
    assert not Run.objects.filter(parent_run=parent).exists()


def test_a_parent_killed_after_an_approved_start_never_starts_it_twice(
    tenant, admin_user, operator_user, api_client_for, tmp_path, settings
):
    """The worker dies right after the approved call's child is committed;
    the recovered step finds that child and waits for it: one child."""
    settings.RUN_LEASE_SECONDS = 2.0
    lease = {"RUN_LEASE_SECONDS": "2"}
    first = start_worker(
        tmp_path, pool="solo",
        extra_env={**lease, "RUN_FAILPOINTS": "after_subagent_started",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    require_approval_of_delegation(tenant, admin_user)
    delegating_lead(tenant, "Done.")
    parent = run_start(tenant=tenant, agent_slug="lead", input="Go",
                       started_by=operator_user)  # fmt: skip
    approval = waiting_for_approval(parent)
    decide(api_client_for(admin_user, tenant), approval, "approve")
    wait_for(lambda: first.process.poll() is not None, timeout=60)  # SIGKILLed
    assert Run.objects.filter(parent_run=parent).count() == 1
    second = start_worker(tmp_path, concurrency=2, extra_env=lease)
    try:
        wait_for(
            lambda: (
                recover_stalled_runs() is not None
                and (time.sleep(0.5) or Run.objects.get(id=parent.id).is_terminal)
            ),
            timeout=90,
            what="the parent recovered and ended",
        )
    finally:
        second.stop()
    parent.refresh_from_db()
    assert parent.final_answer == "Done.", parent.stop_detail
    (child,) = Run.objects.filter(parent_run=parent)
    assert child.final_answer == ANSWER
    assert ToolCall.objects.get(run=parent, call_id="call_r").status == "succeeded"


def test_a_child_whose_call_overflows_ends_with_the_models_error_and_no_branch(
    tenant, operator_user, two_workers
):
    """The parent waits for the child run itself: an overflow in the child is
    the child's model error (no recovery branch the parent would not see), and
    the parent's model hears how it stopped."""
    overflow = {"error": {"kind": "context_overflow", "message": "too long"}}
    make_agent(tenant, "researcher", script=[overflow, {"text": ANSWER}])
    parent_agent = make_agent(
        tenant, "lead",
        subagents=[{"agent": "researcher", "description": "Looks up orders."}],
        script=[
            {"tool_calls": [delegate("call_r", "researcher", "When did 4821 ship?")]},
            {"text": "The researcher could not answer."},
        ],
    )  # fmt: skip
    parent = run_start(tenant=tenant, agent_slug=parent_agent.slug,
                       input="Where is order 4821?",
                       started_by=operator_user)  # fmt: skip
    parent = settled(parent)
    (child,) = Run.objects.filter(parent_run=parent)
    assert (child.status, child.stop_reason) == ("failed", "model_error")
    assert not SessionBranch.objects.exists()
    result = json.loads(model_inputs(parent)[1][-1]["content"])
    assert (
        not result["ok"]
        and "context_overflow: too long" in (result["error"]["message"])
    ), result
