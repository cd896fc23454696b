"""The approvals, rules, settings and audit API: tenant scoping, roles, bad input."""

from __future__ import annotations

from approvals.models import ApprovalDecision, ApprovalPolicyRule, ApprovalRequest
from controlplane.models import AuditEvent
from runs.models import Run
from shop.models import Refund
from tests.approvals.conftest import REFUND_ARGS, call, script_of


def url(approval, action=""):
    return f"/api/v1/approvals/{approval.id}/{action}"


def test_pending_list_shows_run_tool_args_rule_and_times(
    waiting_run, operator_user, viewer_user, api_client_for, tenant
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    body = (
        api_client_for(viewer_user, tenant)
        .get("/api/v1/approvals/?status=pending")
        .json()
    )
    assert body["count"] == 1
    item = body["results"][0]
    assert item["id"] == str(approval.id)
    assert item["run"] == str(run.id)
    assert item["tool"] == "refund" and item["args"] == REFUND_ARGS
    assert item["rule"] == "default.side_effect"
    assert item["requested_at"] and item["expires_at"]
    client = api_client_for(viewer_user, tenant)
    assert client.get("/api/v1/approvals/?status=approved").json()["count"] == 0
    assert client.get(url(approval)).json()["status"] == "pending"


def test_another_tenants_approval_is_not_found_and_not_decided(
    waiting_run, operator_user, other_tenant, make_member, api_client_for
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    stranger = make_member(other_tenant, "otto", "admin")
    client = api_client_for(stranger, other_tenant)
    assert client.get("/api/v1/approvals/").json()["count"] == 0
    assert client.get(url(approval)).status_code == 404
    response = client.post(
        url(approval, "decide/"), {"decision": "approve"}, format="json"
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_viewer_gets_403_and_nothing_changes(
    waiting_run, operator_user, viewer_user, api_client_for, tenant
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    response = api_client_for(viewer_user, tenant).post(
        url(approval, "decide/"), {"decision": "approve"}, format="json"
    )
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert not ApprovalDecision.objects.exists()


def test_approve_then_a_second_decision_gets_409_with_the_current_state(
    waiting_run, operator_user, admin_user, api_client_for, tenant
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    first = api_client_for(operator_user, tenant).post(
        url(approval, "decide/"), {"decision": "approve", "reason": "ok"}, format="json"
    )
    assert first.status_code == 200, first.json()
    assert first.json()["status"] == "approved"
    assert first.json()["decided_by"] == "oscar-operator"
    second = api_client_for(admin_user, tenant).post(
        url(approval, "decide/"), {"decision": "deny", "reason": "no"}, format="json"
    )
    assert second.status_code == 409
    error = second.json()["error"]
    assert error["code"] == "already_decided"
    assert error["approval"]["status"] == "approved"
    assert ApprovalDecision.objects.count() == 1
    audit = AuditEvent.objects.filter(action__in=["approval.approve", "approval.deny"])
    assert audit.count() == 1
    assert audit.get().remote_addr == "127.0.0.1"
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_bad_decisions_are_4xx_json_naming_the_problem_and_change_nothing(
    waiting_run, operator_user, admin_user, api_client_for, tenant
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    client = api_client_for(operator_user, tenant)
    cases = [
        ({"decision": "maybe"}, "decision"),
        ({"decision": "approve", "scope": "forever"}, "scope"),
        ({"decision": "approve", "colour": "red"}, "colour"),
        ({"decision": "approve", "args": {"order_id": "4821"}}, "args"),
        ({"decision": "deny", "args": REFUND_ARGS}, "args"),
        ({}, "decision"),
    ]
    for body, field in cases:
        response = client.post(url(approval, "decide/"), body, format="json")
        assert response.status_code == 400, (body, response.json())
        assert field in response.json()["error"]["fields"], (body, response.json())
    # A tenant that requires a reason on a deny.
    settings_response = api_client_for(admin_user, tenant).put(
        "/api/v1/approval-settings/", {"deny_reason_required": True}, format="json"
    )
    assert settings_response.status_code == 200
    response = client.post(
        url(approval, "decide/"), {"decision": "deny"}, format="json"
    )
    assert response.status_code == 400
    assert "reason" in response.json()["error"]["fields"]
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.args_snapshot == REFUND_ARGS
    assert not ApprovalDecision.objects.exists()
    assert (
        not AuditEvent.objects.filter(action__startswith="approval.")
        .exclude(action="approval.request")
        .exists()
    )


def test_approve_with_edited_args_through_the_api(
    waiting_run, operator_user, api_client_for, tenant
):
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    edited = {**REFUND_ARGS, "amount": 10}
    response = api_client_for(operator_user, tenant).post(
        url(approval, "decide/"),
        {"decision": "approve", "args": edited},
        format="json",
    )
    assert response.status_code == 200, response.json()
    data = response.json()
    assert data["args"] == edited and data["original_args"] == REFUND_ARGS
    assert data["args_edited_by"] == "oscar-operator"
    assert Refund.objects.count() == 0  # nothing runs inside the request


def test_admins_edit_rules_and_every_change_is_audited(
    admin_user, operator_user, api_client_for, tenant
):
    client = api_client_for(admin_user, tenant)
    rule = {
        "name": "big refunds",
        "tool": "refund",
        "conditions": [{"arg": "amount", "op": ">", "value": 100}],
        "action": "require_approval",
        "approvals_required": 2,
        "ttl_seconds": 3600,
    }
    created = client.post("/api/v1/approval-rules/", rule, format="json")
    assert created.status_code == 201, created.json()
    rule_id = created.json()["id"]
    assert created.json()["approver_roles"] == ["admin", "operator"]
    changed = client.patch(
        f"/api/v1/approval-rules/{rule_id}/", {"position": 5}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["position"] == 5
    listed = api_client_for(operator_user, tenant).get("/api/v1/approval-rules/")
    assert [r["id"] for r in listed.json()] == [rule_id]
    assert client.delete(f"/api/v1/approval-rules/{rule_id}/").status_code == 204
    assert not ApprovalPolicyRule.objects.exists()
    actions = list(
        AuditEvent.objects.filter(object_type="approval_rule")
        .order_by("id")
        .values_list("action", "before", "after")
    )
    assert [a[0] for a in actions] == [
        "approval_rule.create",
        "approval_rule.update",
        "approval_rule.delete",
    ]
    assert actions[1][1]["position"] == 0 and actions[1][2]["position"] == 5


def test_malformed_rules_are_refused_naming_the_problem(
    admin_user, operator_user, api_client_for, tenant
):
    client = api_client_for(admin_user, tenant)
    base = {"name": "r", "tool": "refund", "action": "deny"}
    cases = [
        ({**base, "colour": "red"}, "colour"),
        ({**base, "tool": "ref[und"}, "tool"),
        ({**base, "tool": "re fund"}, "tool"),
        ({**base, "conditions": [{"arg": "colour", "op": "==", "value": 1}]},
         "conditions"),
        ({**base, "conditions": [{"arg": "reason", "op": ">", "value": 1}]},
         "conditions"),
        ({**base, "conditions": [{"arg": "amount", "op": "~", "value": 1}]},
         "conditions"),
        ({**base, "action": "shrug"}, "action"),
        ({**base, "effects": ["teleport"]}, "effects"),
        ({**base, "approver_roles": ["viewer"]}, "approver_roles"),
        ({**base, "approvals_required": 0}, "approvals_required"),
        ({"tool": "refund"}, "name"),
    ]  # fmt: skip
    for body, field in cases:
        response = client.post("/api/v1/approval-rules/", body, format="json")
        assert response.status_code == 400, body
        assert field in response.json()["error"]["fields"], (body, response.json())
    assert not ApprovalPolicyRule.objects.exists()
    assert not AuditEvent.objects.filter(object_type="approval_rule").exists()
    # Operators may read but not write.
    response = api_client_for(operator_user, tenant).post(
        "/api/v1/approval-rules/", base, format="json"
    )
    assert response.status_code == 403
    assert not ApprovalPolicyRule.objects.exists()


def test_audit_log_is_for_tenant_admins_and_scoped_to_the_tenant(
    waiting_run, admin_user, operator_user, api_client_for, tenant, other_tenant,
    make_member,
):  # fmt: skip
    run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    api_client_for(operator_user, tenant).post(
        url(approval, "decide/"), {"decision": "approve"}, format="json"
    )
    assert (
        api_client_for(operator_user, tenant).get("/api/v1/audit/").status_code == 403
    )
    body = (
        api_client_for(admin_user, tenant)
        .get(f"/api/v1/audit/?object_type=approval&object_id={approval.id}")
        .json()
    )
    assert [e["action"] for e in body["results"]] == [
        "approval.approve",
        "approval.request",
    ]
    decided = body["results"][0]
    assert decided["actor"] == "oscar-operator"
    assert decided["before"]["status"] == "pending"
    assert decided["after"]["status"] == "approved"
    outsider = make_member(other_tenant, "otto", "admin")
    assert (
        api_client_for(outsider, other_tenant)
        .get("/api/v1/audit/?object_type=approval")
        .json()["count"]
        == 0
    )
    assert ApprovalRequest.objects.get().status == "approved"


def test_the_inbox_context_and_the_decided_list_with_decider_and_reason(
    waiting_run, operator_user, admin_user, viewer_user, api_client_for, tenant
):
    said = {"text": "Refunding order 4821, as the customer asked.",
            "tool_calls": [call("refund", REFUND_ARGS)]}  # fmt: skip
    run, approval = waiting_run([said, {"text": "Done."}])
    client = api_client_for(viewer_user, tenant)
    item = client.get("/api/v1/approvals/?status=pending").json()["results"][0]
    assert item["agent"] == "scripted" and item["run_input"] == "help"
    assert item["last_model_message"] == "Refunding order 4821, as the customer asked."
    assert client.get("/api/v1/approvals/?status=decided").json()["count"] == 0
    response = api_client_for(admin_user, tenant).post(
        url(approval, "decide/"),
        {"decision": "deny", "reason": "refunds go through finance"},
        format="json",
    )
    assert response.status_code == 200
    decided = client.get("/api/v1/approvals/?status=decided").json()
    assert decided["count"] == 1
    row = decided["results"][0]
    assert row["status"] == "denied" and row["decided_by"] == admin_user.username
    assert row["reason"] == "refunds go through finance" and row["decided_at"]
    assert row["decisions"][0]["user"] == admin_user.username
    by_admin = f"/api/v1/approvals/?status=decided&decided_by={admin_user.username}"
    assert client.get(by_admin).json()["count"] == 1
    by_other = f"/api/v1/approvals/?status=decided&decided_by={operator_user.username}"
    assert client.get(by_other).json()["count"] == 0
    bad = client.get("/api/v1/approvals/?status=sort-of")
    assert bad.status_code == 400 and "status" in bad.json()["error"]["fields"]


def test_the_not_found_page_is_the_products_own(client, operator_user, tenant):
    anonymous = client.get("/no-such-page/")
    assert anonymous.status_code == 404
    assert b"Page not found" in anonymous.content
    assert (
        b"frontend/app.css" in anonymous.content
        and b'href="/login/"' in anonymous.content
    )
    client.force_login(operator_user)
    page = client.get("/no-such-page/")
    assert page.status_code == 404
    assert b"Nothing lives at <code>/no-such-page/</code>" in page.content
    assert (
        b"Back to the runs list" in page.content
        and b'aria-label="Main"' in page.content
    )
    assert client.get("/api/v1/nothing-here/").json()["error"]["code"] == "not_found"
