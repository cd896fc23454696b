"""Every route asks the permission gate: each REST view declares an action for
each method it offers, each WebSocket consumer names one, and each plain Django
view is marked with the one it asks. A new route without one fails here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from controlplane.permissions import Action, MayAct, declared_action
from controlplane.routing import websocket_urlpatterns

# Doors outside any tenant, so outside the role matrix: probes, the metrics
# scrape (its own METRICS_TOKEN or a staff session), signing in and out, the
# API's schema and docs, Django's admin site (staff only), and the accept page
# of a one-time password link (its token is the credential; not signed in yet).
OUTSIDE_THE_GATE = {
    "password-link-accept",
    "healthz",
    "livez",
    "readyz",
    "metrics",
    "login",
    "logout",
    "api-schema",
    "api-docs",
}
OUTSIDE_NAMESPACES = {"admin"}
METHODS = ("get", "post", "put", "patch", "delete")


def routes(
    patterns: list[Any], namespace: str | None = None
) -> Iterator[tuple[str | None, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from routes(entry.url_patterns, entry.namespace or namespace)
        else:
            yield namespace, entry


def test_every_url_declares_the_action_it_asks_the_gate():
    checked = []
    for namespace, pattern in routes(get_resolver().url_patterns):
        if namespace in OUTSIDE_NAMESPACES or pattern.name in OUTSIDE_THE_GATE:
            continue
        callback = pattern.callback
        view_class = getattr(callback, "cls", None)
        if view_class is not None and issubclass(view_class, APIView):
            assert view_class.permission_classes == [MayAct], pattern.name
            assert view_class.get_permissions is APIView.get_permissions, pattern.name
            offered = [m for m in METHODS if hasattr(view_class, m)]
            assert offered, pattern.name
            for method in (*offered, "head", "options"):
                action = declared_action(view_class, method)
                assert isinstance(action, Action), (pattern.name, method)
        else:
            assert isinstance(getattr(callback, "gate_action", None), Action), (
                pattern.name
            )
        checked.append(pattern.name)
    assert {"api-runs", "api-approval-decide", "otlp-traces", "ui-audit"} <= set(
        checked
    )


def test_every_consumer_declares_the_action_it_asks_the_gate():
    assert websocket_urlpatterns
    for pattern in websocket_urlpatterns:
        consumer = pattern.callback.consumer_class
        assert isinstance(consumer.gate_action, Action), pattern


def test_a_view_without_a_declaration_is_refused(admin_user):
    class Undeclared(APIView):
        def get(self, request: Any) -> None:
            raise AssertionError("the gate let an undeclared view run")

    assert declared_action(Undeclared, "GET") is None
    request = APIRequestFactory().get("/")
    request.session = {}  # type: ignore[attr-defined]
    force_authenticate(request, user=admin_user)
    assert Undeclared.as_view()(request).status_code == 403
