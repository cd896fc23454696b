"""WebSocket routes of the runs app."""

from __future__ import annotations

from django.urls import path

from runs.consumers import RunStreamConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunStreamConsumer.as_asgi()),
]
