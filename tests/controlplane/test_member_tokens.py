"""API tokens as admins and members manage them: an admin sees, issues and
revokes every member's; a member their own; a revoked token fails at once."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from controlplane.models import ApiToken, AuditEvent, Membership
from controlplane.services import api_token_issue


def _bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _member_id(user: Any, tenant: Any) -> int:
    return Membership.objects.get(user=user, tenant=tenant).id


def test_admin_lists_every_members_tokens_and_a_member_only_their_own(
    tenant, other_tenant, admin_user, operator_user, make_member, api_client_for
):
    theirs = api_token_issue(tenant=tenant, user=operator_user, name="oscar-ci")
    stranger = make_member(other_tenant, "sam", "admin")
    api_token_issue(tenant=other_tenant, user=stranger, name="elsewhere")
    admin = api_client_for(admin_user, tenant)
    listed = admin.get("/api/v1/tokens/").json()
    owners = {(row["name"], row["owner"]) for row in listed}
    assert ("oscar-ci", "oscar-operator") in owners
    assert all(row["owner"] != "sam" for row in listed)
    assert theirs.secret not in str(listed)
    assert {"prefix", "created_at", "last_used_at", "revoked_by"} <= set(listed[0])
    mine = api_client_for(operator_user, tenant).get("/api/v1/tokens/").json()
    assert {row["owner"] for row in mine} == {"oscar-operator"}


def test_admin_issues_a_token_for_a_member_and_it_acts_as_that_member(
    tenant, admin_user, viewer_user, api_client_for
):
    admin = api_client_for(admin_user, tenant)
    response = admin.post(
        "/api/v1/tokens/",
        {"name": "vera-bot", "member": _member_id(viewer_user, tenant)},
        format="json",
    )
    assert response.status_code == 201
    body = response.json()
    assert body["owner"] == "vera-viewer"
    me = _bearer(body["token"]).get("/api/v1/me/").json()
    assert (me["username"], me["role"]) == ("vera-viewer", "viewer")
    event = AuditEvent.objects.get(action="api_token.issue", object_id=body["id"])
    assert event.actor == admin_user and event.after["owner"] == "vera-viewer"
    assert body["token"] not in str(event.after)


def test_admin_revokes_a_members_token_and_the_next_request_with_it_fails(
    tenant, admin_user, operator_user, api_client_for
):
    issued = api_token_issue(tenant=tenant, user=operator_user, name="laptop")
    oscar = _bearer(issued.secret)
    assert oscar.get("/api/v1/runs/").status_code == 200
    admin = api_client_for(admin_user, tenant)
    revoked = admin.post(f"/api/v1/tokens/{issued.token.id}/revoke/")
    assert revoked.status_code == 200
    assert revoked.json()["revoked_by"] == "alice-admin"
    assert oscar.get("/api/v1/runs/").status_code == 401
    rows = admin.get("/api/v1/tokens/").json()
    row = next(r for r in rows if r["id"] == str(issued.token.id))
    assert row["revoked_at"] is not None and row["revoked_by"] == "alice-admin"
    event = AuditEvent.objects.get(action="api_token.revoke")
    assert event.actor == admin_user and event.after["owner"] == "oscar-operator"
    # Revoking again changes nothing and is not audited twice.
    assert admin.post(f"/api/v1/tokens/{issued.token.id}/revoke/").status_code == 200
    assert AuditEvent.objects.filter(action="api_token.revoke").count() == 1


def test_a_member_may_not_touch_another_members_tokens(
    tenant, other_tenant, admin_user, operator_user, make_member, api_client_for
):
    admins = api_token_issue(tenant=tenant, user=admin_user, name="admin-ci")
    oscar = api_client_for(operator_user, tenant)
    before = (ApiToken.objects.count(), AuditEvent.objects.count())
    assert oscar.post(f"/api/v1/tokens/{admins.token.id}/revoke/").status_code == 404
    for member in (
        _member_id(admin_user, tenant),
        _member_id(make_member(other_tenant, "sam", "admin"), other_tenant),
        10**9,
    ):
        response = oscar.post("/api/v1/tokens/", {"member": member}, format="json")
        assert response.status_code == 403, member
    assert (ApiToken.objects.count(), AuditEvent.objects.count()) == before
    admins.token.refresh_from_db()
    assert admins.token.revoked_at is None
    assert _bearer(admins.secret).get("/api/v1/me/").status_code == 200


def test_an_admin_naming_a_member_of_another_tenant_gets_400_naming_member(
    tenant, other_tenant, admin_user, make_member, api_client_for
):
    sam = make_member(other_tenant, "sam", "admin")
    admin = api_client_for(admin_user, tenant)
    before = ApiToken.objects.count()
    for member in (_member_id(sam, other_tenant), 10**9, "x", 0):
        response = admin.post("/api/v1/tokens/", {"member": member}, format="json")
        assert response.status_code == 400, member
        assert "member" in response.json()["error"]["fields"]
    assert ApiToken.objects.count() == before


def test_any_member_revokes_their_own_token_and_the_audit_says_who(
    tenant, viewer_user, api_client_for
):
    viewer = api_client_for(viewer_user, tenant)
    created = viewer.post("/api/v1/tokens/", {"name": "mine"}, format="json").json()
    response = viewer.post(f"/api/v1/tokens/{created['id']}/revoke/")
    assert response.json()["revoked_by"] == "vera-viewer"
    assert _bearer(created["token"]).get("/api/v1/me/").status_code == 401
