"""The role matrix, one test per (role, action) cell, each through the real surface
that offers the action: the REST API, the WebSocket streams and the pages."""

from __future__ import annotations

from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from controlplane.models import ApiToken, Membership, Role
from controlplane.permissions import MATRIX, Action, role_may
from controlplane.secrets import secret_exists, secret_set
from controlplane.services import api_token_issue, api_token_revoke
from runs.models import (
    EvalSuite,
    ExternalGate,
    McpServer,
    MemoryFile,
    ModelEndpoint,
    Run,
)
from runs.services import run_cancel, run_start
from tests.runs import conftest as runs_fixtures

EXPECTED = {
    #                          admin  operator viewer
    Action.RUN_READ:          (True,  True,  True),
    Action.RUN_START:         (True,  True,  False),
    Action.RUN_CANCEL:        (True,  True,  False),
    Action.RUN_DELETE:        (True,  False, False),
    Action.RETENTION_WRITE:   (True,  False, False),
    Action.STREAM_READ:       (True,  True,  True),
    Action.PAGE_READ:         (True,  True,  True),
    Action.APPROVAL_READ:     (True,  True,  True),
    Action.APPROVAL_DECIDE:   (True,  True,  False),
    Action.POLICY_READ:       (True,  True,  True),
    Action.POLICY_WRITE:      (True,  False, False),
    Action.BUDGET_READ:       (True,  True,  True),
    Action.BUDGET_WRITE:      (True,  False, False),
    Action.AUDIT_READ:        (True,  False, False),
    Action.SECRET_READ:       (True,  True,  True),
    Action.SECRET_WRITE:      (True,  False, False),
    Action.TRACE_INGEST:      (True,  True,  False),
    Action.GATE_REQUEST:      (True,  True,  False),
    Action.AGENT_READ:        (True,  True,  True),
    Action.MCP_WRITE:         (True,  False, False),
    Action.AGENT_WRITE:       (True,  False, False),
    Action.TENANT_READ:       (True,  True,  True),
    Action.TOKEN_MANAGE:      (True,  True,  True),
    Action.MEMBER_MANAGE:     (True,  False, False),
    Action.TOKEN_MANAGE_ANY:  (True,  False, False),
    Action.EVAL_READ:         (True,  True,  True),
    Action.EVAL_WRITE:        (True,  True,  False),
    Action.MEMORY_READ:       (True,  True,  True),
    Action.MEMORY_DELETE:     (True,  False, False),
}  # fmt: skip
demo_agent = runs_fixtures.demo_agent
shop = runs_fixtures.shop
ROLES = (Role.ADMIN, Role.OPERATOR, Role.VIEWER)
CELLS = [
    (role, action, EXPECTED[action][i])
    for action in EXPECTED
    for i, role in enumerate(ROLES)
]


def test_the_matrix_is_exactly_the_table():
    assert set(EXPECTED) == set(Action)
    for role, action, allowed in CELLS:
        assert role_may(role, action) is allowed, (role, action)
    assert set(MATRIX) == set(ROLES)
    assert not role_may("stranger", Action.RUN_READ)


@pytest.fixture
def waiting_run(demo_agent: Any, make_member: Any) -> Run:
    """A demo run waiting for approval of its replacement."""
    make_member(demo_agent.tenant, "approver", Role.OPERATOR)  # someone may decide
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug=demo_agent.slug,
        input="order 4821 arrived damaged",
        started_by=None,
    )
    run = runs_fixtures.drive(run)
    assert run.status == Run.Status.WAITING_APPROVAL
    return run


def _api(user: Any, tenant: Any) -> Any:
    from rest_framework.test import APIClient

    client = APIClient()
    secret = api_token_issue(tenant=tenant, user=user).secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _page(user: Any, path: str) -> Any:
    client = Client()
    client.force_login(user)
    return client.get(path)


