"""The Members and API tokens pages: who may open them, and the controls and
links each role is offered."""

from __future__ import annotations

from typing import Any

from django.test import Client


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_admins_get_the_members_page_and_both_nav_links(tenant: Any, admin_user: Any):
    client = _client(admin_user)
    page = client.get("/members/")
    assert page.status_code == 200
    assert b'id="invite-form"' in page.content
    assert b"frontend/members_page.js" in page.content
    assert b'href="/members/" aria-current="page">Members</a>' in page.content
    assert b'href="/tokens/"' in page.content
    tokens = client.get("/tokens/")
    assert b'data-admin="1"' in tokens.content
    assert b'id="token-member"' in tokens.content


def test_operators_and_viewers_get_their_tokens_but_not_the_members_page(
    tenant: Any, operator_user: Any, viewer_user: Any
):
    for user in (operator_user, viewer_user):
        client = _client(user)
        refused = client.get("/members/")
        assert refused.status_code == 403
        assert b'id="invite-form"' not in refused.content
        tokens = client.get("/tokens/")
        assert tokens.status_code == 200
        assert b'data-admin="0"' in tokens.content
        assert b'id="token-member"' not in tokens.content
        assert b"Your tokens in Kettlecraft" in tokens.content
        assert b">Members</a>" not in tokens.content
        assert b">API tokens</a>" in tokens.content


def test_the_pages_need_a_login(db: Any):
    for path in ("/members/", "/tokens/"):
        response = Client().get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")
