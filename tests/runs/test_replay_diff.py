"""A run beside its replay (GET /api/v1/runs/<id>/replay-diff/): a replay of an
unchanged record lines up step for step; under a rule added since, the denied
call is the first divergence; `replay_run` names the diff when they differ."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command

from approvals.models import ApprovalRequest
from runs.models import Run
from runs.services.decide import approval_decide
from runs.services.lifecycle import run_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved_run(demo_agent: Any, operator_user: Any, drive_run: Any) -> Run:
    run = drive_run(
        run_start(
            tenant=demo_agent.tenant, agent_slug=demo_agent.slug,
            input="order 4821 arrived damaged", started_by=operator_user,
        )
    )  # fmt: skip
    approval_decide(
        request=ApprovalRequest.objects.get(run=run), decided_by=operator_user,
        approve=True,
    )  # fmt: skip
    run = drive_run(run)
    assert run.status == Run.Status.SUCCEEDED
    return run


def test_an_unchanged_record_replays_step_for_step(
    approved_run, operator_user, api_client_for
):
    client = api_client_for(operator_user, approved_run.tenant)
    answer = client.get(f"/api/v1/runs/{approved_run.id}/replay-diff/")
    assert answer.status_code == 200, answer.content
    diff = answer.json()
    assert diff["left"]["replay"] is False and diff["right"]["replay"] is True
    assert diff["right"]["id"] == str(approved_run.id)
    reasons = [(p["kind"], p["reasons"]) for p in diff["pairs"]]
    assert diff["counts"] == {
        "same": 4, "changed": 0, "inserted": 0, "skipped": 0
    }, reasons  # fmt: skip
    assert diff["first_divergence"] is None
    assert diff["right"]["status"] == "succeeded"
    assert diff["right"]["final_answer"] == approved_run.final_answer
    tools = [c["tool"] for p in diff["pairs"] for c in p["right"]["calls"]]
    assert tools == ["lookup_order", "create_replacement", "get_delivery_date"]


def test_a_rule_added_since_makes_the_denied_call_the_first_divergence(
    approved_run, admin_user, operator_user, api_client_for
):
    admin = api_client_for(admin_user, approved_run.tenant)
    rule = admin.post(
        "/api/v1/approval-rules/",
        {"name": "no replacements", "tool": "create_replacement", "action": "deny"},
        format="json",
    )
    assert rule.status_code == 201, rule.content
    diff = (
        api_client_for(operator_user, approved_run.tenant)
        .get(f"/api/v1/runs/{approved_run.id}/replay-diff/")
        .json()
    )
    first = diff["first_divergence"]
    assert first is not None
    pair = diff["pairs"][first["pair"]]
    assert pair["kind"] == "changed"
    [left_call] = pair["left"]["calls"]
    [right_call] = pair["right"]["calls"]
    assert left_call["tool"] == right_call["tool"] == "create_replacement"
    assert (left_call["status"], right_call["status"]) == ("succeeded", "denied")
    assert diff["right"]["status"] != "succeeded"
    with pytest.raises(CommandError, match=f"/runs/{approved_run.id}/replay/"):
        call_command("replay_run", str(approved_run.id))


def test_another_tenants_run_has_no_replay_diff(
    approved_run, other_tenant, make_member, api_client_for
):
    stranger = make_member(other_tenant, "stranger", "admin")
    client = api_client_for(stranger, other_tenant)
    assert client.get(f"/api/v1/runs/{approved_run.id}/replay-diff/").status_code == 404
