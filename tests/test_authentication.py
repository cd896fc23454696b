"""One authenticator behind every door (REST, both WebSocket streams, OTLP), open
streams that end when their caller's access does, and lockouts of brute force.

WebSockets go through the real ASGI application and the real channels-redis layer;
HTTP through Django's test client; counters live in the real (embedded) Redis.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from controlplane.asgi import application
from controlplane.members import member_deactivate
from controlplane.models import ApiToken, AuditEvent, Membership
from controlplane.services import api_token_issue, api_token_revoke, membership_remove
from runs.models import Run
from runs.services import run_start
from tests.runs import conftest as runs_fixtures
from tests.runs.conftest import drive
from tracing.models import RunEvent, Span
from tracing.services import run_event_append

demo_agent = runs_fixtures.demo_agent
shop = runs_fixtures.shop

OTLP_BODY = {
    "resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "0000000000000001", "name": "agent",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000"}]}]}]
}  # fmt: skip


def communicator(path: str, secret: str | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if secret:
        headers.append((b"authorization", f"Bearer {secret}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def stream_path(kind: str, run: Run) -> str:
    return (
        f"/ws/runs/{run.id}/?after_seq=0" if kind == "run" else "/ws/tenant/?after_id=0"
    )


async def refusal_of(ws: WebsocketCommunicator) -> tuple[int, int]:
    """(code in the error frame, close code) of a refused stream."""
    connected, _ = await ws.connect()
    assert connected  # accepted first, so a browser sees the code and reason
    error = await ws.receive_json_from(timeout=5)
    assert error["type"] == "error", error
    close = await ws.receive_output(timeout=5)
    assert close["type"] == "websocket.close", close
    return error["code"], close["code"]


async def next_event(ws: WebsocketCommunicator) -> dict[str, Any]:
    while True:
        frame = await ws.receive_json_from(timeout=5)
        if frame["type"] == "event":
            return frame["event"]  # type: ignore[no-any-return]


def otlp_post(secret: str, **extra: Any) -> Any:
    return Client().post(
        "/v1/traces",
        json.dumps(OTLP_BODY),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
        **extra,
    )


@pytest.fixture
def run(demo_agent: Any, make_member: Any) -> Run:
    make_member(demo_agent.tenant, "approver", "operator")  # someone may decide
    return run_start(
        tenant=demo_agent.tenant,
        agent_slug=demo_agent.slug,
        input="order 4821 arrived damaged",
        started_by=None,
    )


# --- item 4: one authenticator ------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_deactivated_users_token_is_refused_by_rest_streams_and_otlp(
    run: Run, make_member: Any
) -> None:
    user = await sync_to_async(make_member)(run.tenant, "dee", "operator")
    secret = (await sync_to_async(api_token_issue)(tenant=run.tenant, user=user)).secret
    await sync_to_async(get_user_model().objects.filter(pk=user.pk).update)(
        is_active=False
    )

    def rest_and_otlp() -> tuple[int, int]:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return api.get("/api/v1/runs/").status_code, otlp_post(secret).status_code

    assert await sync_to_async(rest_and_otlp)() == (401, 401)
    for kind in ("tenant", "run"):
        ws = communicator(stream_path(kind, run), secret)
        assert await refusal_of(ws) == (4401, 4401), kind
        await ws.disconnect()
    # OTLP stored nothing.
    assert not await sync_to_async(Span.objects.exists)()
    assert not await sync_to_async(Run.objects.filter(stop_reason="external").exists)()


@pytest.mark.django_db(transaction=True)
async def test_a_revoked_token_is_refused_by_both_streams_and_otlp(
    run: Run, make_member: Any
) -> None:
    user = await sync_to_async(make_member)(run.tenant, "rev", "operator")
    issued = await sync_to_async(api_token_issue)(tenant=run.tenant, user=user)
    await sync_to_async(api_token_revoke)(token=issued.token, actor=user)

    assert (await sync_to_async(otlp_post)(issued.secret)).status_code == 401
    for kind in ("tenant", "run"):
        ws = communicator(stream_path(kind, run), issued.secret)
        assert await refusal_of(ws) == (4401, 4401), kind
        await ws.disconnect()


def _revoke_token(token: ApiToken, user: Any) -> None:
    api_token_revoke(token=token, actor=user)


def _deactivate_user(token: ApiToken, user: Any) -> None:
    # Any path (here the ORM, as /admin/ would): the stream notices by itself.
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)


def _remove_membership(token: ApiToken, user: Any) -> None:
    membership_remove(tenant=token.tenant, user=user, actor=None)


def _deactivate_membership(token: ApiToken, user: Any) -> None:
    membership = Membership.objects.get(tenant=token.tenant, user=user)
    member_deactivate(membership=membership, actor=None)


REVOCATIONS: dict[str, Callable[[ApiToken, Any], None]] = {
    "token-revoked": _revoke_token,
    "user-deactivated": _deactivate_user,
    "membership-removed": _remove_membership,
    "membership-deactivated": _deactivate_membership,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["tenant", "run"])
@pytest.mark.parametrize("revocation", list(REVOCATIONS))
async def test_an_open_stream_is_closed_within_5_seconds_of_losing_access(
    run: Run, make_member: Any, kind: str, revocation: str
) -> None:
    user = await sync_to_async(make_member)(run.tenant, "watcher", "operator")
    issued = await sync_to_async(api_token_issue)(tenant=run.tenant, user=user)
    ws = communicator(stream_path(kind, run), issued.secret)
    assert (await ws.connect())[0]
    await sync_to_async(run_event_append)(run=run, type="run.note", payload={})
    assert (await next_event(ws))["type"] == "run.note"  # the stream is live

    await sync_to_async(REVOCATIONS[revocation])(issued.token, user)
    started = time.monotonic()
    frames = []
    while True:
        left = 5 - (time.monotonic() - started)
        assert left > 0, f"still open after 5 s: {frames}"
        output = await ws.receive_output(timeout=left)
        if output["type"] == "websocket.close":
            break
        frames.append(json.loads(output["text"]))
    assert output["code"] == 4401
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == 4401
    assert "access ended" in frames[-1]["message"]

    # The run now asks for approval: nothing of it reaches the closed stream.
    settled = await sync_to_async(drive)(run)
    assert settled.status == Run.Status.WAITING_APPROVAL
    assert await sync_to_async(
        RunEvent.objects.filter(run=run, type="approval.requested").exists
    )()
    assert await ws.receive_nothing(timeout=1.5)
    await ws.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_stream_of_a_member_who_stays_is_not_closed(
    run: Run, make_member: Any, settings: Any
) -> None:
    """The re-check ends only streams whose access ended: a revocation of
    someone else's token leaves this one delivering."""
    settings.STREAM_AUTH_RECHECK_SECONDS = 0.2
    user = await sync_to_async(make_member)(run.tenant, "stays", "viewer")
    other = await sync_to_async(make_member)(run.tenant, "leaves", "viewer")
    mine = await sync_to_async(api_token_issue)(tenant=run.tenant, user=user)
    theirs = await sync_to_async(api_token_issue)(tenant=run.tenant, user=other)
    ws = communicator(stream_path("tenant", run), mine.secret)
    assert (await ws.connect())[0]
    await sync_to_async(_revoke_token)(theirs.token, other)
    await asyncio.sleep(1)  # five re-checks
    await sync_to_async(drive)(run)
    seen: list[str] = []
    while "approval.requested" not in seen:
        seen.append((await next_event(ws))["type"])
    await ws.disconnect()


