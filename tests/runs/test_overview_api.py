"""GET /api/v1/overview/ and /api/v1/budget/activity/: the dashboard's and the
budget page's figures, computed by the database over the caller's tenant only,
checked against a seeded history whose figures are known (tests/overview_seed)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from controlplane.models import Role
from tests.overview_seed import EXPECTED, seed_history

pytestmark = pytest.mark.django_db


def _get(client: Any, path: str, **params: str) -> dict[str, Any]:
    response = client.get(path, params)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def _window(start: dt.datetime) -> dict[str, str]:
    return {
        "from": start.isoformat(),
        "to": (start + dt.timedelta(hours=4)).isoformat(),
    }


def test_overview_figures_are_the_seeded_history(
    tenant: Any, other_tenant: Any, operator_user: Any, make_member: Any,
    api_client_for: Any,
) -> None:  # fmt: skip
    seeded = seed_history(tenant, operator_user, with_budget=True)
    # Another tenant's history must not show: same shape, more of it.
    other_user = make_member(other_tenant, "olga-other", Role.OPERATOR)
    seed_history(other_tenant, other_user)
    seed_history(other_tenant, other_user)

    client = api_client_for(operator_user, tenant)
    body = _get(client, "/api/v1/overview/", **_window(seeded["start"]))
    assert body["step"] == "hour"
    assert body["buckets"][:3] == [
        (seeded["start"] + dt.timedelta(hours=h)).isoformat() for h in range(3)
    ]
    runs = body["runs"]
    assert runs["total"] == EXPECTED["total"]
    for hour, counts in enumerate(EXPECTED["by_hour"]):
        for status, series in runs["by_status"].items():
            assert series[hour] == counts.get(status, 0), (hour, status)

    duration = body["duration"]
    assert duration["count"] == 7
    # Percentiles come from a log histogram: within 4.4% of the exact value.
    assert duration["p50_ms"] == pytest.approx(EXPECTED["p50_s"] * 1000, rel=0.044)
    assert duration["p95_ms"] == pytest.approx(EXPECTED["p95_s"] * 1000, rel=0.044)
    for series, expected in (
        ("p50_ms_series", "hour_p50_s"),
        ("p95_ms_series", "hour_p95_s"),
    ):
        assert duration[series][:3] == [
            None if s is None else pytest.approx(s * 1000, rel=0.044)
            for s in EXPECTED[expected]
        ]

    approvals = body["approvals"]
    assert approvals["waiting"] == EXPECTED["waiting"]
    assert approvals["decided"] == EXPECTED["decided"]
    assert approvals["median_decision_ms"] == EXPECTED["median_decision_s"] * 1000
    assert approvals["requested_series"][1] == 4

    agents = body["agents"]
    assert [(a["agent"], round(a["cost"], 6)) for a in agents["by_cost"]] == EXPECTED[
        "agents_by_cost"
    ]
    assert [(a["agent"], a["failed"]) for a in agents["by_failures"]] == EXPECTED[
        "agents_by_failures"
    ]
    tools = body["tools"]
    assert [(t["tool"], t["failed"]) for t in tools["by_failures"]] == EXPECTED[
        "tools_by_failures"
    ]
    assert [(t["tool"], t["cost"]) for t in tools["by_cost"]] == EXPECTED[
        "tools_by_cost"
    ]

    day = body["budgets"]["periods"]["day"]["dimensions"]["cost"]
    assert day["limit"] == "5"
    assert float(day["used"]) == 1.5 and float(day["reserved"]) == 0.2
    assert day["cumulative"][-1] == pytest.approx(1.5)
    assert day["forecast"]["state"] in {"runs_out", "lasts"}


def test_overview_of_an_empty_window_is_zeros(
    tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    body = _get(api_client_for(operator_user, tenant), "/api/v1/overview/")
    assert len(body["buckets"]) in (24, 25)
    assert body["runs"]["total"] == 0
    assert body["duration"]["p50_ms"] is None
    assert body["approvals"]["median_decision_ms"] is None
    assert body["agents"] == {"by_cost": [], "by_failures": []}
    no_limit = body["budgets"]["periods"]["month"]["dimensions"]["cost"]
    assert no_limit["limit"] is None and no_limit["forecast"]["state"] == "no_limit"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01T00:00:00Z"}, "to"),
        ({"from": "2026-02-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"from": "2025-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
        ({"step": "minute"}, "step"),
        ({"from": "2026-01-01T00:00:00Z", "to": "2026-03-01T00:00:00Z",
          "step": "hour"}, "step"),
    ],
)  # fmt: skip
def test_overview_bad_window_is_a_400_naming_the_field(
    tenant: Any, viewer_user: Any, api_client_for: Any, params: dict[str, str],
    field: str,
) -> None:  # fmt: skip
    response = api_client_for(viewer_user, tenant).get("/api/v1/overview/", params)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]


def test_budget_activity_lists_the_ledger_and_extensions_of_this_tenant_only(
    tenant: Any, other_tenant: Any, viewer_user: Any, operator_user: Any,
    make_member: Any, api_client_for: Any,
) -> None:  # fmt: skip
    seeded = seed_history(tenant, operator_user, with_budget=True)
    other_user = make_member(other_tenant, "olga-other", Role.OPERATOR)
    seed_history(other_tenant, other_user, with_budget=True)

    body = _get(api_client_for(viewer_user, tenant), "/api/v1/budget/activity/")
    mine = {str(entry.pk) for entry in seeded["entries"]}
    assert {row["id"] for row in body["ledger"]} == mine
    # (On PostgreSQL one transaction's entries share their timestamp: the
    # order among them is not asserted.)
    (held,) = [row for row in body["ledger"] if row["status"] == "reserved"]
    assert held["actual"] is None and held["reserved"]["cost"] == "0.2"
    settled = [row for row in body["ledger"] if row["status"] == "settled"]
    assert sorted(row["actual"]["cost"] for row in settled) == ["0.25", "0.5", "0.75"]

    extensions = body["extensions"]
    assert extensions["outcomes"]["approved"] == 1
    assert extensions["outcomes"]["denied"] == 1
    denied = next(r for r in extensions["requests"] if r["status"] == "denied")
    assert denied["decided_by"] == "oscar-operator"
    assert denied["reason"] == "enough for today"
    assert denied["extension"]["amount"] == "2.5"
    assert {r["run_id"] for r in extensions["requests"]} <= {
        str(run.pk) for run in seeded["runs"]
    }
    burn = body["burn_down"]
    assert burn["has_budget"] is True
    month = burn["periods"]["month"]
    assert month["step"] == "day"
    assert float(month["dimensions"]["cost"]["used"]) == 1.5


def test_budget_activity_without_a_budget_shows_the_runs_use(
    tenant: Any, viewer_user: Any, operator_user: Any, api_client_for: Any
) -> None:
    seed_history(tenant, operator_user)
    body = _get(api_client_for(viewer_user, tenant), "/api/v1/budget/activity/")
    assert body["ledger"] == []
    month = body["burn_down"]["periods"]["month"]["dimensions"]
    assert body["burn_down"]["has_budget"] is False
    # The month's runs (unless the month began within the last three hours).
    assert float(month["runs"]["used"]) in (9.0, 0.0)
    assert month["runs"]["cumulative"][-1] == float(month["runs"]["used"])
    assert month["cost"]["forecast"]["state"] == "no_limit"


def test_overview_and_activity_need_a_member(tenant: Any, client: Any) -> None:
    assert client.get("/api/v1/overview/").status_code in (401, 403)
    assert client.get("/api/v1/budget/activity/").status_code in (401, 403)
