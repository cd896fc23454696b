"""POST /api/v1/gates/: an external agent's tool call put to the tenant's policy,
decided through the approvals API, and the bad input it refuses with nothing
written (real database; the decision goes through the real approve/deny API)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import ApprovalPolicyRule, ApprovalRequest
from controlplane.models import AuditEvent
from controlplane.secrets import secret_set
from runs.models import ExternalGate, Run
from runs.services.decide import approvals_expire
from tracing.models import Span

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
SCHEMA = {
    "type": "object",
    "properties": {
        "account": {"type": "string"},
        "amount": {"type": "number", "maximum": 10000},
    },
    "required": ["account", "amount"],
}
ASK: dict[str, Any] = {
    "tool": "wire_transfer",
    "arguments": {"account": "DE89 3704", "amount": 120},
    "trace_id": TRACE,
    "span_id": SPAN,
    "input_schema": SCHEMA,
    "agent": "payments-bot",
}


def nothing_written(tenant: Any) -> None:
    assert not ExternalGate.objects.exists()
    assert not ApprovalRequest.objects.exists()
    assert not Run.objects.filter(tenant=tenant).exists()
    assert not AuditEvent.objects.filter(action="gate.request").exists()


@pytest.fixture
def operator_api(operator_user: Any, tenant: Any, api_client_for: Any) -> Any:
    return api_client_for(operator_user, tenant)


def test_a_write_waits_for_approval_on_the_external_run_of_its_trace(
    operator_api, tenant, admin_user
):
    response = operator_api.post("/api/v1/gates/", ASK, format="json")
    assert response.status_code == 201, response.content
    gate = response.json()
    assert gate["decision"] == "require_approval"
    assert gate["status"] == "pending" and gate["final"] is False
    assert gate["rule"] == "default.side_effect"
    assert gate["trace_id"] == TRACE and gate["tool"] == "wire_transfer"
    assert gate["arguments"] == ASK["arguments"]
    assert gate["decided_by"] is None and gate["expires_at"]
    run = Run.objects.get(id=gate["run_id"])
    assert run.trace_id == TRACE and run.stop_reason == "external"
    assert run.agent.name == "External: payments-bot"
    approval = ApprovalRequest.objects.get(id=gate["approval_id"])
    assert approval.kind == "external_call" and approval.tool_call is None
    assert approval.run_id == run.id and approval.args_snapshot == ASK["arguments"]
    # The approval span hangs under the caller's span in the run's trace.
    span = Span.objects.get(run=run, name="approval wire_transfer")
    assert span.trace_id == TRACE and span.parent_span_id == SPAN
    assert span.status == "running"
    assert span.attributes["gen_ai.tool.call.id"] == str(approval.id)
    audit = AuditEvent.objects.get(action="gate.request")
    assert audit.after["status"] == "pending" and audit.object_id == gate["id"]
    # In the inbox, as the approvals API lists it.
    listed = operator_api.get("/api/v1/approvals/?status=pending").json()["results"]
    assert [(a["kind"], a["tool"], a["tool_call_id"]) for a in listed] == [
        ("external_call", "wire_transfer", str(approval.id))
    ]


def test_the_runs_list_shows_the_external_run_waiting_on_approval(operator_api):
    # The list once answered 500 for a page holding a run with a pending gate.
    gate = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    listed = operator_api.get("/api/v1/runs/")
    assert listed.status_code == 200, listed.content
    (row,) = listed.json()["results"]
    assert row["id"] == gate["run_id"]
    assert row["waiting_on"] == {"approval": 1, "input": 0, "budget": 0}
    waiting = operator_api.get("/api/v1/runs/?waiting=approval").json()["results"]
    assert [run["id"] for run in waiting] == [gate["run_id"]]
    by_waiting = operator_api.get("/api/v1/runs/?sort=-waiting").json()["results"]
    assert [run["id"] for run in by_waiting] == [gate["run_id"]]


def test_approving_finalises_the_gate_with_who_decided(
    operator_api, tenant, admin_user, api_client_for
):
    gate = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    admin = api_client_for(admin_user, tenant)
    decided = admin.post(
        f"/api/v1/approvals/{gate['approval_id']}/decide/",
        {"decision": "approve"},
        format="json",
    )
    assert decided.status_code == 200, decided.content
    now = operator_api.get(f"/api/v1/gates/{gate['id']}/").json()
    assert now["status"] == "approved" and now["final"] is True
    assert now["decided_by"] == "alice-admin" and now["decided_at"]
    assert now["arguments"] == ASK["arguments"]
    span = Span.objects.get(name="approval wire_transfer")
    assert span.status != "running"
    assert span.attributes["cp.approval.decider"] == "alice-admin"
    # The external run stays as it was: nothing resumes.
    run = Run.objects.get(id=gate["run_id"])
    assert run.status == "succeeded" and run.steps == 0


def test_edit_and_approve_gives_the_edited_arguments(
    operator_api, tenant, admin_user, api_client_for
):
    gate = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    admin = api_client_for(admin_user, tenant)
    url = f"/api/v1/approvals/{gate['approval_id']}/decide/"
    wrong = {"decision": "approve", "args": {"account": "DE89 3704", "amount": "x"}}
    refused = admin.post(url, wrong, format="json")
    assert refused.status_code == 400 and "amount" in refused.content.decode()
    assert ExternalGate.objects.get(id=gate["id"]).status == "pending"
    edited = {"account": "DE89 3704", "amount": 80}
    assert (
        admin.post(
            url, {"decision": "approve", "args": edited}, format="json"
        ).status_code
        == 200
    )
    now = operator_api.get(f"/api/v1/gates/{gate['id']}/").json()
    assert now["status"] == "approved" and now["arguments"] == edited


def test_a_deny_and_an_expiry_finalise_the_gate(
    operator_api, tenant, admin_user, api_client_for
):
    first = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    admin = api_client_for(admin_user, tenant)
    admin.post(
        f"/api/v1/approvals/{first['approval_id']}/decide/",
        {"decision": "deny", "reason": "wrong account"},
        format="json",
    )
    denied = operator_api.get(f"/api/v1/gates/{first['id']}/").json()
    assert denied["status"] == "denied" and denied["reason"] == "wrong account"
    assert denied["decision"] == "require_approval"

    second = operator_api.post(
        "/api/v1/gates/", {**ASK, "ttl_seconds": 60}, format="json"
    ).json()
    expires = dt.datetime.fromisoformat(second["expires_at"])
    assert expires <= timezone.now() + dt.timedelta(seconds=61)
    assert approvals_expire(now=timezone.now() + dt.timedelta(seconds=61)) == 1
    expired = operator_api.get(f"/api/v1/gates/{second['id']}/").json()
    assert expired["status"] == "expired" and expired["final"] is True


def test_allow_and_deny_answer_at_once(operator_api, tenant, admin_user):
    read = operator_api.post(
        "/api/v1/gates/",
        {**ASK, "tool": "lookup_account", "effect": "read_only", "span_id": ""},
        format="json",
    ).json()
    assert (read["decision"], read["status"], read["final"]) == (
        "allow",
        "allowed",
        True,
    )
    assert read["rule"] == "default.read_only" and read["approval_id"] is None
    ApprovalPolicyRule.objects.create(
        tenant=tenant, name="no wires", tool="wire_*", action="deny"
    )
    denied = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    assert (denied["decision"], denied["status"]) == ("deny", "denied")
    assert denied["reason"] == "denied by no wires"
    assert not ApprovalRequest.objects.exists()
    # Both are calls of the same external run.
    assert read["run_id"] == denied["run_id"]


def test_a_known_tool_is_checked_against_its_own_contract(operator_api, tenant):
    response = operator_api.post(
        "/api/v1/gates/",
        {
            "tool": "refund",
            "arguments": {"order_id": "4821", "amount": "lots"},
            "trace_id": TRACE,
            "input_schema": {"type": "object"},  # ignored: refund has its own
        },
        format="json",
    )
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert "amount" in json.dumps(fields["arguments"])
    nothing_written(tenant)


def test_the_same_idempotency_key_gives_the_same_gate(operator_api, tenant):
    ask = {**ASK, "idempotency_key": "call-7"}
    first = operator_api.post("/api/v1/gates/", ask, format="json")
    again = operator_api.post("/api/v1/gates/", ask, format="json")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    other = operator_api.post(
        "/api/v1/gates/", {**ask, "arguments": {"account": "X", "amount": 1}},
        format="json",
    )  # fmt: skip
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert ExternalGate.objects.count() == 1 and ApprovalRequest.objects.count() == 1


# --- bad input: a clear 4xx and nothing written -------------------------------------


def test_another_tenants_trace_is_refused(
    operator_api, tenant, other_tenant, make_member, api_client_for
):
    stranger = make_member(other_tenant, "otto", "operator")
    theirs = api_client_for(stranger, other_tenant).post(
        "/api/v1/gates/", ASK, format="json"
    )
    assert theirs.status_code == 201
    before = (ExternalGate.objects.count(), ApprovalRequest.objects.count())
    response = operator_api.post("/api/v1/gates/", ASK, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "trace_unavailable"
    assert (ExternalGate.objects.count(), ApprovalRequest.objects.count()) == before
    assert not Run.objects.filter(tenant=tenant).exists()
    # Nor is the other tenant's gate readable here.
    assert operator_api.get(f"/api/v1/gates/{theirs.json()['id']}/").status_code == 404


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"arguments": {"account": "DE89", "amount": 99999}}, "arguments", "amount"),
        ({"arguments": {"account": "DE89"}}, "arguments", "amount"),
        ({"arguments": ["not", "an", "object"]}, "arguments", "object"),
        ({"trace_id": "xyz"}, "trace_id", "hexadecimal"),
        ({"trace_id": "0" * 32}, "trace_id", "not all zero"),
        ({"span_id": "123"}, "span_id", "hexadecimal"),
        ({"tool": "rm -rf"}, "tool", ""),
        ({"effect": "harmless"}, "effect", ""),
        ({"input_schema": {"type": "array"}}, "input_schema", "type: object"),
        ({"ttl_seconds": 0}, "ttl_seconds", ""),
        ({"surprise": 1}, "surprise", "unknown"),
    ],
)
def test_bad_fields_are_named_and_nothing_is_written(
    operator_api, tenant, change, field, words
):
    response = operator_api.post("/api/v1/gates/", {**ASK, **change}, format="json")
    assert response.status_code == 400, response.content
    problems = response.json()["error"]["fields"]
    assert field in problems and words in json.dumps(problems[field])
    nothing_written(tenant)


def test_a_ten_megabyte_body_is_413_and_nothing_is_written(operator_api, tenant):
    body = json.dumps({**ASK, "arguments": {"blob": "x" * 10_000_000}})
    response = operator_api.post(
        "/api/v1/gates/", body, content_type="application/json"
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    nothing_written(tenant)


def test_a_body_just_over_the_gate_limit_is_413(operator_api, tenant, settings):
    body = json.dumps({**ASK, "arguments": {"blob": "x" * 1_100_000}})
    response = operator_api.post(
        "/api/v1/gates/", body, content_type="application/json"
    )
    assert response.status_code == 413
    assert "GATE_MAX_BODY_BYTES" in response.json()["error"]["message"]
    nothing_written(tenant)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://10.1.2.3/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://localhost/hook",
        "ftp://example.com/hook",
        "https://user:pw@example.com/hook",
    ],
)
def test_a_private_or_odd_webhook_url_is_refused(operator_api, tenant, url):
    secret_set(tenant=tenant, name="gate_webhook", value="whsec-1", actor=None)
    response = operator_api.post(
        "/api/v1/gates/", {**ASK, "webhook_url": url}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "webhook_url" in response.json()["error"]["fields"]
    nothing_written(tenant)


def test_a_webhook_needs_the_signing_secret(operator_api, tenant, settings):
    settings.GATE_WEBHOOK_ALLOW_PRIVATE = True
    response = operator_api.post(
        "/api/v1/gates/",
        {**ASK, "webhook_url": "http://127.0.0.1:9/hook"},
        format="json",
    )
    assert response.status_code == 400
    message = json.dumps(response.json()["error"]["fields"]["webhook_url"])
    assert "gate_webhook" in message
    nothing_written(tenant)


def test_a_viewer_may_read_a_gate_but_not_ask(
    operator_api, tenant, viewer_user, api_client_for
):
    gate = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    viewer = api_client_for(viewer_user, tenant)
    assert viewer.get(f"/api/v1/gates/{gate['id']}/").json()["status"] == "pending"
    refused = viewer.post("/api/v1/gates/", ASK, format="json")
    assert refused.status_code == 403
    assert ExternalGate.objects.count() == 1


def test_a_bad_wait_is_400(operator_api, tenant):
    gate = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    for wait in ("61", "-1", "soon"):
        response = operator_api.get(f"/api/v1/gates/{gate['id']}/?wait={wait}")
        assert response.status_code == 400
        assert "wait" in response.json()["error"]["fields"]


def test_a_rule_that_keeps_the_starter_out_keeps_the_asker_out(
    operator_api, tenant, admin_user, api_client_for
):
    ApprovalPolicyRule.objects.create(
        tenant=tenant, name="four eyes", tool="wire_*", action="require_approval",
        starter_may_approve=False,
    )  # fmt: skip
    gate = operator_api.post("/api/v1/gates/", ASK, format="json").json()
    assert gate["status"] == "pending" and gate["reason"].endswith("four eyes")
    url = f"/api/v1/approvals/{gate['approval_id']}/decide/"
    refused = operator_api.post(url, {"decision": "approve"}, format="json")
    assert refused.status_code == 403
    assert "asked" in refused.json()["error"]["message"]
    assert ExternalGate.objects.get(id=gate["id"]).status == "pending"
    admin = api_client_for(admin_user, tenant)
    assert admin.post(url, {"decision": "approve"}, format="json").status_code == 200
    assert ExternalGate.objects.get(id=gate["id"]).status == "approved"


def test_with_nobody_else_to_approve_the_call_is_denied(
    tenant, admin_user, api_client_for
):
    ApprovalPolicyRule.objects.create(
        tenant=tenant, name="four eyes", tool="wire_*", action="require_approval",
        starter_may_approve=False,
    )  # fmt: skip
    gate = api_client_for(admin_user, tenant).post("/api/v1/gates/", ASK, format="json")
    assert gate.json()["status"] == "denied"
    assert "this tenant has none" in gate.json()["reason"]
    assert not ApprovalRequest.objects.exists()
