"""GET/PUT /api/v1/budget/: admins write (audited), others read, bad input is 400."""

from __future__ import annotations

import pytest

from budgets.models import Budget
from controlplane.models import AuditEvent
from runs.services import run_start
from tests.runs.conftest import drive

URL = "/api/v1/budget/"
GOOD = {
    "period_mode": "rolling",
    "allow_unknown_price": True,
    "limits": {
        "day": {"cost": "5.50", "input_tokens": 100000, "runs": 40},
        "month": {"cost": 100, "output_tokens": 2000000},
        "run": {"max_steps": 20, "max_cost": "1.25", "max_wall_seconds": 300},
        "max_concurrent_runs": 4,
    },
}


def test_without_a_budget_everything_is_unlimited(tenant, viewer_user, api_client_for):
    response = api_client_for(viewer_user, tenant).get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["period_mode"] == "calendar"
    assert body["limits"]["day"] == {
        "input_tokens": None, "output_tokens": None, "cost": None, "runs": None,
    }  # fmt: skip
    assert body["limits"]["run"]["max_steps"] is None
    assert body["limits"]["max_concurrent_runs"] is None
    assert body["usage"]["day"]["cost"] == "0"
    assert body["usage"]["max_concurrent_runs"] == 0


def test_without_a_budget_the_usage_of_the_days_runs_shows(
    demo_agent, viewer_user, api_client_for
):
    """No limit set: no ledger, but the budget page still shows what was used."""
    run = drive(
        run_start(
            tenant=demo_agent.tenant,
            agent_slug=demo_agent.slug,
            input="x",
            started_by=None,
        )
    )
    assert run.input_tokens > 0 and run.output_tokens > 0
    body = api_client_for(viewer_user, demo_agent.tenant).get(URL).json()
    assert body["limits"]["day"]["input_tokens"] is None  # nothing limited
    assert not Budget.objects.filter(tenant=demo_agent.tenant).exists()
    for period in ("day", "month"):
        assert body["usage"][period]["input_tokens"] == str(run.input_tokens)
        assert body["usage"][period]["output_tokens"] == str(run.output_tokens)
        assert body["usage"][period]["runs"] == "1"
        assert body["reserved"][period]["input_tokens"] == "0"


