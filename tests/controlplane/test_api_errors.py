"""The API and OTLP paths answer JSON errors whatever DEBUG says, and no token
reaches an error page or a log line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from controlplane.services import api_token_issue
from runs import trace_api as tracing_api
from runs.models import Run
from tracing.models import Span


@pytest.fixture
def console_log() -> Iterator[io.StringIO]:
    """What the configured console handler (settings.LOGGING) writes."""
    handler = next(h for h in logging.getLogger().handlers if h.name == "console")
    sink = io.StringIO()
    previous = handler.setStream(sink)  # type: ignore[attr-defined]
    yield sink
    handler.setStream(previous)  # type: ignore[attr-defined]


def otlp_body() -> bytes:
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "agent run",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


def assert_json_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code
    return error  # type: ignore[no-any-return]


def test_a_500_on_otlp_ingest_with_debug_on_is_json_without_the_token_or_settings(
    settings: Any,
    monkeypatch: Any,
    tenant: Any,
    admin_user: Any,
    console_log: io.StringIO,
) -> None:
    settings.DEBUG = True
    secret = api_token_issue(tenant=tenant, user=admin_user).secret

    def failing_ingest(**kwargs: Any) -> None:
        # An error whose message quotes the request, as a driver's might.
        raise RuntimeError(f"cannot store spans for Authorization: Bearer {secret}")

    monkeypatch.setattr(tracing_api, "ingest_spans", failing_ingest)
    client = Client(raise_request_exception=False)
    response = client.post(
        "/v1/traces",
        otlp_body(),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )

    error = assert_json_error(response, 500, "internal_error")
    assert error["message"] == "Internal error."
    page = response.content.decode()
    for leak in (secret, "CELERY_BROKER_URL", "DATABASES", "Traceback", "RuntimeError"):
        assert leak not in page
    logged = console_log.getvalue()
    assert "RuntimeError: cannot store spans" in logged  # the operator sees why
    assert secret not in logged
    assert "[REDACTED]" in logged
    assert not Span.objects.exists() and not Run.objects.exists()


def test_an_exception_in_an_api_view_with_debug_on_is_json_and_logged_masked(
    settings: Any,
    monkeypatch: Any,
    tenant: Any,
    admin_user: Any,
    api_client_for: Any,
    console_log: io.StringIO,
) -> None:
    settings.DEBUG = True
    client = api_client_for(admin_user, tenant)
    secret = client._credentials["HTTP_AUTHORIZATION"].split()[1]

    def failing_list(**kwargs: Any) -> None:
        raise ValueError(f"token {secret} was looked at")

    monkeypatch.setattr("runs.api.selectors.run_list_for", failing_list)
    client.raise_request_exception = False
    response = client.get("/api/v1/runs/")
    assert_json_error(response, 500, "internal_error")
    assert secret not in response.content.decode()
    logged = console_log.getvalue()
    assert "was looked at" in logged and secret not in logged


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize(
    ("method", "path", "host", "status", "code"),
    [
        ("get", "/api/v1/no-such-thing/", "testserver", 404, "not_found"),
        ("get", "/v1/metrics", "testserver", 404, "not_found"),
        ("get", "/v1/traces", "testserver", 405, "method_not_allowed"),
        # DisallowedHost: with DEBUG on, Django's page for it lists the settings.
        ("get", "/api/v1/runs/", "evil.example", 400, "bad_request"),
        ("post", "/v1/traces", "evil.example", 400, "bad_request"),
    ],
)
def test_error_pages_on_api_and_otlp_paths_are_json_whatever_debug_says(
    settings: Any,
    admin_user: Any,
    debug: bool,
    method: str,
    path: str,
    host: str,
    status: int,
    code: str,
) -> None:
    settings.DEBUG = debug
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    response = getattr(client, method)(path, HTTP_HOST=host)
    assert_json_error(response, status, code)
    assert "SECRET_KEY" not in response.content.decode()
    assert response["X-Content-Type-Options"] == "nosniff"  # the other middleware's
    if status == 405:
        assert response["Allow"] == "POST"


def test_pages_outside_the_api_keep_their_html_error_pages(
    settings: Any, admin_user: Any
) -> None:
    settings.DEBUG = False
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
