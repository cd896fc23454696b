from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from controlplane.models import ApiToken, AuditEvent, Membership
from controlplane.services import api_token_issue, api_token_revoke, token_sha256


def test_issue_token_command_prints_a_token_that_authenticates(operator_user, tenant):
    out = StringIO()
    call_command("issue_token", tenant="kettlecraft", user="oscar-operator", stdout=out)
    secret = out.getvalue().strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = client.get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["tenant"] == "kettlecraft"
    assert response.json()["role"] == "operator"
    assert response.json()["auth"] == "token"


def test_tokens_are_stored_hashed_and_record_last_use(operator_user, tenant):
    issued = api_token_issue(tenant=tenant, user=operator_user)
    row = ApiToken.objects.get(id=issued.token.id)
    assert row.token_sha256 == token_sha256(issued.secret)
    assert issued.secret not in {row.token_sha256, row.prefix, row.name}
    assert row.last_used_at is None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    assert client.get("/api/v1/me/").status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_issue_token_command_refuses_unknown_tenant_user_and_non_members(
    operator_user, tenant, other_tenant
):
    with pytest.raises(CommandError, match="No tenant"):
        call_command("issue_token", tenant="nope", user="oscar-operator")
    with pytest.raises(CommandError, match="No user"):
        call_command("issue_token", tenant="kettlecraft", user="nobody")
    with pytest.raises(CommandError, match="not a member"):
        call_command("issue_token", tenant="otherco", user="oscar-operator")
    assert ApiToken.objects.count() == 0


@pytest.mark.parametrize(
    "header",
    ["Bearer cp_unknown", "Bearer nonsense", "Bearer", "Bearer a b"],
)
def test_unknown_or_malformed_token_gets_401_json(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    body = response.json()
    assert body["error"]["code"] == "authentication_failed"
    assert body["error"]["message"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_revoked_token_gets_401_and_revocation_is_audited(operator_user, tenant):
    issued = api_token_issue(tenant=tenant, user=operator_user)
    api_token_revoke(token=issued.token, actor=operator_user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]
    assert AuditEvent.objects.filter(
        action="api_token.revoke", object_id=str(issued.token.id)
    ).exists()


def test_token_of_a_user_no_longer_member_gets_403(operator_user, tenant):
    issued = api_token_issue(tenant=tenant, user=operator_user)
    Membership.objects.filter(user=operator_user).delete()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    response = client.get("/api/v1/me/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_token_api_issues_once_lists_and_revokes_within_the_callers_tenant(
    operator_user, tenant, api_client_for
):
    client = api_client_for(operator_user, tenant)
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert created.status_code == 201
    secret = created.json()["token"]
    listed = client.get("/api/v1/tokens/").json()
    assert all("token" not in row for row in listed)
    assert {row["name"] for row in listed} >= {"ci"}
    revoked = client.post(f"/api/v1/tokens/{created.json()['id']}/revoke/")
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert other.get("/api/v1/me/").status_code == 401


def test_revoking_another_tenants_token_is_404_and_changes_nothing(
    operator_user, tenant, other_tenant, make_member, api_client_for
):
    stranger = make_member(other_tenant, "sam-stranger", "admin")
    foreign = api_token_issue(tenant=other_tenant, user=stranger)
    client = api_client_for(operator_user, tenant)
    response = client.post(f"/api/v1/tokens/{foreign.token.id}/revoke/")
    assert response.status_code == 404
    foreign.token.refresh_from_db()
    assert foreign.token.revoked_at is None


def test_token_name_too_long_is_400_and_nothing_is_written(
    operator_user, tenant, api_client_for
):
    client = api_client_for(operator_user, tenant)
    before = ApiToken.objects.count()
    response = client.post("/api/v1/tokens/", {"name": "x" * 101}, format="json")
    assert response.status_code == 400
    assert "name" in response.json()["error"]["fields"]
    assert ApiToken.objects.count() == before
