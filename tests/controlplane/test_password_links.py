"""The accept page of a one-time password link: set a password once, then log
in; a used, expired, replaced or unknown link gets a clear page, not a 500."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from controlplane.members import member_create, member_deactivate
from controlplane.models import AuditEvent, Membership, PasswordLink, Role
from controlplane.redaction import RedactingLogFilter

NEW_PASSWORD = "kettle-4821-brass-lid"


@pytest.fixture
def invited(tenant, admin_user):
    """A new member "nina" and the token of her password link."""
    added = member_create(
        tenant=tenant,
        username="nina",
        email="nina@example.com",
        role=Role.OPERATOR,
        actor=admin_user,
    )
    assert added.link is not None
    return added.membership, added.link.token


def _set(token: str, first: str = NEW_PASSWORD, second: str = NEW_PASSWORD):
    return Client().post(
        f"/accept/{token}/", {"new_password1": first, "new_password2": second}
    )


def _logs_in(username: str, password: str) -> bool:
    response = Client().post("/login/", {"username": username, "password": password})
    return response.status_code == 302


def test_the_link_sets_the_password_once_then_the_member_logs_in(invited):
    membership, token = invited
    page = Client().get(f"/accept/{token}/")
    assert page.status_code == 200
    assert b"Set your password" in page.content and b"nina" in page.content
    done = _set(token)
    assert done.status_code == 200
    assert b"Your password is set" in done.content
    assert _logs_in("nina", NEW_PASSWORD)
    link = PasswordLink.objects.get()
    assert link.used_at is not None
    event = AuditEvent.objects.get(action="password_link.redeem")
    assert event.actor == membership.user
    assert NEW_PASSWORD not in str(list(AuditEvent.objects.values()))
    again = Client().get(f"/accept/{token}/")
    assert again.status_code == 410
    assert b"used already" in again.content
    assert _set(token, "another-pass-99", "another-pass-99").status_code == 410
    assert _logs_in("nina", NEW_PASSWORD)


def test_a_bad_password_is_refused_on_the_page_and_the_link_still_works(invited):
    membership, token = invited
    for first, second in ((NEW_PASSWORD, "different-pass-1"), ("123", "123")):
        response = _set(token, first, second)
        assert response.status_code == 400
        assert b'role="alert"' in response.content
    membership.user.refresh_from_db()
    assert not membership.user.has_usable_password()
    assert PasswordLink.objects.get().used_at is None
    assert _set(token).status_code == 200


def test_expired_unknown_and_deactivated_links_get_a_clear_page(
    invited, admin_user, make_member, tenant
):
    membership, token = invited
    PasswordLink.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    expired = Client().get(f"/accept/{token}/")
    assert expired.status_code == 410 and b"expired" in expired.content
    assert _set(token).status_code == 410
    assert Client().get("/accept/pl_nonsense/").status_code == 404
    assert Client().get("/accept/" + "x" * 500 + "/").status_code == 404

    PasswordLink.objects.update(expires_at=timezone.now() + timedelta(hours=1))
    make_member(tenant, "second-admin", "admin")
    member_deactivate(membership=membership, actor=admin_user)
    dead = Client().get(f"/accept/{token}/")
    assert dead.status_code == 410 and b"no longer works" in dead.content
    membership.user.refresh_from_db()
    assert not membership.user.has_usable_password()
    assert Membership.objects.get(id=membership.id).deactivated_at is not None


def test_a_links_token_is_redacted_from_log_lines(invited):
    """Django logs the path of a 404 or 410 ("Gone: /accept/pl_…/"): the log
    filter hides the token as it hides API tokens."""
    _, token = invited
    record = logging.LogRecord(
        "django.request",
        logging.WARNING,
        __file__,
        1,
        "Gone: %s",
        (f"/accept/{token}/",),
        None,
    )
    RedactingLogFilter().filter(record)
    assert token not in record.getMessage()
    assert "[REDACTED]" in record.getMessage()


def test_an_address_guessing_links_is_locked_out_for_a_while(invited, settings):
    settings.AUTH_LOGIN_FAILURE_LIMIT = 3
    _, token = invited
    client = Client()
    for n in range(3):
        assert client.get(f"/accept/pl_guess{n}/").status_code == 404
    locked = client.get(f"/accept/{token}/")
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) > 0
    assert b"Too many" in locked.content
