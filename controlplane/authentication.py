"""The one token authenticator, and the limits on failed logins and tokens.

Every door that takes a bearer token (the REST API, the WebSocket upgrade, OTLP
ingest) calls `bearer_authenticate`, so a token is live or dead the same way
everywhere: it must exist, not be revoked and belong to an active user (401
otherwise); the tenant context then needs the user to still be a member of the
token's tenant (403 otherwise), and the role matrix decides. Open streams ask
`tenant_context_current` again while they run, so a revocation also ends them.
`/metrics` reads the header with the same `bearer_secret`, though the secret it
compares is the scrape's own METRICS_TOKEN, not a tenant's token. Sessions are
Django's everywhere (the page middleware, DRF's SessionAuthentication and
Channels' AuthMiddlewareStack all read the same session).

Failed tokens are counted per client address and, when the token names one, per
account (its user), in the shared cache (Redis): past the limit the address or
account gets 429 until the window ends, and the lockout is audited once. Failed
logins are counted by django-axes (per username and per address) through the
same settings; `login_lockout_response` is its 429 answer.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser, User
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.request import Request

from controlplane import selectors, services
from controlplane.models import ApiToken, Membership
from controlplane.permissions import Action, role_may
from controlplane.tenancy import TenantContext

KEYWORD = "bearer"
_FAILURES = "auth-token-failures"
_LINK_FAILURES = "auth-link-failures"
_AUDITED = "auth-token-lockout-audited"


class AuthenticationRefused(Exception):
    """The presented credentials are refused; `status` is 401 or 429."""

    status = 401
    code = "unauthenticated"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TooManyFailures(AuthenticationRefused):
    status = 429
    code = "too_many_failures"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def bearer_secret(header: bytes | str | None) -> str | None:
    """The token in an `Authorization` value; None when it is not a bearer one."""
    raw = header.encode("latin-1") if isinstance(header, str) else (header or b"")
    parts = raw.split()
    if not parts or parts[0].lower() != KEYWORD.encode():
        return None
    if len(parts) != 2:
        raise AuthenticationRefused(
            "Malformed Authorization header: expected 'Bearer <token>'."
        )
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError as exc:
        raise AuthenticationRefused("The token contains non-ASCII bytes.") from exc


def bearer_authenticate(
    *, header: bytes | str | None, remote_addr: str | None
) -> ApiToken | None:
    """The live token of an `Authorization: Bearer` value, or None without one.

    Raises AuthenticationRefused (401) for a malformed, unknown, revoked or dead
    token and TooManyFailures (429) while the address or account is locked out.
    """
    secret = bearer_secret(header)
    if secret is None:
        return None
    address = remote_addr or "unknown"
    _refuse_if_locked("address", address)
    token = selectors.api_token_by_secret_any(secret=secret)
    if token is not None:
        _refuse_if_locked("account", str(token.user_id))
    problem = _token_problem(token)
    if problem is None:
        assert token is not None
        services.api_token_touch(token=token)
        return token
    _count_failure("address", address, token=token, remote_addr=remote_addr)
    if token is not None:
        _count_failure(
            "account", str(token.user_id), token=token, remote_addr=remote_addr
        )
    raise AuthenticationRefused(problem)


def _token_problem(token: ApiToken | None) -> str | None:
    if token is None or token.revoked_at is not None:
        return "Unknown or revoked API token."
    if not token.user.is_active:
        return "The token's user is inactive."
    return None


def _key(prefix: str, scope: str, value: str) -> str:
    return f"{prefix}:{scope}:{value}"


def _refuse_if_locked(scope: str, value: str) -> None:
    failures = cache.get(_key(_FAILURES, scope, value)) or 0
    if failures >= settings.AUTH_TOKEN_FAILURE_LIMIT:
        minutes = settings.AUTH_LOCKOUT_MINUTES
        raise TooManyFailures(
            f"Too many failed API tokens from this {scope}; try again in up to "
            f"{minutes} minutes.",
            retry_after=int(minutes * 60),
        )


def _count_failure(
    scope: str, value: str, *, token: ApiToken | None, remote_addr: str | None
) -> None:
    key = _key(_FAILURES, scope, value)
    window = int(settings.AUTH_LOCKOUT_MINUTES * 60)
    # add() starts the window once; incr() then counts within it atomically.
    cache.add(key, 0, timeout=window)
    try:
        failures = cache.incr(key)
    except ValueError:  # the window ended between add() and incr()
        cache.add(key, 1, timeout=window)
        failures = 1
    if failures < settings.AUTH_TOKEN_FAILURE_LIMIT:
        return
    if cache.add(_key(_AUDITED, scope, value), 1, timeout=window):
        services.audit_record(
            tenant=token.tenant if token is not None else None,
            actor=token.user if token is not None else None,
            action="auth.token_lockout",
            object_type=scope,
            object_id=value[:64],
            after={"failures": failures, "minutes": settings.AUTH_LOCKOUT_MINUTES},
            remote_addr=remote_addr if _is_ip(remote_addr) else None,
        )


def _is_ip(value: str | None) -> bool:
    try:
        ipaddress.ip_address(value or "")
    except ValueError:
        return False
    return True


class ApiTokenAuthentication(BaseAuthentication):
    """DRF's door to `bearer_authenticate`: 401 for a dead token, 429 when locked."""

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        try:
            token = bearer_authenticate(
                header=get_authorization_header(request),
                remote_addr=request.META.get("REMOTE_ADDR"),
            )
        except TooManyFailures as exc:
            raise Throttled(wait=exc.retry_after, detail=exc.message) from exc
        except AuthenticationRefused as exc:
            raise AuthenticationFailed(exc.message) from exc
        if token is None:
            return None
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


