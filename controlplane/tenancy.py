"""Who is calling and in which tenant: the one place APIs and consumers ask.

The credentials themselves are checked by controlplane.authentication, and what
the caller may do there by controlplane.permissions."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request

from controlplane import selectors
from controlplane.models import ApiToken, Membership, Tenant

TENANT_HEADER = "HTTP_X_TENANT"
SESSION_TENANT_KEY = "tenant"


@dataclass(frozen=True)
class TenantContext:
    tenant: Tenant
    user: User
    role: str
    token: ApiToken | None = None


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
    """The caller's tenant context; views behind the gate (MayAct) always have one."""
    context = request_tenant_context(request)
    if context is None:
        raise PermissionDenied("You are not a member of this tenant.")
    return context