def test_membership_remove_revokes_the_members_tokens_and_is_audited(
    tenant: Any, make_member: Any, admin_user: Any
) -> None:
    user = make_member(tenant, "gone", "operator")
    issued = api_token_issue(tenant=tenant, user=user)
    assert membership_remove(tenant=tenant, user=user, actor=admin_user)
    issued.token.refresh_from_db()
    assert issued.token.revoked_at is not None
    assert not Membership.objects.filter(user=user, tenant=tenant).exists()
    entry = AuditEvent.objects.get(action="membership.remove")
    assert (entry.actor, entry.before["role"]) == (admin_user, "operator")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    assert api.get("/api/v1/runs/").status_code == 401


# --- item 5: brute force --------------------------------------------------------


def _login(username: str, password: str, address: str = "127.0.0.1") -> Any:
    return Client(REMOTE_ADDR=address).post(
        "/login/", {"username": username, "password": password}
    )


def test_30_wrong_passwords_then_the_right_one_is_refused_with_429(
    tenant: Any, make_member: Any
) -> None:
    user = make_member(tenant, "target", "admin")
    for _ in range(30):
        assert _login("target", "guess").status_code in (200, 429)
    response = _login("target", "pw-target")
    assert response.status_code == 429
    assert "_auth_user_id" not in response.wsgi_request.session
    assert b"Too many failed logins" in response.content
    assert response["Retry-After"]
    entries = AuditEvent.objects.filter(action="auth.login_lockout")
    assert entries.count() == 1  # once per lockout, not per refused attempt
    assert (entries[0].tenant, entries[0].actor) == (tenant, user)
    assert entries[0].remote_addr == "127.0.0.1"
    user.refresh_from_db()
    assert user.last_login is None


