"""A run proposed as an eval case ("Add to suite"): its input, the orders it
looked up as the case's world, the people's decisions as scripted approvals,
and graders proposed from what went wrong, ticked; the proposal writes nothing,
and the case made from it is accepted by the cases API as it stands."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.models import EvalCase, Run
from runs.services.decide import approval_decide
from runs.services.evals import eval_suite_create
from runs.services.lifecycle import run_start

pytestmark = pytest.mark.django_db


def _denied_run(demo_agent: Any, user: Any, drive_run: Any) -> Run:
    run = run_start(
        tenant=demo_agent.tenant, agent_slug=demo_agent.slug,
        input="Order #4821 arrived with a dented spout.", started_by=user,
    )  # fmt: skip
    run = drive_run(run)
    approval = ApprovalRequest.objects.get(run=run)
    approval_decide(
        request=approval, decided_by=user, approve=False, reason="ask for a photo first"
    )
    return drive_run(run)


def _suite(tenant: Any, user: Any) -> Any:
    case = {
        "slug": "happy",
        "input": "Order #4821 is damaged",
        "graders": [{"kind": "must_call", "tool": "lookup_order"}],
    }
    return eval_suite_create(
        tenant=tenant, actor=user,
        document={"slug": "kettle", "name": "Kettle", "cases": [case]},
    )  # fmt: skip


def test_a_denied_run_proposes_its_world_its_decision_and_what_went_wrong(
    demo_agent, operator_user, drive_run, api_client_for
):
    run = _denied_run(demo_agent, operator_user, drive_run)
    assert run.status == Run.Status.FAILED
    client = api_client_for(operator_user, demo_agent.tenant)
    answer = client.get(f"/api/v1/runs/{run.id}/case-proposal/")
    assert answer.status_code == 200, answer.content
    proposal = answer.json()
    case = proposal["case"]
    assert case["input"] == "Order #4821 arrived with a dented spout."
    # The order as lookup_order returned it to the run.
    [order] = case["world"]["orders"]
    assert order["order_id"] == "4821"
    assert order["damaged"] is True
    assert {"customer", "item", "amount", "status", "note"} <= order.keys()
    assert case["approvals"] == [
        {
            "tool": "create_replacement",
            "decision": "deny",
            "reason": "ask for a photo first",
        }
    ]
    by_kind = {
        (p["grader"]["kind"], p["grader"].get("tool")): p for p in proposal["graders"]
    }
    denied = by_kind[("must_not_call", "create_replacement")]
    assert denied["checked"] is True
    assert operator_user.username in denied["why"]
    assert "ask for a photo first" in denied["why"]
    assert denied["grader"]["args"]["order_id"] == "4821"
    # A failed run's good calls are offered, not ticked.
    looked_up = by_kind[("must_call", "lookup_order")]
    assert looked_up["checked"] is False
    assert looked_up["grader"]["args"] == {"order_id": "4821"}


def test_the_proposed_case_is_accepted_as_it_stands_and_reading_writes_nothing(
    demo_agent, operator_user, drive_run, api_client_for
):
    run = _denied_run(demo_agent, operator_user, drive_run)
    suite = _suite(demo_agent.tenant, operator_user)
    client = api_client_for(operator_user, demo_agent.tenant)
    proposal = client.get(f"/api/v1/runs/{run.id}/case-proposal/").json()
    assert EvalCase.objects.filter(suite=suite).count() == 1  # reading wrote nothing
    graders = [p["grader"] for p in proposal["graders"] if p["checked"]]
    made = client.post(
        f"/api/v1/evals/suites/{suite.slug}/cases/",
        {**proposal["case"], "graders": graders},
        format="json",
    )
    assert made.status_code == 201, made.content
    stored = EvalCase.objects.get(suite=suite, slug=proposal["case"]["slug"])
    assert stored.world["orders"][0]["order_id"] == "4821"
    assert stored.approvals[0]["decision"] == "deny"


def test_a_good_run_ticks_its_calls_and_the_one_replacement(
    demo_agent, operator_user, drive_run, api_client_for
):
    run = run_start(
        tenant=demo_agent.tenant, agent_slug=demo_agent.slug,
        input="order 4821 arrived damaged", started_by=operator_user,
    )  # fmt: skip
    run = drive_run(run)
    approval_decide(
        request=ApprovalRequest.objects.get(run=run), decided_by=operator_user,
        approve=True,
    )  # fmt: skip
    run = drive_run(run)
    assert run.status == Run.Status.SUCCEEDED
    proposal = (
        api_client_for(operator_user, demo_agent.tenant)
        .get(f"/api/v1/runs/{run.id}/case-proposal/")
        .json()
    )
    assert proposal["case"]["approvals"] == [
        {"tool": "create_replacement", "decision": "approve"}
    ]
    checked = [p["grader"] for p in proposal["graders"] if p["checked"]]
    assert {
        "kind": "must_call",
        "tool": "get_delivery_date",
        "args": {"order_id": "4821"},
    } in checked
    assert {
        "kind": "world_state", "object": "replacements", "order_id": "4821", "count": 1
    } in checked  # fmt: skip
    assert not any(
        p["grader"]["kind"] == "final_answer_regex" for p in proposal["graders"]
    )


def test_another_tenants_run_is_404_and_a_viewer_may_read_but_not_add(
    demo_agent, operator_user, viewer_user, other_tenant, make_member, drive_run,
    api_client_for,
):  # fmt: skip
    run = _denied_run(demo_agent, operator_user, drive_run)
    suite = _suite(demo_agent.tenant, operator_user)
    stranger = make_member(other_tenant, "stranger", "admin")
    assert (
        api_client_for(stranger, other_tenant)
        .get(f"/api/v1/runs/{run.id}/case-proposal/")
        .status_code
        == 404
    )
    viewer = api_client_for(viewer_user, demo_agent.tenant)
    proposal = viewer.get(f"/api/v1/runs/{run.id}/case-proposal/")
    assert proposal.status_code == 200
    refused = viewer.post(
        f"/api/v1/evals/suites/{suite.slug}/cases/",
        {
            **proposal.json()["case"],
            "graders": [{"kind": "must_call", "tool": "refund"}],
        },
        format="json",
    )
    assert refused.status_code == 403
    assert EvalCase.objects.filter(suite=suite).count() == 1
    assert viewer.get("/api/v1/runs/not-a-run/case-proposal/").status_code == 404
