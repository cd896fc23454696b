"""The demo tenant `kettlecraft` and its three users, one per role."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.module_loading import import_string

from controlplane import services
from controlplane.models import Role, Tenant

DEMO_TENANT_SLUG = "kettlecraft"
DEMO_USERS = (
    ("admin", Role.ADMIN),
    ("operator", Role.OPERATOR),
    ("viewer", Role.VIEWER),
)


@dataclass(frozen=True)
class DemoLogins:
    tenant: Tenant
    usernames: tuple[str, ...]
    password: str | None  # None: kept from an earlier seed, not known here
    password_generated: bool


@transaction.atomic
def demo_seed_tenant(*, password: str = "", reset_password: bool = False) -> DemoLogins:
    """Create the demo tenant and users; idempotent, never resets a password unasked.

    With no `password`, a new one is generated, but only when a user is created or a
    reset is asked for, so it is printed once and then only the user knows it.
    """
    tenant, _ = Tenant.objects.get_or_create(
        slug=DEMO_TENANT_SLUG, defaults={"name": "Kettlecraft"}
    )
    user_model = get_user_model()
    generated = ""
    chosen: str | None = None
    for username, role in DEMO_USERS:
        user, created = user_model.objects.get_or_create(username=username)
        if created or reset_password or password:
            if password:
                chosen = password
            else:
                generated = generated or secrets.token_urlsafe(12)
                chosen = generated
            user.set_password(chosen)
            user.save()
        # A tenant role never opens the Django admin (it shows every tenant's
        # users, tokens and audit): only `createsuperuser` grants that. A database
        # seeded by an older version, whose demo admin was a superuser, is fixed.
        if user.is_staff or user.is_superuser:
            user_model.objects.filter(pk=user.pk).update(
                is_staff=False, is_superuser=False
            )
            services.audit_record(
                tenant=tenant,
                actor=None,
                action="user.staff_revoke",
                object_type="user",
                object_id=str(user.pk),
                before={"is_staff": user.is_staff, "is_superuser": user.is_superuser},
                after={"is_staff": False, "is_superuser": False},
            )
        services.membership_set(tenant=tenant, user=user, role=role)
    return DemoLogins(
        tenant=tenant,
        usernames=tuple(name for name, _ in DEMO_USERS),
        password=chosen,
        password_generated=bool(generated),
    )


def demo_seed(*, reset_password: bool = False) -> DemoLogins:
    """Seed the demo tenant and every app's demo data (settings.DEMO_SEEDERS)."""
    logins = demo_seed_tenant(
        password=settings.DEMO_PASSWORD, reset_password=reset_password
    )
    for dotted in settings.DEMO_SEEDERS:
        import_string(dotted)(tenant=logins.tenant)
    return logins


class DemoSeedError(RuntimeError):
    """The API refused a request of a seeder; the message says which and why."""


# `python -m runs.devserver --demo`'s default address, for a seed with no
# model server of its own (make run starts one and passes its address).
DEMO_MODEL_URL = "http://127.0.0.1:8011/v1"


def demo_seed_through_api(
    *, tenant: Tenant, model_url: str = DEMO_MODEL_URL, api_url: str = ""
) -> list[str]:
    """Run every app's API seeder (settings.DEMO_API_SEEDERS), which defines demo
    data through the API as the demo admin: over HTTP at `api_url`, or with none
    in-process. Returns what each did; raises `DemoSeedError` when refused."""
    return [
        import_string(dotted)(
            tenant=tenant, model_url=model_url, api_url=api_url
        ).describe()
        for dotted in settings.DEMO_API_SEEDERS
    ]


def describe_logins(logins: DemoLogins) -> str:
    users = ", ".join(logins.usernames)
    if logins.password is None:
        secret = (
            "password unchanged (set DEMO_PASSWORD or run seed_demo --reset-password)"
        )
    elif logins.password_generated:
        secret = f"password {logins.password} (generated; shown only this once)"
    else:
        secret = "password from DEMO_PASSWORD"
    return f"tenant {logins.tenant.slug}: users {users}; {secret}"
