"""WebSocket routes of the tracing app (a run's stream is the runs app's route:
it knows which runs a tenant holds)."""

from __future__ import annotations

from django.urls import path

from tracing.consumers import TenantStreamConsumer

websocket_urlpatterns = [
    path("ws/tenant/", TenantStreamConsumer.as_asgi()),
]
