"""The login lockout through real Daphne (Django's async request path), as
`make run` serves it."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from controlplane.models import AuditEvent

# Daphne is another process: it sees the member only once committed.
pytestmark = pytest.mark.django_db(transaction=True)


def _login(base: str, username: str, password: str) -> tuple[int, str]:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/login/", timeout=10) as page:
        html = page.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token, html
    body = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token.group(1),
            "username": username,
            "password": password,
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/login/", data=body, headers={"Referer": f"{base}/login/"}
    )
    try:
        with opener.open(request, timeout=10) as reply:
            # A success redirects to the runs page, which the opener follows.
            return reply.status, reply.geturl()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_wrong_passwords_then_the_right_one_get_429_from_daphne(
    daphne: Any, tenant: Any, make_member: Any, settings: Any
) -> None:
    make_member(tenant, "daphne-target", "operator")
    limit = settings.AUTH_LOGIN_FAILURE_LIMIT
    statuses = [_login(daphne.url, "daphne-target", "guess")[0] for _ in range(limit)]
    # The form again, until the failure that reaches the limit locks.
    assert statuses == [200] * (limit - 1) + [429]
    status, body = _login(daphne.url, "daphne-target", "pw-daphne-target")
    assert status == 429
    assert "Too many failed logins" in body
    assert AuditEvent.objects.filter(action="auth.login_lockout").count() == 1