def test_admin_sets_the_budget_and_the_change_is_audited(
    tenant, admin_user, api_client_for
):
    response = api_client_for(admin_user, tenant).put(URL, GOOD, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["period_mode"] == "rolling" and body["allow_unknown_price"] is True
    assert body["limits"]["day"] == {
        "input_tokens": 100000, "output_tokens": None, "cost": "5.50", "runs": 40,
    }  # fmt: skip
    assert body["limits"]["month"]["cost"] == "100"
    assert body["limits"]["run"]["max_cost"] == "1.25"
    assert body["limits"]["run"]["max_wall_seconds"] == 300.0
    assert body["limits"]["max_concurrent_runs"] == 4
    budget = Budget.objects.get(tenant=tenant)
    assert budget.period_limits["day"]["cost"] == "5.50"
    [event] = AuditEvent.objects.filter(action="budget.update")
    assert event.actor == admin_user and event.tenant == tenant
    assert event.before["limits"]["day"]["cost"] is None
    assert event.after["limits"]["day"]["cost"] == "5.50"
    # A partial edit keeps what it does not name; null removes a limit.
    edit = {"limits": {"day": {"cost": None, "runs": 10}}}
    body = api_client_for(admin_user, tenant).put(URL, edit, format="json").json()
    assert body["limits"]["day"]["cost"] is None and body["limits"]["day"]["runs"] == 10
    assert body["limits"]["month"]["cost"] == "100"
    assert AuditEvent.objects.filter(action="budget.update").count() == 2


@pytest.mark.parametrize("role_user", ["operator_user", "viewer_user"])
def test_a_non_admin_edit_is_forbidden_and_changes_nothing(
    tenant, admin_user, role_user, request, api_client_for
):
    api_client_for(admin_user, tenant).put(URL, GOOD, format="json")
    before = Budget.objects.get(tenant=tenant).period_limits
    user = request.getfixturevalue(role_user)
    edit = {"limits": {"day": {"cost": "9999"}}}
    response = api_client_for(user, tenant).put(URL, edit, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert Budget.objects.get(tenant=tenant).period_limits == before
    assert AuditEvent.objects.filter(action="budget.update").count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"limits": {"day": {"cost": -1}}}, "limits.day.cost"),
        ({"limits": {"day": {"cost": "lots"}}}, "limits.day.cost"),
        ({"limits": {"day": {"cost": "NaN"}}}, "limits.day.cost"),
        ({"limits": {"month": {"input_tokens": 1.5}}}, "limits.month.input_tokens"),
        ({"limits": {"day": {"runs": True}}}, "limits.day.runs"),
        ({"limits": {"day": {"tokens": 10}}}, "limits.day.tokens"),
        ({"limits": {"week": {"cost": 1}}}, "limits.week"),
        ({"limits": {"run": {"max_steps": -3}}}, "limits.run.max_steps"),
        ({"limits": {"run": {"max_gpus": 1}}}, "limits.run.max_gpus"),
        ({"limits": {"run": {"max_cost": "abc"}}}, "limits.run.max_cost"),
        (
            {"limits": {"day": {"cost": "1"}, "run": {"max_cost": "2"}}},
            "limits.run.max_cost",
        ),
        ({"limits": {"max_concurrent_runs": 0}}, "limits.max_concurrent_runs"),
        ({"limits": {"max_concurrent_runs": "two"}}, "limits.max_concurrent_runs"),
        ({"limits": []}, "limits"),
        ({"period_mode": "weekly"}, "period_mode"),
        ({"allow_unknown_price": "yes"}, "allow_unknown_price"),
        ({"colour": "red"}, "colour"),
        ({"on_exhausted": "maybe"}, "on_exhausted"),
        ({"on_exhausted": None}, "on_exhausted"),
        ({"extend_by": "lots"}, "extend_by"),
        ({"extend_by": {"runs": 1}}, "extend_by.runs"),
        ({"extend_by": {"tokens": 1}}, "extend_by.tokens"),
        ({"extend_by": {"cost": -1}}, "extend_by.cost"),
        ({"extend_by": {"cost": 0}}, "extend_by.cost"),
        ({"extend_by": {"cost": "Infinity"}}, "extend_by.cost"),
        ({"extend_by": {"max_steps": 1.5}}, "extend_by.max_steps"),
        ({"extend_by": {"max_cost": True}}, "extend_by.max_cost"),
        (
            {"on_exhausted": "ask", "extend_by": {"output_tokens": "many"}},
            "extend_by.output_tokens",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    tenant, admin_user, api_client_for, body, field
):
    client = api_client_for(admin_user, tenant)
    client.put(URL, {"limits": {"day": {"cost": "3"}}}, format="json")
    response = client.put(URL, body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [field]
    budget = Budget.objects.get(tenant=tenant)
    assert budget.period_limits == {"day": {"cost": "3"}}
    assert (budget.on_exhausted, budget.extend_by) == ("stop", {})
    assert AuditEvent.objects.filter(action="budget.update").count() == 1


def test_ask_mode_and_extension_steps_are_set_shown_and_audited(
    tenant, admin_user, viewer_user, api_client_for
):
    body = api_client_for(viewer_user, tenant).get(URL).json()
    assert body["on_exhausted"] == "stop"
    assert body["extend_by"]["cost"] is None and body["extend_by"]["max_steps"] is None
    assert "runs" not in body["extend_by"]  # runs per period are counted at start
    edit = {"on_exhausted": "ask", "extend_by": {"cost": "2.50", "max_steps": 5}}
    response = api_client_for(admin_user, tenant).put(URL, edit, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["on_exhausted"] == "ask"
    assert body["extend_by"]["cost"] == "2.50" and body["extend_by"]["max_steps"] == 5
    assert body["extend_by"]["output_tokens"] is None  # the limit again
    [event] = AuditEvent.objects.filter(action="budget.update")
    assert (event.before["on_exhausted"], event.after["on_exhausted"]) == (
        "stop",
        "ask",
    )
    assert event.after["extend_by"]["cost"] == "2.50"
    # null keeps the default; the whole map is replaced by each edit.
    edit = {"extend_by": {"cost": None, "max_tool_calls": 3}}
    body = api_client_for(admin_user, tenant).put(URL, edit, format="json").json()
    assert body["extend_by"]["cost"] is None and body["extend_by"]["max_steps"] is None
    assert body["extend_by"]["max_tool_calls"] == 3 and body["on_exhausted"] == "ask"


def test_a_non_admin_cannot_switch_to_ask_mode(tenant, operator_user, api_client_for):
    edit = {"on_exhausted": "ask"}
    response = api_client_for(operator_user, tenant).put(URL, edit, format="json")
    assert response.status_code == 403
    assert not Budget.objects.filter(tenant=tenant, on_exhausted="ask").exists()


def test_a_run_cap_above_an_existing_period_limit_is_refused(
    tenant, admin_user, api_client_for
):
    client = api_client_for(admin_user, tenant)
    client.put(URL, {"limits": {"month": {"output_tokens": 500}}}, format="json")
    edit = {"limits": {"run": {"max_output_tokens": 501}}}
    response = client.put(URL, edit, format="json")
    assert response.status_code == 400
    assert "limits.run.max_output_tokens" in response.json()["error"]["fields"]


def test_each_tenant_sees_only_its_own_budget(
    tenant, other_tenant, admin_user, make_member, api_client_for
):
    api_client_for(admin_user, tenant).put(URL, GOOD, format="json")
    other_admin = make_member(other_tenant, "other-admin", "admin")
    body = api_client_for(other_admin, other_tenant).get(URL).json()
    assert body["limits"]["day"]["cost"] is None
    assert not Budget.objects.filter(tenant=other_tenant).exists()


def test_a_run_request_above_the_ceiling_gets_400_and_nothing_starts(
    tenant, admin_user, operator_user, api_client_for, scripted_agent
):
    from runs.models import Run

    scripted_agent([{"text": "done"}], [])
    edit = {"limits": {"run": {"max_steps": 5}}}
    api_client_for(admin_user, tenant).put(URL, edit, format="json")
    response = api_client_for(operator_user, tenant).post(
        "/api/v1/runs/",
        {"agent": "scripted", "input": "go", "limits": {"max_steps": 6}},
        format="json",
    )
    assert response.status_code == 400
    [message] = response.json()["error"]["fields"]["limits"]
    assert "max_steps" in message and "ceiling" in message
    assert not Run.objects.exists()
