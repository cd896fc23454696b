"""The Python client package (clients/python): reservations against the real app
served by Daphne, gates and `@gated` against a local server speaking the gates
contract, and webhook signatures."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from controlplane_client import (
    BudgetExhausted,
    ControlPlaneClient,
    ControlPlaneError,
    GateDenied,
    GateTimeout,
    WebhookSignatureError,
    gated,
    sign_webhook,
    verify_webhook,
)

from budgets.models import Budget, BudgetLedgerEntry
from controlplane.services import api_token_issue
from runs.models import Run

TRACE = "5bf92f3577b34da6a3ce929d0e0e4736"


# ---------------------------------------------------------------- reservations


@pytest.fixture
def client(
    daphne: Any, transactional_db: Any, tenant: Any, operator_user: Any
) -> Iterator[ControlPlaneClient]:
    Budget.objects.create(tenant=tenant, period_limits={"day": {"cost": "1.00"}})
    secret = api_token_issue(tenant=tenant, user=operator_user).secret
    with ControlPlaneClient(daphne.url, secret) as made:
        yield made


def test_the_client_reserves_settles_and_releases_on_the_real_app(client):
    held = client.reserve(
        trace_id=TRACE, amounts={"cost": Decimal("0.30"), "output_tokens": 200},
        agent="client-test", ttl_seconds=60,
    )  # fmt: skip
    assert held.status == "reserved" and held.trace_id == TRACE
    assert held.reserved["cost"] == "0.30" and held.reserved["output_tokens"] == 200
    settled = client.settle(held, {"cost": "0.12", "output_tokens": 80})
    assert settled.status == "settled" and settled.actual is not None
    assert settled.actual["cost"] == "0.12"
    assert Run.objects.get(id=held.run_id).cost == Decimal("0.12")

    other = client.reserve(trace_id=TRACE, amounts={"cost": "0.50"})
    assert client.release(other.id).status == "released"
    with pytest.raises(ControlPlaneError) as closed:
        client.release(other)
    assert closed.value.status == 409 and closed.value.code == "not_open"

    with pytest.raises(BudgetExhausted) as refused:
        client.reserve(trace_id=TRACE, amounts={"cost": "0.95"})
    assert refused.value.dimension == "tenant_cost_per_day"
    assert refused.value.period == "day"
    assert BudgetLedgerEntry.objects.count() == 2


def test_bad_input_is_an_error_naming_the_field(client):
    with pytest.raises(ControlPlaneError) as bad:
        client.reserve(trace_id=TRACE, amounts={"cost": "-1"})
    assert bad.value.status == 400
    assert "amounts.cost" in bad.value.detail["fields"]
    assert not BudgetLedgerEntry.objects.exists()


def test_a_wrong_token_is_an_error_not_a_reservation(daphne, transactional_db):
    stranger = ControlPlaneClient(daphne.url, "cp_not-a-token")
    with pytest.raises(ControlPlaneError) as refused:
        stranger.reserve(trace_id=TRACE, amounts={"cost": "0.1"})
    assert refused.value.status == 401
    assert not BudgetLedgerEntry.objects.exists()


# ---------------------------------------------------------------- gates


class GateServer:
    """POST /api/v1/gates/ and GET /api/v1/gates/<id>/?wait= as the gates
    contract (docs/INTERFACES) says; the decision is set by the test."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.polls: list[int] = []
        self.gate: dict[str, Any] = {}
        self.decide_on_poll = 2
        self.decision: dict[str, Any] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = json.loads(self.rfile.read(length))
                body["authorization"] = self.headers["Authorization"]
                owner.requests.append(body)
                owner.gate = {
                    "id": "g-1", "run_id": "r-1", "trace_id": body["trace_id"],
                    "tool": body["tool"], "arguments": body["arguments"],
                    "decision": "require_approval", "status": "pending",
                    "final": False, "rule": "refunds", "reason": "",
                    "approval_id": "a-1", "decided_by": None, "decided_at": None,
                    "expires_at": None,
                }  # fmt: skip
                self._send(201, owner.gate)

            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                owner.polls.append(int(query.get("wait", ["0"])[0]))
                if len(owner.polls) >= owner.decide_on_poll:
                    owner.gate.update(owner.decision)
                self._send(200, owner.gate)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def gate_server() -> Iterator[GateServer]:
    server = GateServer()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_gated_calls_the_function_with_the_approved_edited_arguments(gate_server):
    gate_server.decision = {
        "status": "approved", "final": True, "decided_by": "alice",
        "arguments": {"order_id": "A-7", "amount": 40},
    }  # fmt: skip
    client = ControlPlaneClient(gate_server.url, "secret-token")
    executed: list[tuple[str, int]] = []

    @gated(client, tool="refund", effect="irreversible_external",
           trace_id=lambda: TRACE, agent="shop-bot")  # fmt: skip
    def refund(order_id: str, amount: int = 100) -> str:
        executed.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    assert refund("A-7") == "refunded 40 on A-7"
    assert executed == [("A-7", 40)]
    [asked] = gate_server.requests
    assert asked["tool"] == "refund" and asked["trace_id"] == TRACE
    assert asked["arguments"] == {"order_id": "A-7", "amount": 100}
    assert asked["effect"] == "irreversible_external" and asked["agent"] == "shop-bot"
    assert asked["authorization"] == "Bearer secret-token"
    assert gate_server.polls[0] > 0  # a long-poll, not a busy loop


