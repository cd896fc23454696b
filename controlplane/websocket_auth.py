"""WebSocket authentication: the browser session, or a bearer token."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware

from controlplane import selectors


class BearerTokenMiddleware(BaseMiddleware):  # type: ignore[misc]
    """Accept `Authorization: Bearer` on the upgrade request (API clients)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"authorization", b"").split()
        scope["api_token"] = None
        if len(raw) == 2 and raw[0].lower() == b"bearer":
            token = await database_sync_to_async(selectors.api_token_by_secret)(
                secret=raw[1].decode("ascii", "replace")
            )
            if token is not None:
                scope["api_token"] = token
                scope["user"] = token.user
        return await super().__call__(scope, receive, send)


def TenantAuthMiddlewareStack(inner: Any) -> Any:  # noqa: N802 (mirrors channels)
    return AuthMiddlewareStack(BearerTokenMiddleware(inner))
