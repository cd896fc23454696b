"""The runs API: tenant-scoped, role-checked, and nothing written on bad input."""

from __future__ import annotations

import pytest

from controlplane.models import AuditEvent
from runs.models import Run, Step


@pytest.fixture
def operator_client(demo_agent, operator_user, api_client_for):
    return api_client_for(operator_user, demo_agent.tenant)


def start(client, **body):
    payload = {"agent": "kettlecraft-support", "input": "order 4821 is damaged"}
    payload.update(body)
    return client.post("/api/v1/runs/", payload, format="json")


def test_start_returns_201_with_the_queued_run_and_audits_it(operator_client):
    response = start(operator_client, limits={"max_steps": 10})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "queued"
    assert body["agent"] == "kettlecraft-support"
    assert body["limits"]["max_steps"] == 10
    assert body["started_by"] == "oscar-operator"
    assert AuditEvent.objects.filter(action="run.start", object_id=body["id"]).exists()


def test_run_limits_can_lower_but_not_raise_the_default_caps(operator_client, settings):
    settings.RUN_DEFAULT_LIMITS = {"max_steps": 20}
    body = start(operator_client, limits={"max_steps": 500}).json()
    assert body["limits"]["max_steps"] == 20


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent": "no-such-agent"}, "agent"),
        ({"agent": "Not A Slug!"}, "agent"),
        ({"input": ""}, "input"),
        ({"input": "x" * 20_001}, "input"),
        ({"limits": {"max_steps": -1}}, "limits"),
        ({"limits": {"max_cost": "lots"}}, "limits"),
        ({"limits": {"max_banana": 3}}, "limits"),
        ({"limits": "ten"}, "limits"),
    ],
)
def test_bad_start_requests_get_400_naming_the_field_and_write_nothing(
    operator_client, body, field
):
    response = start(operator_client, **body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"]
    assert Run.objects.count() == 0
    assert not AuditEvent.objects.filter(action="run.start").exists()


def test_viewer_cannot_start_or_cancel_but_can_read(
    demo_agent, viewer_user, operator_client, api_client_for
):
    viewer = api_client_for(viewer_user, demo_agent.tenant)
    assert start(viewer).status_code == 403
    assert Run.objects.count() == 0
    run_id = start(operator_client).json()["id"]
    assert viewer.get(f"/api/v1/runs/{run_id}/").status_code == 200
    assert viewer.post(f"/api/v1/runs/{run_id}/cancel/").status_code == 403
    assert Run.objects.get(id=run_id).status == "queued"


def test_another_tenants_run_is_404_to_read_and_to_cancel(
    operator_client, other_tenant, make_member, api_client_for
):
    run_id = start(operator_client).json()["id"]
    stranger = api_client_for(make_member(other_tenant, "sam", "admin"), other_tenant)
    assert stranger.get(f"/api/v1/runs/{run_id}/").status_code == 404
    assert stranger.post(f"/api/v1/runs/{run_id}/cancel/").status_code == 404
    assert Run.objects.get(id=run_id).status == "queued"
    assert stranger.get("/api/v1/runs/").json()["count"] == 0
    assert stranger.get("/api/v1/runs/not-a-uuid/").status_code == 404


def test_list_filters_by_status_and_agent_and_rejects_unknown_status(operator_client):
    start(operator_client)
    assert operator_client.get("/api/v1/runs/?status=queued").json()["count"] == 1
    assert operator_client.get("/api/v1/runs/?status=running").json()["count"] == 0
    assert operator_client.get("/api/v1/runs/?agent=other").json()["count"] == 0
    response = operator_client.get("/api/v1/runs/?status=bogus")
    assert response.status_code == 400
    assert "status" in response.json()["error"]["fields"]


def test_cancel_of_a_queued_run_ends_it_and_a_second_cancel_is_409(operator_client):
    run_id = start(operator_client).json()["id"]
    first = operator_client.post(f"/api/v1/runs/{run_id}/cancel/")
    assert first.status_code == 200
    assert first.json()["status"] == "cancelled"
    assert first.json()["stop_reason"] == "cancelled"
    second = operator_client.post(f"/api/v1/runs/{run_id}/cancel/")
    assert second.status_code == 409
    assert second.json()["error"]["run"]["status"] == "cancelled"
    assert not Step.objects.filter(run_id=run_id).exists()


def test_detail_shows_steps_and_tool_calls_after_progress(operator_client, drive_run):
    run_id = start(operator_client).json()["id"]
    drive_run(Run.objects.get(id=run_id))
    body = operator_client.get(f"/api/v1/runs/{run_id}/").json()
    assert body["status"] == "waiting_approval"
    assert [s["index"] for s in body["step_rows"]] == [0, 1]
    first_call = body["step_rows"][0]["tool_calls"][0]
    assert first_call["tool_name"] == "lookup_order"
    assert first_call["status"] == "succeeded"
    assert first_call["result"]["data"]["order_id"] == "4821"
