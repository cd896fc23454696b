"""The demo tenant's users get tenant roles only, never the Django admin."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from controlplane.models import AuditEvent, Membership

PASSWORD = "demo-pass-4821"


@pytest.fixture
def demo_password(settings: Any) -> str:
    settings.DEMO_PASSWORD = PASSWORD
    return PASSWORD


def _admin_page_for(username: str, password: str) -> tuple[int, str]:
    """Log in through the site's login form, then ask for /admin/."""
    client = Client()
    login = client.post("/login/", {"username": username, "password": password})
    assert login.status_code == 302, "the demo admin's own login must work"
    reply = client.get("/admin/")
    return reply.status_code, reply.headers.get("Location", "")


def _admin_login(username: str, password: str) -> int:
    """The admin site's own login form: 302 on success, 200 (form again) if refused."""
    reply = Client().post(
        "/admin/login/?next=/admin/", {"username": username, "password": password}
    )
    return reply.status_code


def test_seed_demo_gives_the_tenant_admin_no_django_admin(db, demo_password):
    call_command("seed_demo")

    admin = get_user_model().objects.get(username="admin")
    assert (admin.is_staff, admin.is_superuser) == (False, False)
    assert Membership.objects.get(user=admin).role == "admin"
    status, location = _admin_page_for("admin", PASSWORD)
    assert status == 302 and location.startswith("/admin/login/")
    assert _admin_login("admin", PASSWORD) == 200  # refused: the form again
    for name in ("operator", "viewer"):
        user = get_user_model().objects.get(username=name)
        assert (user.is_staff, user.is_superuser) == (False, False)


def test_reseeding_an_old_database_takes_the_superuser_flags_away(db, demo_password):
    get_user_model().objects.create_superuser(username="admin", password=PASSWORD)

    call_command("seed_demo")

    admin = get_user_model().objects.get(username="admin")
    assert (admin.is_staff, admin.is_superuser) == (False, False)
    assert _admin_login("admin", PASSWORD) == 200
    revoke = AuditEvent.objects.get(action="user.staff_revoke")
    assert revoke.object_id == str(admin.pk)
    assert revoke.before == {"is_staff": True, "is_superuser": True}
    # The password is DEMO_PASSWORD's; nothing else about the login changed.
    assert admin.check_password(PASSWORD)


def test_createsuperuser_is_still_the_way_into_the_django_admin(db, demo_password):
    call_command("seed_demo")
    get_user_model().objects.create_superuser(username="root", password="r00t-pw-x")

    call_command("seed_demo")  # a re-seed leaves other users alone

    assert get_user_model().objects.get(username="root").is_superuser
    assert _admin_login("root", "r00t-pw-x") == 302
