"""Cancel always takes effect, through the API door, even for a run whose step
died holding its lease (the state an agent with a missing key left runs in:
`running`, 0 steps, retried by recovery every lease, cancel answered 200 and
ignored)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from runs.models import Run
from runs.services import recover_stalled_runs, run_advance
from runs.services.lifecycle import lease_acquire


@pytest.fixture
def operator_api(tenant, operator_user, api_client_for):
    return api_client_for(operator_user, tenant)


def _start(api) -> Run:
    response = api.post(
        "/api/v1/runs/", {"agent": "keyless", "input": "hello"}, format="json"
    )
    assert response.status_code == 201, response.json()
    return Run.objects.get(id=response.json()["id"])


def _held_by_a_dead_delivery(run: Run) -> Run:
    """The step's delivery took the lease and died without releasing it."""
    lease = lease_acquire(
        run_id=str(run.id),
        step_token=str(run.step_token),
        owner="delivery-that-died",
        worker="celery@gone",
    )
    assert lease is not None
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.lease_owner
    return run


def test_cancel_of_a_run_whose_lease_ran_out_ends_it_at_once(
    keyless_agent, operator_api
):
    run = _held_by_a_dead_delivery(_start(operator_api))
    Run.objects.filter(id=run.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    response = operator_api.post(f"/api/v1/runs/{run.id}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "cancelled")
    assert run.lease_owner == "" and run.step_token is None
    # The dead delivery, were it to come back, finds nothing to do.
    assert (
        run_advance(run_id=str(run.id), step_token="stale", owner="late") == "skipped"
    )


def test_a_cancel_asked_while_a_step_held_the_lease_ends_the_run_at_its_next_step(
    keyless_agent, operator_api
):
    """The lease was live when cancel was asked (the flag waits for the step); the
    holder died; recovery delivers a new step, which must end the run cancelled
    before it builds a model client it cannot build."""
    run = _held_by_a_dead_delivery(_start(operator_api))
    response = operator_api.post(f"/api/v1/runs/{run.id}/cancel/")
    assert response.status_code == 200
    run.refresh_from_db()
    if not run.is_terminal:
        assert run.cancel_requested
        Run.objects.filter(id=run.id).update(
            lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
        )
        assert recover_stalled_runs() == 1
        run.refresh_from_db()
        outcome = run_advance(
            run_id=str(run.id), step_token=str(run.step_token), owner="recovered"
        )
        assert outcome == "finished"
        run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("cancelled", "cancelled")
    assert run.steps == 0
    assert run.lease_owner == ""