def test_logins_are_locked_per_account_across_addresses(
    tenant: Any, make_member: Any
) -> None:
    make_member(tenant, "sprayed", "operator")
    for i in range(12):
        _login("sprayed", "guess", address=f"10.0.0.{i + 1}")
    assert _login("sprayed", "pw-sprayed", address="10.0.1.1").status_code == 429


def test_logins_are_locked_per_address_across_accounts(
    tenant: Any, make_member: Any
) -> None:
    make_member(tenant, "innocent", "viewer")
    for i in range(12):
        _login(f"nobody-{i}", "guess", address="10.9.9.9")
    assert _login("innocent", "pw-innocent", address="10.9.9.9").status_code == 429
    # Another address still logs in.
    assert _login("innocent", "pw-innocent", address="10.9.9.8").status_code == 302


def test_a_few_wrong_passwords_do_not_lock_and_a_success_resets(
    tenant: Any, make_member: Any
) -> None:
    make_member(tenant, "typo", "viewer")
    for _ in range(3):
        assert _login("typo", "guess").status_code == 200
    assert _login("typo", "pw-typo").status_code == 302
    for _ in range(8):
        assert _login("typo", "guess").status_code == 200
    assert _login("typo", "pw-typo").status_code == 302


def test_50_invalid_bearer_tokens_get_429_after_the_limit(
    tenant: Any, make_member: Any, settings: Any
) -> None:
    user = make_member(tenant, "client", "operator")
    good = api_token_issue(tenant=tenant, user=user).secret
    api = APIClient(REMOTE_ADDR="10.2.3.4")
    statuses = []
    for i in range(50):
        api.credentials(HTTP_AUTHORIZATION=f"Bearer cp_guess-{i:04d}")
        statuses.append(api.get("/api/v1/runs/").status_code)
    limit = settings.AUTH_TOKEN_FAILURE_LIMIT
    assert statuses[:limit] == [401] * limit
    assert statuses[limit:] == [429] * (50 - limit)
    locked = api.get("/api/v1/runs/")
    assert locked.json()["error"]["code"] == "throttled"
    assert "Too many failed API tokens" in locked.json()["error"]["message"]
    assert int(locked["Retry-After"]) > 0
    # While locked, even a good token from that address is refused, and it
    # changes nothing (its last use is not recorded).
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {good}")
    assert api.post("/api/v1/tokens/", {"name": "x"}).status_code == 429
    assert ApiToken.objects.filter(user=user).count() == 1
    assert ApiToken.objects.get(user=user).last_used_at is None
    # Another address is not affected.
    other = APIClient(REMOTE_ADDR="10.2.3.5")
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {good}")
    assert other.get("/api/v1/runs/").status_code == 200
    entry = AuditEvent.objects.get(action="auth.token_lockout")
    assert (entry.object_type, entry.object_id) == ("address", "10.2.3.4")
    assert entry.remote_addr == "10.2.3.4"


