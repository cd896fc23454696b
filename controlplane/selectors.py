"""Reads for tenants, memberships and tokens."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet

from controlplane.models import ApiToken, AuditEvent, Membership, Tenant
from controlplane.services import TOKEN_PREFIX, token_sha256


def api_token_by_secret(*, secret: str) -> ApiToken | None:
    """The live token for a presented secret, or None (unknown, revoked, malformed)."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        return None
    return (
        ApiToken.objects.select_related("tenant", "user")
        .filter(token_sha256=token_sha256(secret), revoked_at__isnull=True)
        .first()
    )


def membership_for(*, user: User, tenant: Tenant) -> Membership | None:
    return Membership.objects.filter(user=user, tenant=tenant).first()


def memberships_of(*, user: User) -> QuerySet[Membership]:
    return (
        Membership.objects.filter(user=user)
        .select_related("tenant")
        .order_by("tenant__slug")
    )


def api_tokens_for(*, tenant: Tenant, user: User) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(tenant=tenant, user=user).order_by("-created_at")


def audit_events_for(*, tenant: Tenant) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant).select_related("actor")
