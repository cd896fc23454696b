"""WebSocket routes of every app, gathered for the ASGI router."""

from __future__ import annotations

from typing import Any

from runs.routing import websocket_urlpatterns as runs_websockets
from tracing.routing import websocket_urlpatterns as tracing_websockets

websocket_urlpatterns: list[Any] = [*runs_websockets, *tracing_websockets]
