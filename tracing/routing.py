"""WebSocket routes of the tracing app."""

from __future__ import annotations

from django.urls import path

from tracing.consumers import RunStreamConsumer, TenantStreamConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunStreamConsumer.as_asgi()),
    path("ws/tenant/", TenantStreamConsumer.as_asgi()),
]