def test_a_locked_address_gets_429_from_otlp_too(
    tenant: Any, make_member: Any, settings: Any
) -> None:
    user = make_member(tenant, "exporter", "operator")
    good = api_token_issue(tenant=tenant, user=user).secret
    for i in range(settings.AUTH_TOKEN_FAILURE_LIMIT):
        assert otlp_post(f"cp_guess-{i}").status_code == 401
    response = otlp_post(good)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "too_many_failures"
    assert not Span.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_a_locked_address_is_refused_on_the_streams_with_4429(
    run: Run, settings: Any
) -> None:
    for i in range(settings.AUTH_TOKEN_FAILURE_LIMIT):
        ws = communicator(stream_path("tenant", run), f"cp_guess-{i}")
        assert await refusal_of(ws) == (4401, 4401)
        await ws.disconnect()
    ws = communicator(stream_path("run", run), "cp_guess-last")
    assert await refusal_of(ws) == (4429, 4429)
    await ws.disconnect()


def test_a_revoked_token_used_again_and_again_locks_its_account(
    tenant: Any, make_member: Any, settings: Any
) -> None:
    user = make_member(tenant, "leaky", "operator")
    leaked = api_token_issue(tenant=tenant, user=user)
    fresh = api_token_issue(tenant=tenant, user=user).secret
    api_token_revoke(token=leaked.token, actor=user)
    for i in range(settings.AUTH_TOKEN_FAILURE_LIMIT):
        api = APIClient(REMOTE_ADDR=f"10.4.0.{i + 1}")
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {leaked.secret}")
        assert api.get("/api/v1/runs/").status_code == 401
    api = APIClient(REMOTE_ADDR="10.4.1.1")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {fresh}")
    assert api.get("/api/v1/runs/").status_code == 429
    entry = AuditEvent.objects.get(action="auth.token_lockout", object_type="account")
    assert (entry.tenant, entry.actor) == (tenant, user)


def test_many_requests_with_a_good_token_are_never_throttled(
    tenant: Any, make_member: Any
) -> None:
    user = make_member(tenant, "busy", "viewer")
    api = APIClient()
    api.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_token_issue(tenant=tenant, user=user).secret}"
    )
    assert {api.get("/api/v1/runs/").status_code for _ in range(60)} == {200}


def test_approval_requests_are_untouched_by_refused_tokens(
    demo_agent: Any, make_member: Any
) -> None:
    """A refused token changes nothing: the pending approval stays pending."""
    make_member(demo_agent.tenant, "approver", "operator")
    run = drive(
        run_start(
            tenant=demo_agent.tenant,
            agent_slug=demo_agent.slug,
            input="order 4821 arrived damaged",
            started_by=None,
        )
    )
    approval = ApprovalRequest.objects.get(run=run)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer cp_not-a-token")
    response = api.post(
        f"/api/v1/approvals/{approval.id}/decide/",
        {"decision": "approve"},
        format="json",
    )
    assert response.status_code == 401
    approval.refresh_from_db()
    assert approval.status == "pending"


@pytest.mark.django_db(transaction=True)
async def test_a_browser_sessions_stream_closes_when_its_user_is_deactivated(
    run: Run, make_member: Any
) -> None:
    user = await sync_to_async(make_member)(run.tenant, "browser", "viewer")

    def session_cookie() -> str:
        client = Client()
        client.force_login(user)
        return client.cookies["sessionid"].value

    cookie = await sync_to_async(session_cookie)()
    ws = WebsocketCommunicator(
        application,
        "/ws/tenant/?after_id=0",
        headers=[
            (b"origin", b"http://testserver"),
            (b"host", b"testserver"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ],
    )
    assert (await ws.connect())[0]
    assert (await ws.receive_json_from(timeout=5))["type"] == "hello"
    await sync_to_async(_deactivate_user)(None, user)  # type: ignore[arg-type]
    started = time.monotonic()
    while True:
        output = await ws.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            break
    assert time.monotonic() - started < 5
    assert output["code"] == 4401
    await ws.disconnect()
