"""Who is calling and in which tenant: the one place APIs and consumers ask.

The credentials themselves are checked by controlplane.authentication."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from controlplane import selectors
from controlplane.models import ApiToken, Membership, Role, Tenant

TENANT_HEADER = "HTTP_X_TENANT"
SESSION_TENANT_KEY = "tenant"


@dataclass(frozen=True)
class TenantContext:
    tenant: Tenant
    user: User
    role: str
    token: ApiToken | None = None

    def has_role(self, *roles: str) -> bool:
        return self.role in roles


def tenant_context_for(
    *,
    user: AbstractBaseUser | AnonymousUser | None,
    token: ApiToken | None = None,
    requested_slug: str | None = None,
) -> TenantContext | None:
    """Resolve the caller's tenant; None when the caller belongs to no such tenant.

    A token pins its tenant. A browser session uses the requested tenant (header or
    tenant switcher), else the user's first membership.
    """
    if user is None or not user.is_authenticated:
        return None
    assert isinstance(user, User)
    membership: Membership | None
    if token is not None:
        membership = selectors.membership_for(user=user, tenant=token.tenant)
    elif requested_slug:
        membership = (
            selectors.memberships_of(user=user)
            .filter(tenant__slug=requested_slug)
            .first()
        )
    else:
        membership = selectors.memberships_of(user=user).first()
    if membership is None:
        return None
    return TenantContext(
        tenant=membership.tenant, user=user, role=membership.role, token=token
    )


def request_tenant_context(request: Request) -> TenantContext | None:
    cached = getattr(request, "_tenant_context", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    token = request.auth if isinstance(request.auth, ApiToken) else None
    requested = request.META.get(TENANT_HEADER) or request.session.get(
        SESSION_TENANT_KEY
    )
    context = tenant_context_for(
        user=request.user, token=token, requested_slug=requested
    )
    request._tenant_context = context  # type: ignore[attr-defined]
    return context


def tenant_of(request: Request) -> TenantContext:
    """The caller's tenant context; views behind IsTenantMember always have one."""
    context = request_tenant_context(request)
    if context is None:
        raise PermissionDenied("You are not a member of this tenant.")
    return context


class IsTenantMember(BasePermission):
    message = "You are not a member of this tenant."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        return request_tenant_context(request) is not None


def role_required(*roles: Role) -> type[BasePermission]:
    """A permission class allowing only members with one of `roles`."""
    names = {str(role) for role in roles}

    class HasRole(IsTenantMember):
        message = f"This needs the role {' or '.join(sorted(names))}."

        def has_permission(self, request: Request, view: Any) -> bool:
            if not super().has_permission(request, view):
                return False
            context = request_tenant_context(request)
            return context is not None and context.role in names

    return HasRole
