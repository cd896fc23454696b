"""External agents reserve, settle and release spend over HTTP
(/api/v1/budget/reservations/), against the same period limits native runs use;
over the budget is a 409 naming the dimension with nothing written; expired
reservations are released by beat's task; everything is tenant-scoped."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from budgets.models import Budget, BudgetCounter, BudgetLedgerEntry
from budgets.tasks import expire_budget_reservations_task
from controlplane.models import AuditEvent
from runs.models import Agent, Run
from tests.budgets.conftest import counter_sums

URL = "/api/v1/budget/reservations/"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER_TRACE = "00f067aa0ba902b7a3ce929d0e0e4736"


@pytest.fixture
def budget(tenant: Any) -> Budget:
    return Budget.objects.create(
        tenant=tenant,
        period_limits={
            "day": {"cost": "1.00", "output_tokens": 10_000},
            "month": {"cost": "20"},
        },
    )


@pytest.fixture
def operator(tenant: Any, operator_user: Any, api_client_for: Any) -> Any:
    return api_client_for(operator_user, tenant)


def reserve(client: Any, **body: Any) -> Any:
    payload = {"trace_id": TRACE, "amounts": {"cost": "0.40"}, **body}
    return client.post(URL, payload, format="json")


def nothing_written() -> None:
    assert not BudgetLedgerEntry.objects.exists()
    assert not Run.objects.exists()
    assert not Agent.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="budget.").exists()


def test_a_reservation_holds_spend_for_the_traces_external_run(budget, operator):
    response = reserve(operator, amounts={"cost": "0.40", "output_tokens": 500},
                       agent="billing-bot", ttl_seconds=120)  # fmt: skip
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "reserved" and body["trace_id"] == TRACE
    assert body["reserved"] == {"input_tokens": 0, "output_tokens": 500, "cost": "0.40"}
    assert body["actual"] is None
    run = Run.objects.get(id=body["run_id"])
    assert run.trace_id == TRACE and run.stop_reason == "external"
    assert run.agent.name == "External: billing-bot"
    expires = dt.datetime.fromisoformat(body["expires_at"])
    created = dt.datetime.fromisoformat(body["created_at"])
    assert abs(expires - created - dt.timedelta(seconds=120)) < dt.timedelta(seconds=1)
    day = counter_sums("day")
    assert day.reserved_cost == Decimal("0.40") and day.reserved_output_tokens == 500
    [event] = AuditEvent.objects.filter(action="budget.reserve")
    assert event.object_id == body["id"] and event.after["trace_id"] == TRACE
    # The budget page shows it as reserved.
    usage = operator.get("/api/v1/budget/").json()
    assert Decimal(usage["reserved"]["day"]["cost"]) == Decimal("0.40")


def test_settling_moves_the_reservation_to_used_and_onto_the_run(budget, operator):
    entry = reserve(operator, amounts={"cost": "0.40", "output_tokens": 500}).json()
    response = operator.post(
        f"{URL}{entry['id']}/settle/",
        {"actual": {"cost": "0.25", "input_tokens": 300, "output_tokens": 120}},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "settled"
    assert body["actual"] == {"input_tokens": 300, "output_tokens": 120, "cost": "0.25"}
    day = counter_sums("day")
    assert day.reserved_cost == 0 and day.used_cost == Decimal("0.25")
    assert day.used_output_tokens == 120 and day.reserved_output_tokens == 0
    run = Run.objects.get(id=entry["run_id"])
    assert run.cost == Decimal("0.25")
    usage = operator.get("/api/v1/budget/").json()
    assert Decimal(usage["usage"]["day"]["cost"]) == Decimal("0.25")
    assert Decimal(usage["reserved"]["day"]["cost"]) == 0
    # The run page's API shows the spend.
    assert Decimal(operator.get(f"/api/v1/runs/{run.id}/").json()["cost"]) == Decimal(
        "0.25"
    )

    again = operator.post(
        f"{URL}{entry['id']}/settle/", {"actual": {"cost": "0.25"}}, format="json"
    )
    assert again.status_code == 409
    error = again.json()["error"]
    assert error["code"] == "not_open"
    assert error["reservation"]["status"] == "settled"
    assert counter_sums("day").used_cost == Decimal("0.25")  # not counted twice
    assert Run.objects.get(id=run.id).cost == Decimal("0.25")
    assert AuditEvent.objects.filter(action="budget.settle").count() == 1


def test_release_gives_the_reservation_back(budget, operator):
    entry = reserve(operator, amounts={"cost": "0.90"}).json()
    response = operator.post(f"{URL}{entry['id']}/release/")
    assert response.status_code == 200
    assert response.json()["status"] == "released"
    assert counter_sums("day").reserved_cost == 0
    assert counter_sums("day").used_cost == 0
    # The room is back: the same amount can be reserved again.
    assert reserve(operator, amounts={"cost": "0.90"}).status_code == 201
    second = operator.post(f"{URL}{entry['id']}/release/")
    assert second.status_code == 409
    assert second.json()["error"]["reservation"]["status"] == "released"


def test_a_reservation_over_the_budget_is_refused_with_nothing_written(
    budget, operator
):
    response = reserve(operator, amounts={"cost": "1.50"})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "budget_exhausted"
    assert error["dimension"] == "tenant_cost_per_day"
    assert error["period"] == "day" and error["name"] == "cost"
    assert error["limit"] == "1.00" and error["wanted"] == "1.50"
    assert "cost per day" in error["message"]
    nothing_written()
    assert counter_sums("day").reserved_cost == 0


def test_the_last_of_the_budget_is_granted_and_then_refused(budget, operator):
    assert reserve(operator, amounts={"cost": "0.60"}).status_code == 201
    assert reserve(operator, amounts={"cost": "0.40"}).status_code == 201
    refused = reserve(operator, amounts={"cost": "0.000001"})
    assert refused.status_code == 409
    assert refused.json()["error"]["used_or_reserved"] == "1.000000"
    assert BudgetLedgerEntry.objects.count() == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amounts": {"cost": "-1"}}, "amounts.cost"),
        ({"amounts": {"cost": "NaN"}}, "amounts.cost"),
        ({"amounts": {"cost": "1e400"}}, "amounts.cost"),
        ({"amounts": {"output_tokens": 1.5}}, "amounts.output_tokens"),
        ({"amounts": {"output_tokens": True}}, "amounts.output_tokens"),
        ({"amounts": {"tokens": 10}}, "amounts.tokens"),
        ({"amounts": {"runs": 1}}, "amounts.runs"),
        ({"amounts": [1]}, "amounts"),
        ({"trace_id": "XYZ"}, "trace_id"),
        ({"trace_id": "0" * 32}, "trace_id"),
        ({"kind": "run"}, "kind"),
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": 10**9}, "ttl_seconds"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_with_nothing_written(
    budget, operator, body, field
):
    response = reserve(operator, **body)
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    nothing_written()


def test_a_bad_settlement_is_a_400_and_leaves_the_reservation_open(budget, operator):
    entry = reserve(operator).json()
    for actual in ({"cost": "-0.1"}, {"steps": 3}, "0.1"):
        response = operator.post(
            f"{URL}{entry['id']}/settle/", {"actual": actual}, format="json"
        )
        assert response.status_code == 400
    assert BudgetLedgerEntry.objects.get(id=entry["id"]).status == "reserved"
    assert counter_sums("day").used_cost == 0


def test_another_tenants_reservation_is_not_found_and_untouched(
    budget, operator, other_tenant, make_member, api_client_for
):
    entry = reserve(operator).json()
    stranger = api_client_for(
        make_member(other_tenant, "stranger", "admin"), other_tenant
    )
    for path in ("", "settle/", "release/"):
        method = stranger.get if not path else stranger.post
        response = method(f"{URL}{entry['id']}/{path}", {"actual": {}}, format="json")
        assert response.status_code == 404
    assert stranger.get(URL).json()["results"] == []
    assert BudgetLedgerEntry.objects.get(id=entry["id"]).status == "reserved"
    assert counter_sums("day").reserved_cost == Decimal("0.40")


def test_another_tenants_trace_is_refused_with_nothing_written(
    budget, operator, other_tenant, make_member, api_client_for
):
    reserve(operator)
    stranger = api_client_for(
        make_member(other_tenant, "stranger", "operator"), other_tenant
    )
    response = reserve(stranger)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "trace_not_external"
    assert Run.objects.filter(tenant=other_tenant).count() == 0
    assert BudgetLedgerEntry.objects.filter(tenant=other_tenant).count() == 0


def test_a_native_runs_trace_and_its_ledger_are_out_of_reach(
    budget, operator, demo_agent
):
    from runs.services import run_start

    run = run_start(tenant=budget.tenant, agent_slug=demo_agent.slug, input="x",
                    started_by=None)  # fmt: skip
    response = reserve(operator, trace_id=run.trace_id)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "trace_not_external"
    native = BudgetLedgerEntry.objects.create(
        tenant=budget.tenant, run_id=run.id, kind="model_call",
        reserved={"cost": "0.1"}, expires_at=timezone.now(),
    )  # fmt: skip
    assert operator.post(f"{URL}{native.id}/release/").status_code == 404
    assert BudgetLedgerEntry.objects.get(id=native.id).status == "reserved"


def test_a_viewer_reads_but_may_not_reserve(budget, operator, viewer_user,
                                            tenant, api_client_for):  # fmt: skip
    entry = reserve(operator).json()
    viewer = api_client_for(viewer_user, tenant)
    assert reserve(viewer, trace_id=OTHER_TRACE).status_code == 403
    assert viewer.post(f"{URL}{entry['id']}/release/").status_code == 403
    assert viewer.get(f"{URL}{entry['id']}/").json()["status"] == "reserved"
    listed = viewer.get(URL, {"trace_id": TRACE, "status": "reserved"}).json()
    assert [r["id"] for r in listed["results"]] == [entry["id"]]
    assert BudgetLedgerEntry.objects.count() == 1


def test_an_expired_reservation_is_released_by_the_beat_task(budget, operator):
    stale = reserve(operator, amounts={"cost": "0.30"}, ttl_seconds=60).json()
    fresh = reserve(operator, amounts={"cost": "0.20"}, ttl_seconds=600).json()
    BudgetLedgerEntry.objects.filter(id=stale["id"]).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert expire_budget_reservations_task() == 1
    assert BudgetLedgerEntry.objects.get(id=stale["id"]).status == "released"
    assert BudgetLedgerEntry.objects.get(id=fresh["id"]).status == "reserved"
    assert counter_sums("day").reserved_cost == Decimal("0.20")
    [event] = AuditEvent.objects.filter(action="budget.reservation_expired")
    assert event.object_id == stale["id"] and event.actor is None
    late = operator.post(
        f"{URL}{stale['id']}/settle/", {"actual": {"cost": "0.3"}}, format="json"
    )
    assert late.status_code == 409
    assert late.json()["error"]["reservation"]["status"] == "released"
    assert expire_budget_reservations_task() == 0


def test_without_a_budget_reservations_settle_onto_the_run(tenant, operator):
    entry = reserve(operator, amounts={"cost": "50"}).json()
    settled = operator.post(
        f"{URL}{entry['id']}/settle/", {"actual": {"cost": "12.5"}}, format="json"
    )
    assert settled.status_code == 200
    assert Run.objects.get(id=entry["run_id"]).cost == Decimal("12.5")
    assert not BudgetCounter.objects.exists()


def test_a_retried_reservation_with_its_idempotency_key_is_one_reservation(
    budget, operator
):
    first = operator.post(URL, {"trace_id": TRACE, "amounts": {"cost": "0.5"}},
                          format="json", HTTP_IDEMPOTENCY_KEY="k-1")  # fmt: skip
    again = operator.post(URL, {"trace_id": TRACE, "amounts": {"cost": "0.5"}},
                          format="json", HTTP_IDEMPOTENCY_KEY="k-1")  # fmt: skip
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert BudgetLedgerEntry.objects.count() == 1
