"""WebSocket upgrades: the same origin rule as a browser form, then the browser
session or a bearer token checked by the one authenticator."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import split_domain_port, validate_host

from controlplane.authentication import AuthenticationRefused, bearer_authenticate

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_tuple(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the default port filled in."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def origin_allowed(scope: dict[str, Any]) -> bool:
    """The page that opens the socket must come from this very server.

    Scheme, host and port of `Origin` must equal those the client reached us at
    (the `Host` header, under `ws` → http and `wss` → https) for a host in
    ALLOWED_HOSTS, or be listed in CSRF_TRUSTED_ORIGINS (a TLS proxy in front).
    A host name alone is not enough: another port of the same host is another
    origin, possibly someone else's application.
    """
    headers = dict(scope.get("headers") or [])
    origin = headers.get(b"origin", b"").decode("latin-1")
    parsed = _origin_tuple(origin)
    if parsed is None:
        return False
    trusted = {_origin_tuple(item) for item in settings.CSRF_TRUSTED_ORIGINS}
    if parsed in trusted:
        return True
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    return parsed == _origin_tuple(f"{scheme}://{host}")


class SameOriginValidator:
    """Deny the upgrade (HTTP 403) unless `origin_allowed`."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)


class BearerTokenMiddleware(BaseMiddleware):  # type: ignore[misc]
    """`Authorization: Bearer` on the upgrade request (API clients).

    A token that is presented but refused leaves no user at all (not the
    session's): the consumer closes with the refusal in `scope["auth_refusal"]`.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        client = scope.get("client") or (None, None)
        scope["api_token"] = None
        scope["auth_refusal"] = None
        try:
            token = await database_sync_to_async(bearer_authenticate)(
                header=headers.get(b"authorization"), remote_addr=client[0]
            )
        except AuthenticationRefused as exc:
            scope["auth_refusal"] = exc
            scope["user"] = AnonymousUser()
        else:
            if token is not None:
                scope["api_token"] = token
                scope["user"] = token.user
        return await super().__call__(scope, receive, send)


def TenantAuthMiddlewareStack(inner: Any) -> Any:  # noqa: N802 (mirrors channels)
    return SameOriginValidator(AuthMiddlewareStack(BearerTokenMiddleware(inner)))
