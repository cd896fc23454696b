"""The UI's server-rendered shells: who may open which page, and what it renders."""

from __future__ import annotations

from typing import Any

from django.test import Client

from runs.demo import demo_seed_shop
from runs.models import Run
from runs.services import run_start


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_pages_need_a_login(db: Any) -> None:
    paths = ("/runs/", "/approvals/", "/budget/", "/audit/", "/secrets/")
    for path in (*paths, "/mcp-servers/", "/"):
        response = Client().get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")


def test_operator_sees_the_start_form_and_decision_controls_flag(
    tenant: Any, operator_user: Any
) -> None:
    page = _client(operator_user).get("/runs/")
    assert page.status_code == 200
    assert b'id="start-form"' in page.content
    assert b"frontend/runs_page.js" in page.content
    assert b"Audit log" not in page.content  # admins only


def test_viewer_gets_no_start_form_no_cancel_and_no_decisions(
    tenant: Any, viewer_user: Any, operator_user: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    run = run_start(
        tenant=tenant,
        agent_slug="kettlecraft-support",
        input="hi",
        started_by=operator_user,
    )
    client = _client(viewer_user)
    assert b'id="start-form"' not in client.get("/runs/").content
    detail = client.get(f"/runs/{run.id}/")
    assert detail.status_code == 200
    assert b'data-can-decide="0"' in detail.content
    assert b'id="cancel-run"' not in detail.content
    assert b'data-can-decide="0"' in client.get("/approvals/").content
    assert b'data-admin="0"' in client.get("/budget/").content
    assert b'id="budget-form"' not in client.get("/budget/").content


def test_another_tenants_run_page_is_a_404(
    tenant: Any, other_tenant: Any, operator_user: Any, make_member: Any
) -> None:
    demo_seed_shop(tenant=other_tenant)
    stranger = make_member(other_tenant, "sam-stranger", "operator")
    theirs = run_start(
        tenant=other_tenant,
        agent_slug="kettlecraft-support",
        input="hi",
        started_by=stranger,
    )
    client = _client(operator_user)
    assert client.get(f"/runs/{theirs.id}/").status_code == 404
    assert client.get("/runs/not-a-uuid/").status_code == 404
    assert Run.objects.filter(tenant=tenant).count() == 0


def test_audit_log_page_is_for_admins(
    tenant: Any, admin_user: Any, operator_user: Any
) -> None:
    assert _client(operator_user).get("/audit/").status_code == 403
    page = _client(admin_user).get("/audit/")
    assert page.status_code == 200
    assert b"frontend/audit_page.js" in page.content


def test_home_is_the_overview_and_the_tenant_switcher_lists_memberships(
    tenant: Any, other_tenant: Any, operator_user: Any
) -> None:
    from controlplane.services import membership_set

    membership_set(tenant=other_tenant, user=operator_user, role="viewer")
    page = _client(operator_user).get("/")
    assert page.status_code == 200
    assert b"frontend/overview_page.js" in page.content
    assert b'id="runs-table"' not in page.content
    # The nav marks Overview, and only it, as the page shown.
    content = page.content.decode()
    assert 'aria-current="page">Overview</a>' in content
    assert content.count('aria-current="page"') == 1
    assert b'<label for="tenant-select">Tenant</label>' in page.content
    assert b"Other Co (viewer)" in page.content


def test_a_login_without_next_lands_on_the_overview(
    tenant: Any, operator_user: Any
) -> None:
    client = Client()
    response = client.post(
        "/login/", {"username": "oscar-operator", "password": "pw-oscar-operator"}
    )
    assert response.status_code == 302
    assert response["Location"] == "/"
    home = client.get(response["Location"])
    assert home.status_code == 200
    assert b"frontend/overview_page.js" in home.content
    assert b"<title>Overview" in home.content
    # The runs list keeps its own address.
    assert b'id="runs-table"' in client.get("/runs/").content


def test_a_user_without_a_tenant_is_told_so(db: Any) -> None:
    from django.contrib.auth import get_user_model

    loner = get_user_model().objects.create_user(username="loner", password="x")
    page = _client(loner).get("/runs/")
    assert page.status_code == 403
    assert b"not a member of any tenant" in page.content


def test_agents_api_lists_only_the_callers_tenant(
    tenant: Any, other_tenant: Any, operator_user: Any, api_client_for: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    demo_seed_shop(tenant=other_tenant)
    response = api_client_for(operator_user, tenant).get("/api/v1/agents/")
    assert response.status_code == 200
    from runs.models import Agent

    mine = Agent.objects.filter(tenant=tenant)
    assert len(mine) == 7  # the support agent and the demo scripts' variants
    assert {a["id"] for a in response.json()} == {str(a.id) for a in mine}
    assert Client().get("/api/v1/agents/").status_code in (401, 403)


def test_secrets_page_tells_each_role_what_it_may_do_and_never_shows_a_value(
    tenant: Any, admin_user: Any, viewer_user: Any
) -> None:
    from controlplane.secrets import secret_set

    secret_set(tenant=tenant, name="SHOWN_NAME", value="hidden-value-xyz", actor=None)
    admin_page = _client(admin_user).get("/secrets/")
    viewer_page = _client(viewer_user).get("/secrets/")
    for page in (admin_page, viewer_page):
        assert page.status_code == 200
        text = page.content.decode()
        assert '<a href="/secrets/" aria-current="page">Secrets</a>' in text
        assert "Values are write-only: stored encrypted, never shown again." in text
        assert "hidden-value-xyz" not in text
        assert "frontend/secrets_page.js" in text
    admin = admin_page.content.decode()
    assert "You can set and delete secrets." in admin
    assert 'type="password"' in admin and 'autocomplete="new-password"' in admin
    viewer = viewer_page.content.decode()
    assert "Read only: admins set and delete secrets." in viewer
    assert 'id="secret-form"' not in viewer and 'data-admin="0"' in viewer
