"""Per-end-user limits (docs/budgets.md): each end user's runs are held to the
tenant's `limits.end_user` on the same reservations as the tenant's limits; an
end user over a limit stops, another end user of the tenant runs on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from budgets.models import BudgetLedgerEntry, EndUserBudgetCounter
from runs.models import Run, Step
from runs.services import run_start
from tests.budgets.conftest import counter_sums
from tests.conftest import start_worker
from tracing.models import RunEvent

pytestmark = pytest.mark.usefixtures("small_reservations")

# Each model call reserves about $0.2 (100 output tokens and the input) and
# spends 10 * 0.001 + 5 * 0.002 = $0.02.
LOOP = [
    {"tool_calls": [{"id": f"e{i}", "name": "echo",
                     "arguments": {"text": f"again {i}"}}],
     "usage": {"input_tokens": 10, "output_tokens": 5}}
    for i in range(20)
] + [{"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5}}]  # fmt: skip
ANSWER = [{"text": "done", "usage": {"input_tokens": 10, "output_tokens": 5}}]


def start(tenant: Any, agent: str, end_user: str) -> Run:
    return run_start(
        tenant=tenant, agent_slug=agent, input="go", started_by=None, end_user=end_user
    )


def refusals(run: Run) -> list[str]:
    return [
        e.payload["dimension"]
        for e in RunEvent.objects.filter(run=run, type="budget.exhausted")
    ]


def wait_settled(run_id: Any, timeout: float = 90) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} still {run.status} after {timeout} s")


@pytest.fixture
def small_reservations_worker(tmp_path: Path, transactional_db: Any) -> Iterator[Any]:
    """A real worker whose model calls reserve 100 output tokens, as here."""
    worker = start_worker(tmp_path, extra_env={"RUN_RESERVE_OUTPUT_TOKENS": "100"})
    yield worker
    worker.stop()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_end_user_over_their_limit_stops_and_another_end_user_runs_on(
    tenant,
    make_budget,
    scripted_agent,
    scripted_price,
    operator_user,
    api_client_for,
    small_reservations_worker,
):
    make_budget(tenant, end_user_limits={"day": {"cost": "1"}})
    scripted_agent(LOOP, ["echo"], slug="looper")
    scripted_agent(ANSWER, [], slug="short")
    api = api_client_for(operator_user, tenant)

    def run_of(agent: str, end_user: str) -> Run:
        body = {"agent": agent, "input": "go", "end_user": end_user}
        created = api.post("/api/v1/runs/", body, format="json")
        assert created.status_code == 201, created.content
        return wait_settled(created.json()["id"])

    a = run_of("looper", "c-8812")
    assert a.status == Run.Status.BUDGET_EXHAUSTED
    assert a.stop_reason == "end_user_cost_per_day"
    assert (
        "end user 'c-8812'" in a.stop_detail
        and "limit of cost per day is 1" in a.stop_detail
    )
    assert refusals(a) == ["end_user_cost_per_day"]
    # The refused call was never made: one step per settled reservation.
    steps = Step.objects.filter(run=a).count()
    assert 0 < steps < 20
    settled = BudgetLedgerEntry.objects.filter(
        run_id=a.id, kind="model_call", status="settled"
    )
    assert settled.count() == steps
    [day] = EndUserBudgetCounter.objects.filter(end_user="c-8812", period="day")
    assert day.reserved_cost == 0 and day.used_cost == a.cost

    b = run_of("short", "c-1234")
    assert b.status == Run.Status.UNVERIFIED, b.stop_detail
    assert b.final_answer == "done"
    [b_day] = EndUserBudgetCounter.objects.filter(end_user="c-1234", period="day")
    assert b_day.used_cost == b.cost  # B's own counter: A's use is not on it
    assert counter_sums("day").reserved_cost == 0  # nothing left held anywhere


@pytest.mark.django_db
def test_runs_per_period_per_end_user_refuse_the_start_and_hold_nothing(
    tenant, make_budget, scripted_agent, scripted_price, drive_run
):
    make_budget(tenant, end_user_limits={"day": {"runs": 1}})
    scripted_agent(ANSWER, [])
    first = drive_run(start(tenant, "scripted", "c-8812"))
    assert first.status == Run.Status.UNVERIFIED
    refused = start(tenant, "scripted", "c-8812")
    assert refused.status == Run.Status.BUDGET_EXHAUSTED
    assert refused.stop_reason == "end_user_runs_per_day"
    assert not BudgetLedgerEntry.objects.filter(run_id=refused.id).exists()
    assert counter_sums("day").used_runs == 1  # the tenant's count rolled back
    other = drive_run(start(tenant, "scripted", "c-1234"))
    assert other.status == Run.Status.UNVERIFIED
    assert counter_sums("day").used_runs == 2


@pytest.mark.django_db
def test_a_tenant_with_per_user_limits_refuses_a_run_without_an_end_user(
    tenant, make_budget, scripted_agent, operator_user, api_client_for
):
    make_budget(tenant, end_user_limits={"month": {"output_tokens": 1000}})
    scripted_agent(ANSWER, [])
    api = api_client_for(operator_user, tenant)
    body = {"agent": "scripted", "input": "go"}
    response = api.post("/api/v1/runs/", body, format="json")
    assert response.status_code == 400
    [message] = response.json()["error"]["fields"]["end_user"]
    assert "limits spend per end user" in message
    assert not Run.objects.exists()
    assert not BudgetLedgerEntry.objects.exists()


@pytest.mark.django_db
def test_per_user_limits_are_set_and_read_through_the_budget_api(
    tenant, admin_user, viewer_user, api_client_for
):
    admin = api_client_for(admin_user, tenant)
    body = {"limits": {"end_user": {"day": {"cost": "2.5", "runs": 10}}}}
    saved = admin.put("/api/v1/budget/", body, format="json")
    assert saved.status_code == 200, saved.content
    limits = saved.json()["limits"]["end_user"]
    assert limits["day"] == {
        "input_tokens": None, "output_tokens": None, "cost": "2.5", "runs": 10,
    }  # fmt: skip
    assert limits["month"]["cost"] is None
    viewer = api_client_for(viewer_user, tenant)
    use = viewer.get("/api/v1/end-users/c-8812/budget/").json()
    assert use["limits"]["day"]["cost"] == "2.5"
    assert use["usage"]["day"]["cost"] == {"used": "0", "reserved": "0"}

    bad = {"limits": {"end_user": {"day": {"cost": -1}}}}
    refused = admin.put("/api/v1/budget/", bad, format="json")
    assert refused.status_code == 400
    assert "limits.end_user.day.cost" in refused.json()["error"]["fields"]
    assert admin.get("/api/v1/budget/").json()["limits"]["end_user"]["day"]["cost"] == (
        "2.5"
    )
    cleared = admin.put(
        "/api/v1/budget/", {"limits": {"end_user": None}}, format="json"
    )
    assert cleared.json()["limits"]["end_user"]["day"]["cost"] is None


@pytest.mark.django_db
def test_a_refusal_by_the_end_users_limit_gives_the_tenants_reservation_back(
    tenant, make_budget, scripted_agent, scripted_price, drive_run
):
    make_budget(
        tenant,
        period_limits={"day": {"cost": "100"}},
        end_user_limits={"day": {"cost": "0.01"}},
    )
    scripted_agent(ANSWER, [])
    run = drive_run(start(tenant, "scripted", "c-8812"))
    assert run.stop_reason == "end_user_cost_per_day"
    sums = counter_sums("day")
    assert sums.reserved_cost == 0 and sums.used_cost == 0
    assert Decimal(
        EndUserBudgetCounter.objects.get(period="day").reserved_cost
    ) == Decimal(0)
    assert not BudgetLedgerEntry.objects.filter(kind="model_call").exists()
