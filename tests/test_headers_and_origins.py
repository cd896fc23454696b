"""Pages carry a Content-Security-Policy without inline script, and a WebSocket
opens only from this very origin (scheme, host and port)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane.asgi import application
from controlplane.services import api_token_issue, membership_set, tenant_create

PAGES = ["/login/", "/runs/", "/approvals/", "/budget/", "/audit/", "/"]


def _directives(header: str) -> dict[str, list[str]]:
    parsed = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            parsed[words[0]] = words[1:]
    return parsed


@pytest.mark.parametrize("path", PAGES)
def test_every_page_has_a_csp_without_inline_script(path, admin_user, tenant):
    other = tenant_create(slug="second", name="Second")  # the tenant switcher shows
    membership_set(tenant=other, user=admin_user, role="viewer")
    client = Client()
    if path != "/login/":
        client.force_login(admin_user)
    response = client.get(path)
    assert response.status_code == 200
    policy = _directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]
    assert "'unsafe-inline'" not in policy["script-src"]
    assert "'unsafe-eval'" not in policy["script-src"]
    assert policy["default-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    # And the page needs nothing the policy forbids: every script is a file,
    # no element carries an inline handler.
    html = response.content.decode()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert 'src="/static/' in tag, tag
    assert not re.search(r"<script\b[^>]*>\s*[^<\s]", html)
    assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler"


def test_the_api_answers_carry_the_policy_too(admin_user, tenant, api_client_for):
    response = api_client_for(admin_user, tenant).get("/api/v1/me/")
    assert response.status_code == 200
    assert "script-src 'self'" in response["Content-Security-Policy"]


def _ws(origin: str, host: str, secret: str, scheme: str = "ws") -> Any:
    communicator = WebsocketCommunicator(
        application,
        "/ws/tenant/",
        headers=[
            (b"origin", origin.encode()),
            (b"host", host.encode()),
            (b"authorization", f"Bearer {secret}".encode()),
        ],
    )
    communicator.scope["scheme"] = scheme
    return communicator


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("http://127.0.0.1:9999", "127.0.0.1:8000", "ws"),  # another port
        ("http://127.0.0.1", "127.0.0.1:8000", "ws"),  # port 80 is another port
        ("https://127.0.0.1:8000", "127.0.0.1:8000", "ws"),  # another scheme
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "wss"),  # TLS page, plain origin
        ("http://localhost:8000", "127.0.0.1:8000", "ws"),  # another host
        ("http://evil.example:8000", "evil.example:8000", "ws"),  # not allowed
        ("null", "127.0.0.1:8000", "ws"),
        ("", "127.0.0.1:8000", "ws"),
    ],
)
async def test_a_websocket_from_another_origin_is_refused(
    origin, host, scheme, admin_user, tenant
):
    secret = (
        await sync_to_async(api_token_issue)(tenant=tenant, user=admin_user)
    ).secret
    ws = _ws(origin, host, secret, scheme)
    connected, _ = await ws.connect()
    assert connected is False  # closed before accept: Daphne answers HTTP 403


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws"),
        ("https://localhost", "localhost", "wss"),
        ("http://localhost:80", "localhost", "ws"),  # the default port, spelt out
    ],
)
async def test_a_websocket_from_the_same_origin_opens(
    origin, host, scheme, admin_user, tenant
):
    secret = (
        await sync_to_async(api_token_issue)(tenant=tenant, user=admin_user)
    ).secret
    ws = _ws(origin, host, secret, scheme)
    connected, _ = await ws.connect()
    assert connected
    assert (await ws.receive_json_from(timeout=5))["type"] == "hello"
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_trusted_proxy_origin_opens(admin_user, tenant, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://plane.example.com"]
    secret = (
        await sync_to_async(api_token_issue)(tenant=tenant, user=admin_user)
    ).secret
    ws = _ws("https://plane.example.com", "127.0.0.1:8000", secret)
    connected, _ = await ws.connect()
    assert connected
    await ws.disconnect()


def test_the_api_docs_page_runs_no_inline_script(admin_user, tenant):
    client = Client()
    client.force_login(admin_user)
    page = client.get("/api/docs/")
    assert page.status_code == 200
    policy = _directives(page["Content-Security-Policy"])
    assert "'unsafe-inline'" not in policy["script-src"]
    html = page.content.decode()
    assert not re.search(r"<script\b[^>]*>\s*[^<\s]", html)
    script = re.search(r'<script src="(/api/docs/\?[^"]*script[^"]*)"', html)
    assert script, html
    init = client.get(script.group(1).replace("&amp;", "&"))
    assert init.status_code == 200
    assert init["Content-Type"].startswith("application/javascript")
