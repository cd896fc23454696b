"""One-time password links (invitations): made by an admin for a member who has
no password yet, used once on the accept page to set it.

Only the SHA-256 of a link's token is stored; the token is shown once, to the
admin. A link dies when used, when it expires (PASSWORD_LINK_HOURS), when a
newer one for the same member replaces it, or when the member is deactivated.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from controlplane.models import Membership, PasswordLink, Tenant
from controlplane.services import audit_record

PASSWORD_LINK_PREFIX = "pl_"


class PasswordLinkDead(Exception):
    """The link cannot be used: `reason` is unknown, used, expired or revoked."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class IssuedPasswordLink:
    link: PasswordLink
    token: str  # shown once, to the admin who made the link


def password_link_sha256(token: str) -> str:
    # 256 random bits, as API tokens: a plain hash is enough.
    return hashlib.sha256(token.encode()).hexdigest()


def password_link_by_token(*, token: str) -> PasswordLink | None:
    if not token.startswith(PASSWORD_LINK_PREFIX) or len(token) > 200:
        return None
    return (
        PasswordLink.objects.select_related("tenant", "user")
        .filter(token_sha256=password_link_sha256(token))
        .first()
    )


def password_link_problem(link: PasswordLink | None) -> str | None:
    """Why the link cannot be used now (unknown, used, expired, revoked), or None."""
    if link is None:
        return "unknown"
    if link.used_at is not None:
        return "used"
    if link.revoked_at is not None:
        return "revoked"
    if link.expires_at <= timezone.now():
        return "expired"
    active = Membership.objects.filter(
        tenant_id=link.tenant_id, user_id=link.user_id, deactivated_at__isnull=True
    ).exists()
    if not active or not link.user.is_active:
        return "revoked"
    return None


# Writes


def password_link_refusal(user: User, tenant: Tenant) -> str | None:
    """Why this tenant's admin may not give `user` a link to set their password.

    A link sets the password of the whole account: only an account that has
    none yet and belongs to no other tenant may get one here, or an admin of
    one tenant could take over a member of another.
    """
    if user.has_usable_password():
        return "the member has set a password already; they log in with it"
    others = Membership.objects.filter(user=user).exclude(tenant=tenant)
    if others.exists():
        return "the account belongs to another tenant too; its own admin invites it"
    return None


def password_link_issue(
    *, tenant: Tenant, user: User, actor: User | None, remote_addr: str | None
) -> IssuedPasswordLink:
    now = timezone.now()
    # A new link replaces the ones before it: only the latest one works.
    PasswordLink.objects.filter(
        tenant=tenant, user=user, used_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=now)
    token = PASSWORD_LINK_PREFIX + secrets.token_urlsafe(32)
    link = PasswordLink.objects.create(
        tenant=tenant,
        user=user,
        created_by=actor,
        token_sha256=password_link_sha256(token),
        expires_at=now + timedelta(hours=settings.PASSWORD_LINK_HOURS),
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        action="password_link.issue",
        object_type="password_link",
        object_id=str(link.id),
        after={
            "username": user.get_username(),
            "expires_at": link.expires_at.isoformat(),
        },
        remote_addr=remote_addr,
    )
    return IssuedPasswordLink(link=link, token=token)


def password_link_send(*, user: User, tenant: Tenant, url: str) -> bool:
    """Email the link when PASSWORD_LINK_EMAIL_FROM is set (the seam for mail;
    False: not sent, the admin passes the link on). Sent after commit."""
    sender = settings.PASSWORD_LINK_EMAIL_FROM
    if not sender or not user.email:
        return False
    subject = f"Your account in {tenant.name}"
    body = (
        f"You were invited to {tenant.name} on the agent control plane.\n"
        f"Set your password (the link works once) at:\n{url}\n"
    )
    transaction.on_commit(
        lambda: send_mail(subject, body, sender, [user.email], fail_silently=True)
    )
    return True


@transaction.atomic
def password_link_redeem(
    *, token: str, password: str, remote_addr: str | None = None
) -> User:
    """Set the password through the link, once: a second use, an expired or a
    replaced link raises PasswordLinkDead and changes nothing. The password
    was validated by the caller (the accept page's SetPasswordForm)."""
    found = password_link_by_token(token=token)
    link = (
        PasswordLink.objects.select_for_update(of=("self",))
        .select_related("tenant", "user")
        .filter(id=found.id)
        .first()
        if found is not None
        else None
    )
    problem = password_link_problem(link)
    if problem is not None:
        raise PasswordLinkDead(problem)
    assert link is not None
    now = timezone.now()
    link.used_at = now
    link.save(update_fields=["used_at"])
    user = link.user
    user.set_password(password)
    user.save(update_fields=["password"])
    # With a password set, no other link of theirs may set it again.
    PasswordLink.objects.filter(
        user=user, used_at__isnull=True, revoked_at__isnull=True
    ).update(revoked_at=now)
    audit_record(
        tenant=link.tenant,
        actor=user,
        action="password_link.redeem",
        object_type="password_link",
        object_id=str(link.id),
        after={"username": user.get_username()},
        remote_addr=remote_addr,
    )
    return user