@dataclass(frozen=True)
class StreamPrincipal:
    """Who holds an open stream: enough to ask again whether they still may."""

    user_id: int
    tenant_id: Any
    token_id: Any | None


def tenant_context_current(
    *, principal: StreamPrincipal, action: Action
) -> TenantContext | None:
    """The principal's context as it is now; None once the token is revoked, the
    user deactivated, the membership removed or the role no longer allows it."""
    token: ApiToken | None = None
    if principal.token_id is not None:
        token = selectors.api_token_live(token_id=principal.token_id)
        if token is None:
            return None
        user = token.user
    else:
        found = User.objects.filter(pk=principal.user_id, is_active=True).first()
        if found is None:
            return None
        user = found
    if not user.is_active:
        return None
    membership = selectors.membership_in(user=user, tenant_id=principal.tenant_id)
    if membership is None or not role_may(membership.role, action):
        return None
    return TenantContext(
        tenant=membership.tenant, user=user, role=membership.role, token=token
    )


class MemberModelBackend(ModelBackend):
    """Django's model backend, refusing an account whose every membership has
    been deactivated (it belongs to no tenant it may log in to); an open
    session of such an account ends at its next request."""

    def user_can_authenticate(self, user: User | AnonymousUser | None) -> bool:
        if not super().user_can_authenticate(user) or user is None or not user.pk:
            return False
        # One query on every session request: the deactivation time of each.
        deactivated = Membership.objects.filter(user_id=user.pk).values_list(
            "deactivated_at", flat=True
        )
        states = list(deactivated)
        return not states or any(when is None for when in states)


def password_link_lockout_seconds(*, remote_addr: str | None) -> int | None:
    """While the address has tried too many unknown password links (as many as
    AUTH_LOGIN_FAILURE_LIMIT failed logins), how long it waits; None: it may try."""
    key = _key(_LINK_FAILURES, "address", remote_addr or "unknown")
    if (cache.get(key) or 0) >= settings.AUTH_LOGIN_FAILURE_LIMIT:
        return int(settings.AUTH_LOCKOUT_MINUTES * 60)
    return None


def password_link_failure_count(*, remote_addr: str | None) -> None:
    key = _key(_LINK_FAILURES, "address", remote_addr or "unknown")
    window = int(settings.AUTH_LOCKOUT_MINUTES * 60)
    cache.add(key, 0, timeout=window)
    try:
        cache.incr(key)
    except ValueError:  # the window ended between add() and incr()
        cache.add(key, 1, timeout=window)


def login_lockout_response(request: HttpRequest, *args: Any) -> HttpResponse:
    """django-axes' answer to a locked-out login: 429, a clear message, audited.

    Axes calls this with (request, response, credentials) from sync middleware
    and (request, credentials) from async; the credentials are on the request.
    """
    credentials = getattr(request, "axes_credentials", None) or {}
    username = str(credentials.get("username") or "")[:150]
    address = getattr(request, "axes_ip_address", None) or request.META.get(
        "REMOTE_ADDR"
    )
    minutes = settings.AUTH_LOCKOUT_MINUTES
    message = (
        "Too many failed logins for this account or from this address; "
        f"try again in up to {minutes} minutes."
    )
    window = int(minutes * 60)
    if cache.add(f"auth-login-lockout-audited:{username}:{address}", 1, window):
        _audit_login_lockout(username=username, address=address)
    response = render(
        request,
        "registration/login.html",
        {"lockout_message": message},
        status=429,
    )
    response["Retry-After"] = str(window)
    return response


def _audit_login_lockout(*, username: str, address: str | None) -> None:
    user = User.objects.filter(username=username).first()
    tenants = (
        [m.tenant for m in selectors.memberships_of(user=user)] if user else [None]
    )
    for tenant in tenants or [None]:
        services.audit_record(
            tenant=tenant,
            actor=user,
            action="auth.login_lockout",
            object_type="user",
            object_id=username[:64],
            after={"minutes": settings.AUTH_LOCKOUT_MINUTES},
            remote_addr=address if _is_ip(address) else None,
        )
