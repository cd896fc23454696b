"""Bad input is a 4xx JSON error naming the problem, never a 500, and writes
nothing: list filters, oversized bodies, deep nesting and NUL characters, through
the real HTTP entry points. (/v1/traces has its own: tests/tracing.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from approvals.models import ApprovalDecision, ApprovalPolicyRule, ApprovalRequest
from controlplane.models import AuditEvent
from runs.models import Run
from tests.approvals.conftest import REFUND_ARGS, call, script_of

FIFTY_MB = 50 * 1024 * 1024


@pytest.fixture
def admin_api(tenant: Any, admin_user: Any, api_client_for: Any) -> Any:
    return api_client_for(admin_user, tenant)


@pytest.fixture
def pending(waiting_run: Any, admin_user: Any) -> ApprovalRequest:
    _run, approval = waiting_run(script_of(call("refund", REFUND_ARGS)))
    return approval


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    return response.json()["error"]  # type: ignore[no-any-return]


def post_raw(client: Any, path: str, body: bytes | str) -> Any:
    return client.generic("POST", path, body, content_type="application/json")


def assert_still_pending(approval: ApprovalRequest) -> None:
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not ApprovalDecision.objects.filter(request=approval).exists()
    decided = ("approval.approve", "approval.deny")
    assert not AuditEvent.objects.filter(action__in=decided).exists()


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("/api/v1/approvals/?run=abc", "run"),
        ("/api/v1/approvals/?status=maybe", "status"),
        ("/api/v1/runs/?status=maybe", "status"),
        ("/api/v1/runs/?agent=Not%20a%20slug", "agent"),
        ("/api/v1/audit/?object_id=" + "x" * 65, "object_id"),
        ("/api/v1/runs/?limit=abc", "limit"),
        ("/api/v1/runs/?limit=0", "limit"),
        ("/api/v1/approvals/?limit=-5", "limit"),
        ("/api/v1/audit/?offset=100000000000000000000", "offset"),
        ("/api/v1/runs/?offset=-1", "offset"),
        ("/api/v1/audit/?action=run.start%00", "action"),
        ("/api/v1/runs/?agent=kettlecraft%00", "agent"),
    ],
)
def test_a_bad_list_filter_is_a_400_naming_the_parameter(
    demo_agent: Any, admin_api: Any, query: str, parameter: str
) -> None:
    error = error_of(admin_api.get(query), 400)
    assert error["code"] == "invalid"
    assert parameter in error["fields"], error


def test_a_limit_above_the_maximum_is_served_as_the_maximum(
    demo_agent: Any, admin_api: Any
) -> None:
    for limit in ("5000", "100000000000000000000000"):
        page = admin_api.get(f"/api/v1/runs/?limit={limit}")
        assert page.status_code == 200, page.content
        assert page.json()["count"] == 0


def test_a_valid_run_filter_on_approvals_still_filters(
    pending: ApprovalRequest, admin_api: Any
) -> None:
    found = admin_api.get(f"/api/v1/approvals/?run={pending.run_id}").json()
    assert [row["id"] for row in found["results"]] == [str(pending.id)]
    empty = admin_api.get("/api/v1/approvals/?run=&status=").json()
    assert empty["count"] == 1


def test_a_50_mb_run_start_is_a_413_and_starts_nothing(
    demo_agent: Any, admin_api: Any
) -> None:
    body = json.dumps({"agent": demo_agent.slug, "input": "x" * FIFTY_MB})
    error = error_of(post_raw(admin_api, "/api/v1/runs/", body), 413)
    assert error["code"] == "too_large"
    assert "API_MAX_BODY_BYTES" in error["message"]
    assert Run.objects.count() == 0
    assert not AuditEvent.objects.filter(action="run.start").exists()


def test_a_50_mb_decision_is_a_413_and_decides_nothing(
    pending: ApprovalRequest, admin_api: Any
) -> None:
    body = json.dumps({"decision": "approve", "reason": "x" * FIFTY_MB})
    path = f"/api/v1/approvals/{pending.id}/decide/"
    error = error_of(post_raw(admin_api, path, body), 413)
    assert error["code"] == "too_large"
    assert_still_pending(pending)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [65, 5_000, 200_000])
def test_deeply_nested_json_is_a_400_on_run_start_and_decide(
    pending: ApprovalRequest, admin_api: Any, levels: int
) -> None:
    body = json.dumps({"agent": "scripted", "input": "hi", "limits": "@"})
    body = body.replace('"@"', deep(levels))
    error = error_of(post_raw(admin_api, "/api/v1/runs/", body), 400)
    assert "nests" in error["message"] and "64" in error["message"], error
    runs_before = Run.objects.count()
    decide = json.dumps({"decision": "approve", "args": "@"}).replace(
        '"@"', deep(levels)
    )
    path = f"/api/v1/approvals/{pending.id}/decide/"
    error = error_of(post_raw(admin_api, path, decide), 400)
    assert "nests" in error["message"], error
    assert Run.objects.count() == runs_before
    assert_still_pending(pending)


def test_nesting_up_to_the_bound_reaches_the_view(
    demo_agent: Any, admin_api: Any
) -> None:
    # 64 levels with the body object: parsed, then refused by the view's own check.
    body = json.dumps({"agent": demo_agent.slug, "input": "hi", "limits": "@"})
    error = error_of(
        post_raw(admin_api, "/api/v1/runs/", body.replace('"@"', deep(63))), 400
    )
    assert "limits" in error["fields"], error
    assert Run.objects.count() == 0


def test_brackets_inside_strings_do_not_count_as_nesting(
    tenant: Any, admin_api: Any
) -> None:
    rule = {"name": "[{" * 50, "tool": "refund", "action": "deny"}
    response = admin_api.post("/api/v1/approval-rules/", rule, format="json")
    assert response.status_code == 201, response.content


def test_nul_characters_are_refused_everywhere_and_nothing_is_stored(
    pending: ApprovalRequest, admin_api: Any
) -> None:
    rules_before = ApprovalPolicyRule.objects.count()
    rule = {"name": "evil\u0000rule", "tool": "refund", "action": "deny"}
    error = error_of(
        admin_api.post("/api/v1/approval-rules/", rule, format="json"), 400
    )
    assert "NUL" in error["message"]
    assert ApprovalPolicyRule.objects.count() == rules_before

    path = f"/api/v1/approvals/{pending.id}/decide/"
    edited = {**REFUND_ARGS, "reason": "dented\u0000spout"}
    decision = {"decision": "approve", "args": edited}
    error = error_of(admin_api.post(path, decision, format="json"), 400)
    assert "NUL" in error["message"]
    assert_still_pending(pending)
    assert pending.args_snapshot == REFUND_ARGS

    runs_before = Run.objects.count()
    start = {"agent": "scripted", "input": "help", "limits": {"max_steps\u0000": 1}}
    error_of(admin_api.post("/api/v1/runs/", start, format="json"), 400)
    assert Run.objects.count() == runs_before


def test_an_escaped_backslash_before_u0000_is_not_a_nul(
    tenant: Any, admin_api: Any
) -> None:
    rule = {"name": "literally \\u0000", "tool": "refund", "action": "deny"}
    response = admin_api.post("/api/v1/approval-rules/", rule, format="json")
    assert response.status_code == 201, response.content
    assert ApprovalPolicyRule.objects.get().name == "literally \\u0000"
