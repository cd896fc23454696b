"""ASGI entry point for Daphne: HTTP through Django, WebSockets through Channels."""

from __future__ import annotations

import gc
import os

from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

import controlplane.urls  # noqa: E402, F401 (every view, see gc.freeze below)
from controlplane.routing import websocket_urlpatterns  # noqa: E402 (needs apps)
from controlplane.websocket_auth import TenantAuthMiddlewareStack  # noqa: E402
from tracing.setup import configure_tracing  # noqa: E402

configure_tracing()

# Every view module is imported now (controlplane.urls above), not on the first
# request routed to it, and then what the process holds for its whole life
# (modules, URL patterns, settings) leaves the collector's view: with ~230,000
# objects tracked, each full collection took 120-160 ms, and a request that
# allocates much (a trace search reads 20,000 spans) set one off in its middle
# (through Daphne, 300-420 ms searches among 40-130 ms ones); frozen, 12-16 ms.
gc.collect()
gc.freeze()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Same origin (scheme, host, port), then the session or a bearer token.
        "websocket": TenantAuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)
