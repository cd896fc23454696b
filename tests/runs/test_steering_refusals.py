"""Steering messages refused (issue 28, bad input): another tenant's run, a
cancelled run, a viewer, a blank or too long text, a 10 MB body, an ended run
whose budget is spent. Each is a clear 4xx naming why, and nothing is written:
no message, no audit event, no event in the run's log, the run unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.models import AuditEvent
from runs.engine.steering import MAX_STEERING_CHARS
from runs.models import Run, RunMessage
from runs.services import run_cancel, run_start
from tracing.models import RunEvent

pytestmark = pytest.mark.django_db

SCRIPT = [{"text": "Done."}, {"text": "Again."}]


@pytest.fixture
def run(tenant: Any, scripted_agent: Any, operator_user: Any) -> Run:
    scripted_agent(SCRIPT, [])
    started: Run = run_start(
        tenant=tenant, agent_slug="scripted", input="hi", started_by=operator_user
    )
    return started


def snapshot(run: Run) -> tuple[Any, ...]:
    run.refresh_from_db()
    return (
        run.status,
        run.version,
        run.stop_reason,
        RunMessage.objects.count(),
        AuditEvent.objects.filter(action="run.message").count(),
        RunEvent.objects.filter(run=run, type__startswith="message.").count(),
    )


def post(client: Any, run: Run, body: Any, **kwargs: Any) -> Any:
    return client.post(f"/api/v1/runs/{run.id}/messages/", body, **kwargs)


def test_another_tenants_run_is_not_found(
    run, other_tenant, make_member, api_client_for
):
    stranger = make_member(other_tenant, "olga-other", "operator")
    client = api_client_for(stranger, other_tenant)
    before = snapshot(run)

    response = post(client, run, {"text": "hello"}, format="json")
    listed = client.get(f"/api/v1/runs/{run.id}/messages/")

    assert response.status_code == 404 and listed.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert snapshot(run) == before


def test_a_viewer_may_read_but_not_send(run, viewer_user, tenant, api_client_for):
    client = api_client_for(viewer_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"text": "hello"}, format="json")

    assert response.status_code == 403
    assert snapshot(run) == before
    assert client.get(f"/api/v1/runs/{run.id}/messages/").json() == []


def test_a_cancelled_run_is_a_conflict_naming_why(
    run, operator_user, tenant, api_client_for
):
    run_cancel(run=run, actor=operator_user)
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"text": "hello"}, format="json")

    assert response.status_code == 409
    error = response.json()["error"]
    assert "cancelled" in error["message"] and error["run"]["status"] == "cancelled"
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "text",
    ["", "   \n", "x" * (MAX_STEERING_CHARS + 1), None, ["a list"]],
    ids=["empty", "blank", "too-long", "null", "list"],
)
def test_a_bad_text_is_a_400_naming_text(
    run, operator_user, tenant, api_client_for, text
):
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"text": text}, format="json")

    assert response.status_code == 400, response.content
    assert "text" in response.json()["error"]["fields"]
    assert snapshot(run) == before


def test_a_missing_text_is_a_400_naming_text(
    run, operator_user, tenant, api_client_for
):
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"message": "hello"}, format="json")

    assert response.status_code == 400
    assert "text" in response.json()["error"]["fields"]
    assert snapshot(run) == before


def test_a_ten_megabyte_body_is_a_413_naming_text(
    run, operator_user, tenant, api_client_for
):
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)
    body = '{"text": "' + "x" * (10 * 1024 * 1024) + '"}'

    response = post(client, run, body, content_type="application/json")

    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "too_large" and "text" in error["fields"]
    assert str(MAX_STEERING_CHARS) in error["message"]
    assert snapshot(run) == before


def test_an_ended_run_whose_budget_is_spent_is_a_conflict_naming_the_budget(
    tenant, scripted_agent, operator_user, api_client_for, drive_run
):
    scripted_agent(SCRIPT, [])
    run = run_start(tenant=tenant, agent_slug="scripted", input="hi",
                    started_by=operator_user, limits={"max_steps": 1})  # fmt: skip
    run = drive_run(run)
    assert run.status == "unverified" and run.steps == 1
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"text": "one more thing"}, format="json")

    assert response.status_code == 409
    assert "budget" in response.json()["error"]["message"]
    assert "steps 1 of 1" in response.json()["error"]["message"]
    assert snapshot(run) == before
    assert run.step_token is None


def test_a_budget_exhausted_run_is_a_conflict_naming_its_stop_reason(
    run, operator_user, tenant, api_client_for
):
    Run.objects.filter(id=run.id).update(
        status=Run.Status.BUDGET_EXHAUSTED, stop_reason="max_cost"
    )
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"text": "one more thing"}, format="json")

    assert response.status_code == 409
    assert "budget is exhausted (max_cost)" in response.json()["error"]["message"]
    assert snapshot(run) == before


def test_a_queued_run_takes_a_message_without_a_second_loop(
    run, operator_user, tenant, api_client_for
):
    client = api_client_for(operator_user, tenant)
    token = run.step_token

    response = post(client, run, {"text": "also check the lid"}, format="json")

    assert response.status_code == 202
    run.refresh_from_db()
    assert run.status == "queued" and run.step_token == token  # no new step
    assert RunMessage.objects.get(run=run).state == "queued"


def test_a_message_a_cancelled_run_never_took_is_listed_as_dropped(
    run, operator_user, tenant, api_client_for
):
    client = api_client_for(operator_user, tenant)
    assert post(client, run, {"text": "also the lid"}, format="json").status_code == 202
    run_cancel(run=run, actor=operator_user)

    listed = client.get(f"/api/v1/runs/{run.id}/messages/").json()

    assert [m["state"] for m in listed] == ["dropped"]


def test_a_policy_blocked_run_does_not_continue(
    run, operator_user, tenant, api_client_for
):
    Run.objects.filter(id=run.id).update(
        status=Run.Status.POLICY_BLOCKED, stop_reason="policy_denied"
    )
    client = api_client_for(operator_user, tenant)
    before = snapshot(run)

    response = post(client, run, {"text": "try again"}, format="json")

    assert response.status_code == 409
    assert "ended as policy_blocked" in response.json()["error"]["message"]
    assert snapshot(run) == before
