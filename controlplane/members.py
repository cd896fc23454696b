"""A tenant's members: who they are, their roles, deactivation, and adding them
(by email invitation or as a new account, with a one-time password link from
controlplane.password_links).

Every write locks the tenant's row first, so two admins changing members at
once are serialised and "the last active admin" is judged on what is committed
(two admins demoting each other at the same moment cannot leave none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import BaseUserManager, User
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from controlplane.models import Membership, PasswordLink, Role, Tenant
from controlplane.password_links import (
    IssuedPasswordLink,
    password_link_issue,
    password_link_refusal,
)
from controlplane.services import audit_record


class MemberInputError(ValueError):
    """Input the members API refuses (400), naming the field to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class MemberConflict(Exception):
    """A change the tenant's current state forbids (409); `code` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class MemberAdded:
    membership: Membership
    user_created: bool
    link: IssuedPasswordLink | None


def members_of(*, tenant: Tenant) -> QuerySet[Membership]:
    """The tenant's members (deactivated too), with the expiry of each one's
    live password link (None: no link waiting)."""
    pending = (
        PasswordLink.objects.filter(
            tenant=OuterRef("tenant"),
            user=OuterRef("user"),
            used_at__isnull=True,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        .order_by("-expires_at")
        .values("expires_at")[:1]
    )
    return (
        Membership.objects.filter(tenant=tenant)
        .select_related("user")
        .annotate(password_link_expires_at=Subquery(pending))
        .order_by("user__username")
    )


def member_get(*, tenant: Tenant, member_id: Any) -> Membership | None:
    return members_of(tenant=tenant).filter(id=member_id).first()


def _lock_tenant(tenant: Tenant) -> None:
    Tenant.objects.select_for_update().filter(id=tenant.id).first()


def _member_summary(membership: Membership) -> dict[str, Any]:
    return {
        "username": membership.user.get_username(),
        "email": membership.user.email,
        "role": membership.role,
        "active": membership.deactivated_at is None,
    }


def _audit_member_change(
    current: Membership,
    *,
    action: str,
    before: dict[str, Any],
    actor: User | None,
    remote_addr: str | None,
) -> None:
    audit_record(
        tenant=current.tenant,
        actor=actor,
        action=action,
        object_type="membership",
        object_id=str(current.id),
        before=before,
        after=_member_summary(current),
        remote_addr=remote_addr,
    )


@transaction.atomic
def member_invite(
    *,
    tenant: Tenant,
    email: str,
    role: str,
    actor: User,
    remote_addr: str | None = None,
) -> MemberAdded:
    """Add the account with this email to the tenant (creating it, named by the
    email, when there is none), with a password link when it may have one."""
    email = BaseUserManager.normalize_email(email.strip())
    _lock_tenant(tenant)
    found = list(User.objects.filter(email__iexact=email)[:2])
    if len(found) > 1:
        raise MemberInputError(
            "email", "several accounts have this email; add the member by username"
        )
    user_created = not found
    if found:
        user = found[0]
    else:
        if User.objects.filter(username__iexact=email).exists():
            raise MemberInputError("email", "an account of that name exists already")
        user = _account_create(username=email, email=email, field="email")
    added = _member_add(
        tenant=tenant,
        user=user,
        role=role,
        actor=actor,
        remote_addr=remote_addr,
        field="email",
        action="member.invite",
        user_created=user_created,
    )
    return added


@transaction.atomic
def member_create(
    *,
    tenant: Tenant,
    username: str,
    email: str,
    role: str,
    actor: User,
    remote_addr: str | None = None,
) -> MemberAdded:
    """Create a new account in the tenant, with a link to set its password."""
    _lock_tenant(tenant)
    if User.objects.filter(username__iexact=username).exists():
        raise MemberInputError("username", "an account of that name exists already")
    email = BaseUserManager.normalize_email(email.strip()) if email else ""
    user = _account_create(username=username, email=email, field="username")
    return _member_add(
        tenant=tenant,
        user=user,
        role=role,
        actor=actor,
        remote_addr=remote_addr,
        field="username",
        action="member.create",
        user_created=True,
    )


def _account_create(*, username: str, email: str, field: str) -> User:
    """A new account with no password yet. Another tenant's admin may create the
    same name at the same moment (the tenant lock does not cover that): the
    loser gets a 400, not a 500."""
    try:
        with transaction.atomic():
            return User.objects.create_user(
                username=username, email=email, password=None
            )
    except IntegrityError:
        raise MemberInputError(
            field, "an account of that name was created just now; try again"
        ) from None


def _member_add(
    *,
    tenant: Tenant,
    user: User,
    role: str,
    actor: User,
    remote_addr: str | None,
    field: str,
    action: str,
    user_created: bool,
) -> MemberAdded:
    existing = Membership.objects.filter(tenant=tenant, user=user).first()
    if existing is not None:
        if existing.deactivated_at is not None:
            raise MemberInputError(
                field, "a deactivated member of this tenant: reactivate them instead"
            )
        raise MemberInputError(field, "already a member of this tenant")
    membership = Membership.objects.create(tenant=tenant, user=user, role=Role(role))
    link = None
    if password_link_refusal(user, tenant) is None:
        link = password_link_issue(
            tenant=tenant, user=user, actor=actor, remote_addr=remote_addr
        )
    audit_record(
        tenant=tenant,
        actor=actor,
        action=action,
        object_type="membership",
        object_id=str(membership.id),
        after={
            **_member_summary(membership),
            "account_created": user_created,
            "password_link": link is not None,
        },
        remote_addr=remote_addr,
    )
    return MemberAdded(membership=membership, user_created=user_created, link=link)


def _refuse_if_last_admin(membership: Membership, doing: str) -> None:
    if membership.role != Role.ADMIN or membership.deactivated_at is not None:
        return
    others = Membership.objects.filter(
        tenant_id=membership.tenant_id,
        role=Role.ADMIN,
        deactivated_at__isnull=True,
        user__is_active=True,
    ).exclude(id=membership.id)
    if not others.exists():
        raise MemberConflict(
            "last_admin",
            f"{membership.user.get_username()} is the tenant's last active admin: "
            f"make another member admin before you {doing}",
        )


def _locked(membership: Membership) -> Membership:
    _lock_tenant(membership.tenant)
    return Membership.objects.select_related("user", "tenant").get(id=membership.id)


@transaction.atomic
def member_role_set(
    *,
    membership: Membership,
    role: str,
    actor: User,
    remote_addr: str | None = None,
) -> Membership:
    """Give the member another role; the last active admin keeps theirs (409)."""
    current = _locked(membership)
    if current.role == role:
        return current
    if role != Role.ADMIN:
        _refuse_if_last_admin(current, "change their role")
    before = _member_summary(current)
    current.role = Role(role)
    current.save(update_fields=["role"])
    _audit_member_change(
        current,
        action="member.role",
        before=before,
        actor=actor,
        remote_addr=remote_addr,
    )
    return current


@transaction.atomic
def member_deactivate(
    *, membership: Membership, actor: User | None, remote_addr: str | None = None
) -> Membership:
    """The member can no longer log in to, call or watch the tenant (their open
    streams close at the next check); their waiting password link dies."""
    current = _locked(membership)
    if current.deactivated_at is not None:
        return current
    _refuse_if_last_admin(current, "deactivate them")
    before = _member_summary(current)
    now = timezone.now()
    current.deactivated_at = now
    current.save(update_fields=["deactivated_at"])
    PasswordLink.objects.filter(
        tenant=current.tenant,
        user=current.user,
        used_at__isnull=True,
        revoked_at__isnull=True,
    ).update(revoked_at=now)
    _audit_member_change(
        current,
        action="member.deactivate",
        before=before,
        actor=actor,
        remote_addr=remote_addr,
    )
    return current


@transaction.atomic
def member_reactivate(
    *, membership: Membership, actor: User, remote_addr: str | None = None
) -> Membership:
    current = _locked(membership)
    if current.deactivated_at is None:
        return current
    before = _member_summary(current)
    current.deactivated_at = None
    current.save(update_fields=["deactivated_at"])
    _audit_member_change(
        current,
        action="member.reactivate",
        before=before,
        actor=actor,
        remote_addr=remote_addr,
    )
    return current


@transaction.atomic
def password_link_reissue(
    *, membership: Membership, actor: User, remote_addr: str | None = None
) -> IssuedPasswordLink:
    """A new link for a member who has not set a password (the old one dies)."""
    current = _locked(membership)
    if current.deactivated_at is not None:
        raise MemberConflict("deactivated", "the member is deactivated")
    problem = password_link_refusal(current.user, current.tenant)
    if problem is not None:
        raise MemberConflict("password_link_refused", problem)
    return password_link_issue(
        tenant=current.tenant, user=current.user, actor=actor, remote_addr=remote_addr
    )