def perform(action: Action, user: Any, tenant: Any, request: Any) -> bool:
    """Try the action as `user`; True if it was allowed, False if refused (403)."""
    api = _api(user, tenant)
    if action is Action.RUN_READ:
        response = api.get("/api/v1/runs/")
    elif action is Action.RUN_START:
        request.getfixturevalue("demo_agent")
        body = {"agent": "kettlecraft-support", "input": "order 4821"}
        response = api.post("/api/v1/runs/", body, format="json")
        assert (response.status_code == 201) == Run.objects.exists()
    elif action is Action.RUN_CANCEL:
        run = request.getfixturevalue("waiting_run")
        response = api.post(f"/api/v1/runs/{run.id}/cancel/")
        run.refresh_from_db()
        assert (run.status == "cancelled") == (response.status_code == 200)
    elif action is Action.RUN_DELETE:
        run = request.getfixturevalue("waiting_run")
        run_cancel(run=run, actor=None)  # only an ended run may be deleted
        response = api.delete(f"/api/v1/runs/{run.id}/")
        assert Run.objects.filter(id=run.id).exists() == (response.status_code == 403)
    elif action is Action.RETENTION_WRITE:
        response = api.put("/api/v1/retention/", {"retention_days": 30}, format="json")
        tenant.refresh_from_db()
        assert (tenant.retention_days == 30) == (response.status_code == 200)
    elif action is Action.PAGE_READ:
        response = _page(user, "/runs/")
    elif action is Action.APPROVAL_READ:
        response = api.get("/api/v1/approvals/")
    elif action is Action.APPROVAL_DECIDE:
        run = request.getfixturevalue("waiting_run")
        approval = ApprovalRequest.objects.get(run=run)
        body = {"decision": "deny", "reason": "not covered"}
        response = api.post(
            f"/api/v1/approvals/{approval.id}/decide/", body, format="json"
        )
        approval.refresh_from_db()
        assert (approval.status == "pending") == (response.status_code == 403)
    elif action is Action.POLICY_READ:
        response = api.get("/api/v1/approval-rules/")
    elif action is Action.POLICY_WRITE:
        body = {"deny_reason_required": True}
        response = api.put("/api/v1/approval-settings/", body, format="json")
        assert api.get("/api/v1/approval-settings/").json()["deny_reason_required"] == (
            response.status_code == 200
        )
    elif action is Action.BUDGET_READ:
        response = api.get("/api/v1/budget/")
    elif action is Action.BUDGET_WRITE:
        body = {"limits": {"max_concurrent_runs": 3}}
        response = api.put("/api/v1/budget/", body, format="json")
        page = _page(user, "/budget/").content.decode()
        # The page offers the edit form exactly to those the API lets write.
        assert ('data-admin="1"' in page) == (response.status_code == 200)
    elif action is Action.AUDIT_READ:
        response = api.get("/api/v1/audit/")
        assert _page(user, "/audit/").status_code == response.status_code
    elif action is Action.SECRET_READ:
        secret_set(tenant=tenant, name="LISTED", value="listed-value", actor=None)
        response = api.get("/api/v1/secrets/")
        assert _page(user, "/secrets/").status_code == response.status_code
        if response.status_code == 200:
            assert [s["name"] for s in response.json()] == ["LISTED"]
    elif action is Action.SECRET_WRITE:
        secret_set(tenant=tenant, name="OLD", value="old-value", actor=None)
        body = {"value": "new-value"}
        response = api.put("/api/v1/secrets/NEW/", body, format="json")
        assert secret_exists(tenant_id=tenant.id, name="NEW") == (
            response.status_code == 201
        )
        deleted = api.delete("/api/v1/secrets/OLD/")
        assert deleted.status_code == (204 if response.status_code == 201 else 403)
        assert secret_exists(tenant_id=tenant.id, name="OLD") == (
            deleted.status_code == 403
        )
        page = _page(user, "/secrets/").content.decode()
        # The page offers the set and delete controls exactly to those who may.
        assert ('data-admin="1"' in page) == (response.status_code == 201)
    elif action is Action.TRACE_INGEST:
        body = {"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "0000000000000001", "name": "agent",
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000"}]}]}]}  # fmt: skip
        response = api.post("/v1/traces", body, format="json")
        assert (response.status_code == 200) == Run.objects.exists()
    elif action is Action.GATE_REQUEST:
        body = {"tool": "wire_transfer", "arguments": {"amount": 1},
                "trace_id": "5b8efff798038103d269b633813fc60c"}  # fmt: skip
        response = api.post("/api/v1/gates/", body, format="json")
        assert (response.status_code == 201) == ExternalGate.objects.exists()
    elif action is Action.AGENT_READ:
        response = api.get("/api/v1/agents/")
        assert api.get("/api/v1/model-endpoints/").status_code == response.status_code
    elif action is Action.MCP_WRITE:
        server = McpServer.objects.create(
            tenant=tenant, slug="files", name="Files", transport="stdio",
            command=["true"],
        )  # fmt: skip
        body = {"name": "Renamed"}
        response = api.patch(f"/api/v1/mcp-servers/{server.id}/", body, format="json")
        server.refresh_from_db()
        assert (server.name == "Renamed") == (response.status_code == 200)
    elif action is Action.AGENT_WRITE:
        body = {"slug": "local", "name": "Local", "kind": "scripted"}
        response = api.post("/api/v1/model-endpoints/", body, format="json")
        assert ModelEndpoint.objects.filter(slug="local").exists() == (
            response.status_code == 201
        )
    elif action is Action.TENANT_READ:
        response = api.get("/api/v1/me/")
    elif action is Action.TOKEN_MANAGE:
        response = api.post("/api/v1/tokens/", {"name": "ci"}, format="json")
        issued = response.json().get("id")
        if issued is not None:
            response = api.post(f"/api/v1/tokens/{issued}/revoke/")
    elif action is Action.MEMBER_MANAGE:
        body = {"email": "newcomer@example.com", "role": "viewer"}
        response = api.post("/api/v1/members/invite/", body, format="json")
        joined = Membership.objects.filter(
            tenant=tenant, user__email="newcomer@example.com"
        ).exists()
        assert joined == (response.status_code == 201)
        assert (api.get("/api/v1/members/").status_code == 200) == joined
    elif action is Action.TOKEN_MANAGE_ANY:
        other = Membership.objects.create(
            tenant=tenant,
            user=User.objects.create_user(username="someone-else"),
            role=Role.VIEWER,
        )
        body = {"name": "theirs", "member": other.id}
        response = api.post("/api/v1/tokens/", body, format="json")
        issued = ApiToken.objects.filter(user=other.user).exists()
        assert issued == (response.status_code == 201)
    elif action is Action.EVAL_READ:
        response = api.get("/api/v1/evals/suites/")
    elif action is Action.EVAL_WRITE:
        body = {"slug": "smoke", "name": "Smoke", "cases": [{
            "slug": "one", "input": "hi",
            "graders": [{"kind": "final_answer_regex", "pattern": "hi"}]}]}  # fmt: skip
        response = api.post("/api/v1/evals/suites/", body, format="json")
        assert EvalSuite.objects.filter(tenant=tenant).exists() == (
            response.status_code == 201
        )
    elif action is Action.MEMORY_READ:
        _memory_file(tenant)
        response = api.get("/api/v1/end-users/c-8812/memory/")
    elif action is Action.MEMORY_DELETE:
        _memory_file(tenant)
        response = api.delete("/api/v1/end-users/c-8812/memory/")
        gone = not MemoryFile.objects.filter(tenant=tenant).exists()
        assert gone == (response.status_code == 200)
    else:  # pragma: no cover - STREAM_READ has its own async test
        raise AssertionError(action)
    assert response.status_code in (200, 201, 204, 403), response.content
    return response.status_code != 403


def _memory_file(tenant: Any) -> None:
    MemoryFile.objects.create(
        tenant=tenant, end_user="c-8812", path="/memories/a.md",
        entries=[{"date": "2026-10-29", "text": "x", "key": ""}], size_chars=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("role", "action", "allowed"),
    [cell for cell in CELLS if cell[1] is not Action.STREAM_READ],
    ids=[f"{a}-{r}" for r, a, _ in CELLS if a is not Action.STREAM_READ],
)
def test_cell(role, action, allowed, tenant, make_member, request):
    user = make_member(tenant, f"user-{role}", role)
    assert perform(action, user, tenant, request) is allowed


async def stream_read(secret: str, tenant: Any) -> bool:
    """Whether `/ws/tenant/` serves the token, judged by what the client receives:
    a refusal is accepted too (so the browser sees why) and then closed."""
    from controlplane.asgi import application

    ws = WebsocketCommunicator(
        application,
        "/ws/tenant/",
        headers=[
            (b"origin", b"http://testserver"),
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {secret}".encode()),
        ],
    )
    await ws.connect()
    frame = await ws.receive_json_from(timeout=5)
    if frame["type"] == "hello":
        assert frame["tenant"] == tenant.slug
        await ws.disconnect()
        return True
    assert frame["type"] == "error", frame
    assert await ws.receive_output(timeout=5) == {
        "type": "websocket.close",
        "code": frame["code"],
    }
    # As a server does after a close: the consumer hears the disconnect and
    # ends here, not as a task the event loop's teardown must cancel.
    await ws.disconnect()
    return False


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", ROLES)
async def test_cell_stream_read(role, tenant, make_member):
    from asgiref.sync import sync_to_async

    user = await sync_to_async(make_member)(tenant, f"ws-{role}", role)
    secret = (await sync_to_async(api_token_issue)(tenant=tenant, user=user)).secret
    allowed = await stream_read(secret, tenant)
    assert allowed is EXPECTED[Action.STREAM_READ][ROLES.index(role)]


@pytest.mark.django_db(transaction=True)
async def test_the_stream_cell_sees_a_socket_that_is_accepted_then_refused(
    tenant, make_member
):
    """The check behind test_cell_stream_read can fail: a revoked token's socket
    is accepted (to carry the close code) yet counts as refused."""
    from asgiref.sync import sync_to_async

    user = await sync_to_async(make_member)(tenant, "ws-revoked", Role.ADMIN)
    issued = await sync_to_async(api_token_issue)(tenant=tenant, user=user)
    await sync_to_async(api_token_revoke)(token=issued.token, actor=user)
    assert await stream_read(issued.secret, tenant) is False


def test_a_member_of_another_tenant_is_refused_everywhere(
    tenant, other_tenant, make_member, waiting_run
):
    outsider = make_member(other_tenant, "outsider", "admin")
    api = _api(outsider, other_tenant)
    assert api.get(f"/api/v1/runs/{waiting_run.id}/").status_code == 404
    assert api.post(f"/api/v1/runs/{waiting_run.id}/cancel/").status_code == 404
    assert api.delete(f"/api/v1/runs/{waiting_run.id}/").status_code == 404
    assert api.get(f"/api/v1/runs/{waiting_run.id}/export/").status_code == 404
    waiting_run.refresh_from_db()
    assert waiting_run.status == Run.Status.WAITING_APPROVAL
