"""Members managed by tenant admins through the API: invite, create, role,
deactivate and reactivate, one-time password links; every change audited, the
last active admin kept, other tenants' ids 404, refused changes change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from controlplane.authentication import StreamPrincipal, tenant_context_current
from controlplane.models import AuditEvent, Membership, PasswordLink, Role
from controlplane.password_links import password_link_sha256
from controlplane.permissions import Action
from controlplane.services import api_token_issue, membership_set


def _membership(user: Any, tenant: Any) -> Membership:
    return Membership.objects.get(user=user, tenant=tenant)


def _logs_in(username: str, client: Client | None = None) -> bool:
    """Whether the login form takes the fixtures' password (a redirect home)."""
    client = client or Client()
    response = client.post(
        "/login/", {"username": username, "password": f"pw-{username}"}
    )
    return response.status_code == 302


def _world() -> tuple[int, int, int, int]:
    """Counts a refused request must leave as they were."""
    return (
        User.objects.count(),
        Membership.objects.count(),
        PasswordLink.objects.count(),
        AuditEvent.objects.count(),
    )


def test_admin_invites_by_email_and_the_link_token_is_shown_once_stored_hashed(
    tenant, admin_user, api_client_for
):
    client = api_client_for(admin_user, tenant)
    response = client.post(
        "/api/v1/members/invite/",
        {"email": "Nina@Example.com", "role": "operator"},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["account_created"] is True
    member = body["member"]
    assert member["username"] == "Nina@example.com"
    assert member["role"] == "operator"
    assert member["active"] is True
    assert member["password_set"] is False
    link = body["password_link"]
    assert link["token"].startswith("pl_")
    assert link["url"].endswith(f"/accept/{link['token']}/")
    assert link["emailed"] is False
    stored = PasswordLink.objects.get()
    assert stored.token_sha256 == password_link_sha256(link["token"])
    assert link["token"] not in str(PasswordLink.objects.values().get()) and link[
        "token"
    ] not in str(list(AuditEvent.objects.values()))
    # Listing never shows it again.
    listed = client.get("/api/v1/members/").json()
    assert link["token"] not in str(listed)
    nina = next(m for m in listed if m["username"] == "Nina@example.com")
    assert nina["password_link_expires_at"] is not None
    actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert "member.invite" in actions and "password_link.issue" in actions
    invite = AuditEvent.objects.get(action="member.invite")
    assert invite.actor == admin_user
    assert invite.after["role"] == "operator"


def test_the_invitation_is_emailed_when_a_sender_is_configured(
    tenant,
    admin_user,
    api_client_for,
    settings,
    mailoutbox,
    django_capture_on_commit_callbacks,
):
    settings.PASSWORD_LINK_EMAIL_FROM = "plane@example.com"
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for(admin_user, tenant).post(
            "/api/v1/members/invite/",
            {"email": "mail@example.com", "role": "viewer"},
            format="json",
        )
    link = response.json()["password_link"]
    assert link["emailed"] is True
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == ["mail@example.com"]
    assert link["url"] in mailoutbox[0].body


def test_admin_creates_a_user_with_a_password_link_and_a_taken_name_is_400(
    tenant, admin_user, operator_user, api_client_for
):
    client = api_client_for(admin_user, tenant)
    created = client.post(
        "/api/v1/members/",
        {"username": "carl", "email": "carl@example.com", "role": "viewer"},
        format="json",
    )
    assert created.status_code == 201
    assert created.json()["password_link"]["token"]
    assert User.objects.get(username="carl").has_usable_password() is False
    before = _world()
    taken = client.post(
        "/api/v1/members/",
        {"username": "oscar-operator", "role": "viewer"},
        format="json",
    )
    assert taken.status_code == 400
    assert "username" in taken.json()["error"]["fields"]
    assert _world() == before


INVITE, CREATE = "/api/v1/members/invite/", "/api/v1/members/"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (INVITE, {"email": "x@example.com", "role": "owner"}, "role"),
        (INVITE, {"email": "not-an-email", "role": "viewer"}, "email"),
        (INVITE, {"role": "viewer"}, "email"),
        (CREATE, {"username": "bad name!", "role": "viewer"}, "username"),
        (CREATE, {"username": "ok", "role": ""}, "role"),
        (CREATE, {"username": "ok", "email": "nope", "role": "viewer"}, "email"),
    ],
)
def test_bad_member_input_is_400_naming_the_field_and_writes_nothing(
    tenant, admin_user, api_client_for, path, body, field
):
    client = api_client_for(admin_user, tenant)
    before = _world()
    response = client.post(path, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert _world() == before


def test_inviting_an_existing_account_adds_it_without_a_link_that_could_take_it_over(
    tenant, other_tenant, admin_user, make_member, api_client_for
):
    # Has a password (and belongs to another tenant): just joins.
    sam = make_member(other_tenant, "sam", "admin")
    sam.email = "sam@example.com"
    sam.save()
    # Has no password yet but belongs to another tenant: its own admin's link only.
    pending = User.objects.create_user(username="pat", email="pat@example.com")
    Membership.objects.create(tenant=other_tenant, user=pending, role=Role.VIEWER)
    client = api_client_for(admin_user, tenant)
    for email in ("sam@example.com", "PAT@example.com"):
        response = client.post(
            "/api/v1/members/invite/", {"email": email, "role": "viewer"}, format="json"
        )
        assert response.status_code == 201, response.content
        assert response.json()["account_created"] is False
        assert response.json()["password_link"] is None
    assert PasswordLink.objects.count() == 0
    again = client.post(
        "/api/v1/members/invite/",
        {"email": "sam@example.com", "role": "admin"},
        format="json",
    )
    assert again.status_code == 400
    assert "already a member" in again.json()["error"]["fields"]["email"][0]
    assert _membership(sam, tenant).role == "viewer"


def test_role_change_is_audited_and_the_last_active_admin_is_kept(
    tenant, admin_user, operator_user, api_client_for
):
    client = api_client_for(admin_user, tenant)
    alice = _membership(admin_user, tenant)
    oscar = _membership(operator_user, tenant)
    before = _world()
    for path, body in (
        (f"/api/v1/members/{alice.id}/role/", {"role": "viewer"}),
        (f"/api/v1/members/{alice.id}/deactivate/", None),
    ):
        refused = client.post(path, body, format="json")
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "last_admin"
        assert (
            "alice-admin" in error["message"]
            and "last active admin" in (error["message"])
        )
    alice.refresh_from_db()
    assert (alice.role, alice.deactivated_at) == ("admin", None)
    assert _world() == before

    promoted = client.post(
        f"/api/v1/members/{oscar.id}/role/", {"role": "admin"}, format="json"
    )
    assert promoted.status_code == 200
    assert promoted.json()["role"] == "admin"
    event = AuditEvent.objects.get(action="member.role")
    assert event.before["role"] == "operator" and event.after["role"] == "admin"
    assert event.actor == admin_user
    # Now alice is not the last one.
    demoted = client.post(
        f"/api/v1/members/{alice.id}/role/", {"role": "viewer"}, format="json"
    )
    assert demoted.status_code == 200
    # Her token now carries a viewer: the members API is closed to her.
    assert client.get("/api/v1/members/").status_code == 403


def test_a_deactivated_member_cannot_use_tokens_sessions_or_log_in_until_reactivated(
    tenant, admin_user, operator_user, api_client_for
):
    admin = api_client_for(admin_user, tenant)
    oscar = api_client_for(operator_user, tenant)
    session = Client()
    session.force_login(operator_user)
    assert session.get("/runs/").status_code == 200
    assert oscar.get("/api/v1/me/").status_code == 200
    member = _membership(operator_user, tenant)
    principal = StreamPrincipal(
        user_id=operator_user.id, tenant_id=tenant.id, token_id=None
    )
    assert tenant_context_current(principal=principal, action=Action.STREAM_READ)

    response = admin.post(f"/api/v1/members/{member.id}/deactivate/")
    assert response.status_code == 200
    assert response.json()["active"] is False
    assert oscar.get("/api/v1/me/").status_code == 403
    # Their session ends: they belong to no tenant they may log in to.
    assert session.get("/runs/")["Location"].startswith("/login/")
    assert session.get("/api/v1/runs/").status_code in (401, 403)
    # An open stream stops being authorised at its next check.
    assert (
        tenant_context_current(principal=principal, action=Action.STREAM_READ) is None
    )
    assert not _logs_in("oscar-operator")
    event = AuditEvent.objects.get(action="member.deactivate")
    assert event.after["active"] is False and event.actor == admin_user
    # No token can be issued for them meanwhile.
    issued = admin.post("/api/v1/tokens/", {"member": member.id}, format="json")
    assert issued.status_code == 400 and "member" in issued.json()["error"]["fields"]

    assert admin.post(f"/api/v1/members/{member.id}/reactivate/").status_code == 200
    assert oscar.get("/api/v1/me/").status_code == 200
    assert _logs_in("oscar-operator")
    assert AuditEvent.objects.filter(action="member.reactivate").count() == 1


def test_deactivation_in_one_tenant_leaves_the_others(
    tenant, other_tenant, admin_user, operator_user, api_client_for
):
    membership_set(tenant=other_tenant, user=operator_user, role="viewer")
    elsewhere = api_client_for(operator_user, other_tenant)
    member = _membership(operator_user, tenant)
    admin = api_client_for(admin_user, tenant)
    assert admin.post(f"/api/v1/members/{member.id}/deactivate/").status_code == 200
    assert elsewhere.get("/api/v1/me/").json()["tenant"] == "otherco"
    browser = Client()
    assert _logs_in("oscar-operator", browser)
    me = browser.get("/api/v1/me/").json()
    assert me["tenant"] == "otherco"
    assert [t["slug"] for t in me["tenants"]] == ["otherco"]

    # A session that had chosen the tenant is offered the tenants left.
    chose = Client()
    chose.force_login(operator_user)
    session = chose.session
    session["tenant"] = "kettlecraft"
    session.save()
    page = chose.get("/runs/")
    assert page.status_code == 403
    assert b"no longer an active member" in page.content
    assert b"Other Co (viewer)" in page.content
    assert chose.post("/tenant/switch/", {"tenant": "kettlecraft"}).status_code == 403
    switched = chose.post("/tenant/switch/", {"tenant": "otherco", "next": "/runs/"})
    assert switched.status_code == 302
    assert chose.get("/runs/").status_code == 200


def test_another_tenants_member_ids_are_404_and_nothing_changes(
    tenant, other_tenant, admin_user, make_member, api_client_for
):
    stranger = make_member(other_tenant, "sam-stranger", "operator")
    theirs = _membership(stranger, other_tenant)
    client = api_client_for(admin_user, tenant)
    before = _world()
    assert client.get(f"/api/v1/members/{theirs.id}/").status_code == 404
    for suffix, body in (
        ("role/", {"role": "viewer"}),
        ("deactivate/", None),
        ("reactivate/", None),
        ("password-link/", None),
    ):
        response = client.post(
            f"/api/v1/members/{theirs.id}/{suffix}", body, format="json"
        )
        assert response.status_code == 404, suffix
    assert client.get(f"/api/v1/members/{2**70}/").status_code == 404
    theirs.refresh_from_db()
    assert (theirs.role, theirs.deactivated_at) == ("operator", None)
    assert _world() == before
    assert "sam-stranger" not in str(client.get("/api/v1/members/").json())


def test_operators_and_viewers_may_not_manage_members(
    tenant, admin_user, operator_user, viewer_user, api_client_for
):
    alice = _membership(admin_user, tenant)
    for user in (operator_user, viewer_user):
        client = api_client_for(user, tenant)
        before = _world()
        assert client.get("/api/v1/members/").status_code == 403
        assert client.get(f"/api/v1/members/{alice.id}/").status_code == 403
        invite = {"email": "x@example.com", "role": "admin"}
        assert (
            client.post("/api/v1/members/invite/", invite, format="json").status_code
            == 403
        )
        assert client.post(f"/api/v1/members/{alice.id}/deactivate/").status_code == 403
        assert _world() == before
    alice.refresh_from_db()
    assert alice.deactivated_at is None


def test_a_new_password_link_replaces_the_old_one_and_is_refused_once_a_password_is_set(
    tenant, admin_user, operator_user, api_client_for
):
    client = api_client_for(admin_user, tenant)
    created = client.post(
        "/api/v1/members/", {"username": "dora", "role": "viewer"}, format="json"
    ).json()
    first = created["password_link"]["token"]
    member_id = created["member"]["id"]
    second = client.post(f"/api/v1/members/{member_id}/password-link/")
    assert second.status_code == 201
    assert Client().get(f"/accept/{first}/").status_code == 410
    assert Client().get(f"/accept/{second.json()['token']}/").status_code == 200
    oscar = _membership(operator_user, tenant)
    refused = client.post(f"/api/v1/members/{oscar.id}/password-link/")
    assert refused.status_code == 409
    assert "password already" in refused.json()["error"]["message"]


def test_membership_token_of_a_deactivated_member_is_refused_for_that_tenant_only(
    tenant, admin_user, operator_user
):
    secret = api_token_issue(tenant=tenant, user=operator_user).secret
    member = _membership(operator_user, tenant)
    admin = APIClient()
    admin.force_authenticate(admin_user)
    admin.post(f"/api/v1/members/{member.id}/deactivate/")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/runs/").status_code == 403
