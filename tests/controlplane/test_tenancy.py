from __future__ import annotations

from django.test import Client
from rest_framework.test import APIClient

from controlplane.tenancy import tenant_context_for


def test_anonymous_api_call_is_401(db):
    response = APIClient().get("/api/v1/me/")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["code"] == "not_authenticated"


def test_session_user_in_two_tenants_picks_one_by_header(
    tenant, other_tenant, make_member
):
    from controlplane.services import membership_set

    user = make_member(tenant, "multi", "viewer")
    membership_set(tenant=other_tenant, user=user, role="admin")
    client = APIClient()
    client.force_authenticate(user=user)
    assert client.get("/api/v1/me/").json()["tenant"] == "kettlecraft"
    other = client.get("/api/v1/me/", HTTP_X_TENANT="otherco").json()
    assert (other["tenant"], other["role"]) == ("otherco", "admin")
    assert len(other["tenants"]) == 2


def test_header_naming_a_tenant_the_user_is_not_in_is_403(operator_user, other_tenant):
    client = APIClient()
    client.force_authenticate(user=operator_user)
    response = client.get("/api/v1/me/", HTTP_X_TENANT="otherco")
    assert response.status_code == 403


def test_token_pins_its_tenant_even_when_another_is_requested(
    tenant, other_tenant, make_member, api_client_for
):
    from controlplane.services import membership_set

    user = make_member(tenant, "multi", "viewer")
    membership_set(tenant=other_tenant, user=user, role="admin")
    client = api_client_for(user, tenant)
    body = client.get("/api/v1/me/", HTTP_X_TENANT="otherco").json()
    assert (body["tenant"], body["role"]) == ("kettlecraft", "viewer")


def test_tenant_context_is_none_for_users_without_membership(db, make_member, tenant):
    from django.contrib.auth import get_user_model

    loner = get_user_model().objects.create_user(username="loner", password="x")
    assert tenant_context_for(user=loner) is None
    assert tenant_context_for(user=None) is None


def test_login_page_logs_in_and_home_shows_the_tenant_and_role(operator_user):
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    assert b'for="id_password"' in page.content
    response = client.post(
        "/login/", {"username": "oscar-operator", "password": "pw-oscar-operator"}
    )
    assert response.status_code == 302
    home = client.get("/")
    assert b"Kettlecraft" in home.content
    assert b"operator" in home.content


def test_wrong_password_stays_on_login_with_an_error(operator_user):
    response = Client().post(
        "/login/", {"username": "oscar-operator", "password": "no"}
    )
    assert response.status_code == 200
    assert b"did not match" in response.content