def test_a_denied_gate_raises_and_the_function_never_runs(gate_server):
    gate_server.decision = {"status": "denied", "final": True, "reason": "too much"}
    client = ControlPlaneClient(gate_server.url, "t")
    executed: list[Any] = []

    @gated(client, trace_id=lambda: TRACE)
    def wire_money(amount: int) -> None:
        executed.append(amount)

    with pytest.raises(GateDenied) as denied:
        wire_money(5000)
    assert denied.value.gate.status == "denied"
    assert "too much" in str(denied.value)
    assert executed == []


def test_an_expired_gate_raises_gate_denied(gate_server):
    gate_server.decision = {"status": "expired", "final": True}
    client = ControlPlaneClient(gate_server.url, "t")

    @gated(client, trace_id=lambda: TRACE)
    def act() -> str:
        return "done"

    with pytest.raises(GateDenied):
        act()


def test_wait_gives_up_at_the_callers_timeout(gate_server):
    gate_server.decide_on_poll = 10**6  # never decided
    client = ControlPlaneClient(gate_server.url, "t")
    gate = client.gate(tool="t", arguments={}, trace_id=TRACE)
    with pytest.raises(GateTimeout) as timed_out:
        client.wait(gate, timeout=1)
    assert timed_out.value.gate.status == "pending"


def test_gated_needs_a_trace(gate_server):
    client = ControlPlaneClient(gate_server.url, "t")

    @gated(client)
    def act() -> None:
        pass

    with pytest.raises(RuntimeError, match="no current OpenTelemetry span"):
        act()
    assert gate_server.requests == []


# ---------------------------------------------------------------- webhooks


def test_a_signed_webhook_verifies_and_a_tampered_or_old_one_does_not():
    body = json.dumps({"id": "g-1", "status": "approved"}).encode()
    header = sign_webhook(body=body, secret="whsec", timestamp=1_700_000_000)
    gate = verify_webhook(body=body, signature=header, secret="whsec",
                          now=1_700_000_010)  # fmt: skip
    assert gate["status"] == "approved"
    for wrong in (
        dict(body=body.replace(b"approved", b"denied"), signature=header),
        dict(body=body, signature=header.replace("v1=", "v1=0")),
        dict(body=body, signature="v1=abc"),
    ):
        with pytest.raises(WebhookSignatureError):
            verify_webhook(secret="whsec", now=1_700_000_010, **wrong)  # type: ignore[arg-type]
    with pytest.raises(WebhookSignatureError, match="too old"):
        verify_webhook(body=body, signature=header, secret="whsec",
                       now=1_700_000_000 + 301)  # fmt: skip
    with pytest.raises(WebhookSignatureError):
        verify_webhook(body=body, signature=header, secret="other", now=1_700_000_010)
