"""Writes for tenants, memberships, API tokens and the audit log."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from controlplane.models import ApiToken, AuditEvent, Membership, Role, Tenant

TOKEN_PREFIX = "cp_"


def token_sha256(secret: str) -> str:
    # Tokens carry 256 bits of randomness, so a plain hash is enough (no KDF needed).
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str


def audit_record(
    *,
    tenant: Tenant | None,
    actor: User | None,
    action: str,
    object_type: str,
    object_id: str,
    before: Any = None,
    after: Any = None,
    remote_addr: str | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type=object_type,
        object_id=object_id,
        before=before,
        after=after,
        remote_addr=remote_addr,
    )


@transaction.atomic
def tenant_create(*, slug: str, name: str) -> Tenant:
    return Tenant.objects.create(slug=slug, name=name)


@transaction.atomic
def membership_set(*, tenant: Tenant, user: User, role: Role | str) -> Membership:
    membership, _ = Membership.objects.update_or_create(
        tenant=tenant, user=user, defaults={"role": Role(role)}
    )
    return membership


@transaction.atomic
def membership_remove(*, tenant: Tenant, user: User, actor: User | None) -> bool:
    """Take the user out of the tenant and revoke their tokens there (a later
    re-invitation does not bring old tokens back). Open streams end at their
    next check (controlplane.authentication). False if they were no member."""
    membership = (
        Membership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    )
    if membership is None:
        return False
    membership.delete()
    revoked = ApiToken.objects.filter(
        tenant=tenant, user=user, revoked_at__isnull=True
    ).update(revoked_at=timezone.now(), revoked_by=actor)
    audit_record(
        tenant=tenant,
        actor=actor,
        action="membership.remove",
        object_type="membership",
        object_id=str(user.pk),
        before={"username": user.get_username(), "role": membership.role},
        after={"tokens_revoked": revoked},
    )
    return True


@transaction.atomic
def api_token_issue(
    *,
    tenant: Tenant,
    user: User,
    name: str = "",
    actor: User | None = None,
    remote_addr: str | None = None,
) -> IssuedToken:
    """Create a token for `user` (by `actor`, default the user); the secret is
    returned once and only its hash is stored."""
    if not Membership.objects.filter(
        tenant=tenant, user=user, deactivated_at__isnull=True
    ).exists():
        raise PermissionError(
            f"{user} is not a member of {tenant.slug} (or is deactivated there)"
        )
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        tenant=tenant,
        user=user,
        name=name,
        prefix=secret[:10],
        token_sha256=token_sha256(secret),
    )
    audit_record(
        tenant=tenant,
        actor=actor or user,
        action="api_token.issue",
        object_type="api_token",
        object_id=str(token.id),
        after={
            "name": name,
            "prefix": token.prefix,
            "owner": user.get_username(),
        },
        remote_addr=remote_addr,
    )
    return IssuedToken(token=token, secret=secret)


@transaction.atomic
def api_token_revoke(
    *, token: ApiToken, actor: User, remote_addr: str | None = None
) -> ApiToken:
    """Revoke at once (the next request with it is refused); a second revoke
    changes nothing and is not audited again."""
    updated = ApiToken.objects.filter(id=token.id, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=actor
    )
    token.refresh_from_db()
    if updated:
        audit_record(
            tenant=token.tenant,
            actor=actor,
            action="api_token.revoke",
            object_type="api_token",
            object_id=str(token.id),
            after={
                "name": token.name,
                "prefix": token.prefix,
                "owner": token.user.get_username(),
            },
            remote_addr=remote_addr,
        )
    return token


def api_token_touch(*, token: ApiToken) -> None:
    # At most one write a minute per token: the hot path of every API call.
    now = timezone.now()
    if token.last_used_at and (now - token.last_used_at).total_seconds() < 60:
        return
    ApiToken.objects.filter(id=token.id).update(last_used_at=now)
    token.last_used_at = now
