"""ASGI entry point for Daphne: HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import os

from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from controlplane.routing import websocket_urlpatterns  # noqa: E402 (needs apps)
from controlplane.websocket_auth import TenantAuthMiddlewareStack  # noqa: E402
from tracing.setup import configure_tracing  # noqa: E402

configure_tracing()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Same origin (scheme, host, port), then the session or a bearer token.
        "websocket": TenantAuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)
