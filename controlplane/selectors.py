"""Reads for tenants, memberships and tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet

from controlplane.models import ApiToken, AuditEvent, Membership, Secret, Tenant
from controlplane.services import TOKEN_PREFIX, token_sha256


def api_token_by_secret_any(*, secret: str) -> ApiToken | None:
    """The token a presented secret names, revoked or not (None: unknown or
    malformed). Only controlplane.authentication asks, and decides if it lives."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    return (
        ApiToken.objects.select_related("tenant", "user")
        .filter(token_sha256=token_sha256(secret))
        .first()
    )


def api_token_live(*, token_id: Any) -> ApiToken | None:
    """The token if it is not revoked and its user is active."""
    return (
        ApiToken.objects.select_related("tenant", "user")
        .filter(id=token_id, revoked_at__isnull=True, user__is_active=True)
        .first()
    )


# A deactivated member belongs to the tenant for nothing: every question of
# who may act where goes through these three, and they see active members only.
def membership_for(*, user: User, tenant: Tenant) -> Membership | None:
    return Membership.objects.filter(
        user=user, tenant=tenant, deactivated_at__isnull=True
    ).first()


def membership_in(*, user: User, tenant_id: Any) -> Membership | None:
    return (
        Membership.objects.filter(
            user=user, tenant_id=tenant_id, deactivated_at__isnull=True
        )
        .select_related("tenant")
        .first()
    )


def memberships_of(*, user: User) -> QuerySet[Membership]:
    return (
        Membership.objects.filter(user=user, deactivated_at__isnull=True)
        .select_related("tenant")
        .order_by("tenant__slug")
    )


def api_tokens_for(*, tenant: Tenant, user: User) -> QuerySet[ApiToken]:
    return (
        ApiToken.objects.filter(tenant=tenant, user=user)
        .select_related("user", "revoked_by")
        .order_by("-created_at")
    )


def api_tokens_of_tenant(*, tenant: Tenant) -> QuerySet[ApiToken]:
    """Every member's tokens in the tenant, revoked ones too (admins see these)."""
    return (
        ApiToken.objects.filter(tenant=tenant)
        .select_related("user", "revoked_by")
        .order_by("-created_at")
    )


def audit_events_for(
    *,
    tenant: Tenant,
    action: str | None = None,
    object_type: str | None = None,
    object_id: str | None = None,
) -> QuerySet[AuditEvent]:
    """The tenant's audit log, newest first, optionally narrowed."""
    events = AuditEvent.objects.filter(tenant=tenant)
    if action:
        events = events.filter(action=action)
    if object_type:
        events = events.filter(object_type=object_type)
    if object_id:
        events = events.filter(object_id=object_id)
    return events.select_related("actor").order_by("-created_at", "-id")


def secret_list_for(*, tenant: Tenant) -> QuerySet[Secret]:
    """The tenant's secrets by name, with who set them; the API shows these
    fields and never the ciphertext (the value is write-only)."""
    return (
        Secret.objects.filter(tenant=tenant)
        .select_related("created_by", "updated_by")
        .defer("ciphertext")
        .order_by("name")
    )
