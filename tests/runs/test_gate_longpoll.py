"""GET /api/v1/gates/<id>/?wait=N on a real Daphne: the answer comes when the
gate is decided, or still pending when the wait ends, and waiting clients hold
no thread (a plain request is served while many of them wait)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.conf import settings

from controlplane.services import api_token_issue
from tests.conftest import wait_for
from tests.frontend.conftest import DaphneServer

TRACE = "0af7651916cd43dd8448eb211c80319c"
ASK = {
    "tool": "wire_transfer",
    "arguments": {"account": "DE89 3704", "amount": 120},
    "trace_id": TRACE,
    "agent": "payments-bot",
}
WAITERS = 40  # above the threads asyncio lends sync code by default (32 at most)


@pytest.fixture(scope="module")
def server(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any
) -> Iterator[DaphneServer]:
    daphne = DaphneServer(tmp_path_factory.mktemp("gates-daphne")).start()
    yield daphne
    daphne.stop()


def listening(gate_id: str) -> int:
    """Long-polls subscribed to the gate's channel-layer group (channels-redis
    keeps a group as a sorted set of channels)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return int(client.zcard(f"asgi:group:gate.{gate_id}"))
    finally:
        client.close()


def call(
    server: DaphneServer,
    token: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 90,
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
        method="POST" if body is not None else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_long_poll_answers_when_the_gate_is_decided(
    server, transactional_db, tenant, operator_user, admin_user
):
    agent = api_token_issue(tenant=tenant, user=operator_user).secret
    approver = api_token_issue(tenant=tenant, user=admin_user).secret
    status, gate = call(server, agent, "/api/v1/gates/", ASK)
    assert status == 201 and gate["status"] == "pending"

    # A short wait ends with the gate still pending.
    status, still = call(server, agent, f"/api/v1/gates/{gate['id']}/?wait=1")
    assert (status, still["status"], still["final"]) == (200, "pending", False)

    with ThreadPoolExecutor(WAITERS + 1) as pool:
        waiters = [
            pool.submit(call, server, agent, f"/api/v1/gates/{gate['id']}/?wait=60")
            for _ in range(WAITERS)
        ]
        # Served once every waiter waits (each listens on the gate's group):
        # none of them holds a thread.
        wait_for(lambda: listening(gate["id"]) == WAITERS, 60, "every waiter")
        status, now = call(server, agent, f"/api/v1/gates/{gate['id']}/", timeout=50)
        assert (status, now["status"]) == (200, "pending")
        assert not any(w.done() for w in waiters)
        status, decided = call(
            server,
            approver,
            f"/api/v1/approvals/{gate['approval_id']}/decide/",
            {"decision": "approve"},
        )
        assert status == 200, decided
        answers = [w.result(timeout=90) for w in waiters]
    assert {(s, a["status"], a["decided_by"]) for s, a in answers} == {
        (200, "approved", "alice-admin")
    }
    # Final: a new long-poll answers at once.
    status, final = call(server, agent, f"/api/v1/gates/{gate['id']}/?wait=60")
    assert final["status"] == "approved" and final["final"] is True


def test_a_long_poll_of_another_tenants_gate_is_404(
    server, transactional_db, tenant, other_tenant, operator_user, make_member
):
    agent = api_token_issue(tenant=tenant, user=operator_user).secret
    stranger = make_member(other_tenant, "otto", "operator")
    theirs = api_token_issue(tenant=other_tenant, user=stranger).secret
    status, gate = call(server, agent, "/api/v1/gates/", ASK)
    assert status == 201
    status, body = call(server, theirs, f"/api/v1/gates/{gate['id']}/?wait=60")
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = call(server, "not-a-token", f"/api/v1/gates/{gate['id']}/?wait=60")
    assert status == 401
