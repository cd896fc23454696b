"""Data lifecycle: per-tenant retention by beat's task (on a real worker), deleting
one run through the API, and exporting one run as JSON and as OTLP."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from budgets.models import Budget, BudgetLedgerEntry
from controlplane.models import AuditEvent, Tenant
from runs.demo import demo_seed_shop
from runs.models import Agent, Run, Step, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide
from runs.services.retention import tenant_retention_apply
from runs.tasks import retention_sweep_task
from shop.models import ShopOrder, ShopWorld
from shop.services import shop_worlds_create
from tests.conftest import start_worker, wait_for
from tests.runs.conftest import drive
from tests.tracing.test_secrets_never_shown import SECRETS, partner_api
from tracing.models import RunEvent, Span, SpanPayload

__all__ = ["partner_api"]

ROW_MODELS = {
    "steps": Step,
    "tool_calls": ToolCall,
    "approvals": ApprovalRequest,
    "spans": Span,
    "events": RunEvent,
}


def _rows(run_id: Any) -> dict[str, int]:
    counts = {name: model.objects.filter(run_id=run_id).count()
              for name, model in ROW_MODELS.items()}  # fmt: skip
    counts["approval_decisions"] = ApprovalDecision.objects.filter(
        request__run_id=run_id
    ).count()
    counts["runs"] = Run.objects.filter(id=run_id).count()
    return counts


def _digests(run_ids: list[Any]) -> set[str]:
    return {
        digest
        for refs in Span.objects.filter(run_id__in=run_ids).values_list(
            "payloads", flat=True
        )
        for digest in refs.values()
    }


def _demo_run(agent: Agent, user: Any, *, finish: bool = True) -> Run:
    """A demo run: approved and ended (steps, calls, an approval with a decision,
    spans, payloads, events), or left waiting for the approval."""
    run = run_start(
        tenant=agent.tenant,
        agent_slug=agent.slug,
        input="order 4821 arrived damaged",
        started_by=user,
    )
    run = drive(run)
    assert run.status == Run.Status.WAITING_APPROVAL, run.stop_detail
    if finish:
        approval_decide(
            request=ApprovalRequest.objects.get(run=run),
            decided_by=user,
            approve=True,
            reason="",
        )
        run = drive(run)
        assert run.status == Run.Status.SUCCEEDED, run.stop_detail
    return run


def _age(run: Run, days: float) -> None:
    then = timezone.now() - dt.timedelta(days=days)
    Run.objects.filter(id=run.id).update(
        created_at=then, finished_at=then if run.finished_at else None
    )


@pytest.mark.django_db(transaction=True)
def test_retention_deletes_old_terminal_runs_in_batches_on_a_worker(
    demo_agent: Agent,
    admin_user: Any,
    operator_user: Any,
    other_tenant: Tenant,
    make_member: Any,
    api_client_for: Any,
    tmp_path: Path,
) -> None:
    tenant = demo_agent.tenant
    # A budget, so the runs leave ledger rows (billing records, never deleted).
    Budget.objects.create(
        tenant=tenant,
        period_limits={"day": {"input_tokens": 10**9, "runs": 1000}},
        allow_unknown_price=True,
    )
    old = [_demo_run(demo_agent, operator_user) for _ in range(3)]
    recent = _demo_run(demo_agent, operator_user)
    waiting = _demo_run(demo_agent, operator_user, finish=False)
    for run in old:
        _age(run, 10)
    _age(waiting, 10)  # old, but not terminal: never deleted
    _age(recent, 2)
    demo_seed_shop(tenant=other_tenant)
    other_agent = Agent.objects.get(tenant=other_tenant, slug=demo_agent.slug)
    other_admin = make_member(other_tenant, "other-admin", "admin")
    other_old = _demo_run(other_agent, other_admin)
    _age(other_old, 10)

    # Admins set the retention through the API.
    answer = api_client_for(admin_user, tenant).put(
        "/api/v1/retention/", {"retention_days": 7}, format="json"
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["effective_days"] == 7
    answer = api_client_for(other_admin, other_tenant).put(
        "/api/v1/retention/", {"retention_days": 30}, format="json"
    )
    assert answer.status_code == 200, answer.content

    kept = [recent, waiting]
    kept_before = {run.id: _rows(run.id) for run in kept + [other_old]}
    old_before = [_rows(run.id) for run in old]
    assert all(
        r["spans"] and r["events"] and r["approval_decisions"] for r in old_before
    )
    old_ids = [run.id for run in old]
    shared = _digests(old_ids) & _digests([run.id for run in kept])
    assert shared  # the same system prompt: payloads are shared between runs
    only_old = _digests(old_ids) - _digests([run.id for run in kept])
    assert only_old
    ledger = BudgetLedgerEntry.objects.filter(run_id__in=old_ids).count()
    assert ledger

    worker = start_worker(tmp_path, extra_env={"DATA_RETENTION_BATCH_SIZE": "2"})
    try:
        retention_sweep_task.delay()
        entry = wait_for(
            lambda: AuditEvent.objects.filter(
                tenant=tenant, action="data.retention"
            ).first(),
            timeout=60,
            what="the retention audit entry",
        )
    finally:
        worker.stop()

    for run in old:
        assert _rows(run.id) == dict.fromkeys(_rows(run.id), 0), run.id
    assert not SpanPayload.objects.filter(tenant=tenant, sha256__in=only_old).exists()
    assert SpanPayload.objects.filter(tenant=tenant, sha256__in=shared).count() == len(
        shared
    )
    for run in kept + [other_old]:
        assert _rows(run.id) == kept_before[run.id], run.id
    for run in kept:  # every payload a kept span points at is still there
        digests = _digests([run.id])
        found = SpanPayload.objects.filter(tenant=tenant, sha256__in=digests)
        assert found.count() == len(digests)
    # Billing records stay.
    assert BudgetLedgerEntry.objects.filter(run_id__in=old_ids).count() == ledger

    assert entry.actor is None and entry.object_id == str(tenant.id)
    assert entry.after["retention_days"] == 7
    assert entry.after["batches"] == 2  # 3 runs, 2 per batch
    deleted = entry.after["deleted"]
    for name in ("runs", "steps", "tool_calls", "approvals", "approval_decisions",
                 "spans", "events"):  # fmt: skip
        assert deleted[name] == sum(r[name] for r in old_before), name
    assert deleted["span_payloads"] == len(only_old)
    # The other tenant kept its 10-day-old run (30 days) and needed no entry.
    assert not AuditEvent.objects.filter(
        tenant=other_tenant, action="data.retention"
    ).exists()


def test_the_deployment_default_retention_applies_to_a_tenant_without_its_own(
    demo_agent: Agent, operator_user: Any, settings: Any
) -> None:
    """The deployment's DATA_RETENTION_DAYS applies to a tenant with none of its
    own; 0 (the default) keeps everything."""
    from runs.services.retention import retention_sweep

    run = _demo_run(demo_agent, operator_user)
    _age(run, 40)
    assert retention_sweep() == []
    assert Run.objects.filter(id=run.id).exists()
    settings.DATA_RETENTION_DAYS = 60
    assert retention_sweep()[0].deleted.runs == 0
    assert Run.objects.filter(id=run.id).exists()
    settings.DATA_RETENTION_DAYS = 30
    assert retention_sweep()[0].deleted.runs == 1
    assert not Run.objects.filter(id=run.id).exists()


def test_retention_is_set_by_admins_only_and_checked(
    tenant: Tenant, admin_user: Any, operator_user: Any, viewer_user: Any,
    api_client_for: Any,
) -> None:  # fmt: skip
    for user in (operator_user, viewer_user):
        client = api_client_for(user, tenant)
        assert client.get("/api/v1/retention/").json()["retention_days"] is None
        refused = client.put("/api/v1/retention/", {"retention_days": 1}, format="json")
        assert refused.status_code == 403
    admin = api_client_for(admin_user, tenant)
    for body, field in (
        ({"retention_days": 0}, "retention_days"),
        ({"retention_days": "soon"}, "retention_days"),
        ({}, "retention_days"),
        ({"retention_days": 5, "days": 5}, "days"),
    ):
        answer = admin.put("/api/v1/retention/", body, format="json")
        assert answer.status_code == 400, (body, answer.content)
        assert field in answer.json()["error"]["fields"], answer.json()
    tenant.refresh_from_db()
    assert tenant.retention_days is None
    assert not AuditEvent.objects.filter(action="tenant.retention_set").exists()
    assert admin.put(
        "/api/v1/retention/", {"retention_days": 90}, format="json"
    ).json() == {"retention_days": 90, "default_days": None, "effective_days": 90}
    cleared = admin.put("/api/v1/retention/", {"retention_days": None}, format="json")
    assert cleared.json()["effective_days"] is None
    entries = AuditEvent.objects.filter(action="tenant.retention_set").order_by("id")
    assert [e.after["retention_days"] for e in entries] == [90, None]
    assert entries[0].actor == admin_user


def test_deleting_a_run_is_for_admins_of_its_tenant_and_ended_runs_only(
    demo_agent: Agent,
    admin_user: Any,
    operator_user: Any,
    viewer_user: Any,
    other_tenant: Tenant,
    make_member: Any,
    api_client_for: Any,
) -> None:
    tenant = demo_agent.tenant
    ended = _demo_run(demo_agent, operator_user)
    sibling = _demo_run(demo_agent, operator_user)
    waiting = _demo_run(demo_agent, operator_user, finish=False)
    before = {run.id: _rows(run.id) for run in (ended, sibling, waiting)}
    payloads = SpanPayload.objects.filter(tenant=tenant).count()
    outsider = make_member(other_tenant, "outsider", "admin")

    def unchanged() -> None:
        for run in (ended, sibling, waiting):
            assert _rows(run.id) == before[run.id]
        assert SpanPayload.objects.filter(tenant=tenant).count() == payloads
        assert not AuditEvent.objects.filter(action="run.delete").exists()

    for user in (operator_user, viewer_user):
        refused = api_client_for(user, tenant).delete(f"/api/v1/runs/{ended.id}/")
        assert refused.status_code == 403, refused.content
        assert refused.json()["error"]["code"]
    unchanged()
    hidden = api_client_for(outsider, other_tenant).delete(f"/api/v1/runs/{ended.id}/")
    assert hidden.status_code == 404
    unchanged()
    admin = api_client_for(admin_user, tenant)
    conflict = admin.delete(f"/api/v1/runs/{waiting.id}/")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "conflict"
    assert "cancel it first" in conflict.json()["error"]["message"]
    unchanged()

    only_ended = _digests([ended.id]) - _digests([sibling.id, waiting.id])
    answer = admin.delete(f"/api/v1/runs/{ended.id}/")
    assert answer.status_code == 200, answer.content
    counts = {**before[ended.id], "span_payloads": len(only_ended)}
    assert answer.json() == {"id": str(ended.id), "deleted": counts}
    assert _rows(ended.id) == dict.fromkeys(before[ended.id], 0)
    assert not SpanPayload.objects.filter(sha256__in=only_ended).exists()
    for run in (sibling, waiting):
        assert _rows(run.id) == before[run.id]
        digests = _digests([run.id])
        assert SpanPayload.objects.filter(
            tenant=tenant, sha256__in=digests
        ).count() == (len(digests))
    entry = AuditEvent.objects.get(action="run.delete")
    assert (entry.actor, entry.tenant, entry.object_id) == (
        admin_user,
        tenant,
        str(ended.id),
    )
    assert entry.after == {"deleted": counts}
    assert entry.before["status"] == "succeeded"
    assert admin.get(f"/api/v1/runs/{ended.id}/").status_code == 404
    assert admin.delete(f"/api/v1/runs/{ended.id}/").status_code == 404


def test_export_as_json_holds_the_whole_run_and_no_secret(
    scripted_agent: Any,
    partner_api: list[dict[str, Any]],
    tenant: Tenant,
    viewer_user: Any,
    operator_user: Any,
    other_tenant: Tenant,
    make_member: Any,
    api_client_for: Any,
) -> None:
    from tests.tracing.test_secrets_never_shown import ARGS, AWS_KEY

    call = {"id": "c1", "name": "call_partner_api", "arguments": ARGS}
    scripted_agent(
        [{"text": "", "tool_calls": [call]}, {"text": "Sent."}], ["call_partner_api"]
    )
    run = run_start(
        tenant=tenant,
        agent_slug="scripted",
        input=f"send order 4821; our AWS key is {AWS_KEY}",
        started_by=None,
    )
    run = drive(run)
    approval_decide(
        request=ApprovalRequest.objects.get(run=run),
        decided_by=operator_user,
        approve=True,
        reason="",
    )
    run = drive(run)
    assert run.is_terminal and partner_api  # the tool ran with the secrets

    viewer = api_client_for(viewer_user, tenant)
    answer = viewer.get(f"/api/v1/runs/{run.id}/export/")
    assert answer.status_code == 200, answer.content
    text = answer.content.decode()
    for secret in SECRETS:
        assert secret not in text, secret
    body = answer.json()
    assert body["run"]["id"] == str(run.id)
    assert body["run"]["step_rows"][0]["tool_calls"][0]["args"]["password"] == (
        "[REDACTED]"
    )
    stored = list(Span.objects.filter(run=run))
    assert {(s["span_id"], s["name"], s["parent_span_id"]) for s in body["spans"]} == {
        (s.span_id, s.name, s.parent_span_id) for s in stored
    }
    assert any(s["attributes"].get("gen_ai.tool.name") == "call_partner_api"
               for s in body["spans"])  # fmt: skip
    assert any(s["payload_bodies"] for s in body["spans"])
    assert [e["seq"] for e in body["events"]] == list(
        RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)
    )
    [approval] = body["approvals"]
    assert approval["status"] == "approved"
    assert approval["decisions"][0]["decision"] == "approve"
    assert approval["args"]["api_key"] == "[REDACTED]"

    # Another tenant's member cannot export it; a bad format is named.
    outsider = api_client_for(make_member(other_tenant, "o", "admin"), other_tenant)
    assert outsider.get(f"/api/v1/runs/{run.id}/export/").status_code == 404
    bad = viewer.get(f"/api/v1/runs/{run.id}/export/?format=csv")
    assert bad.status_code == 400
    assert "format" in bad.json()["error"]["fields"]


def test_otlp_export_round_trips_through_otlp_ingest_into_another_tenant(
    scripted_agent: Any,
    partner_api: list[dict[str, Any]],
    tenant: Tenant,
    viewer_user: Any,
    operator_user: Any,
    other_tenant: Tenant,
    make_member: Any,
    api_client_for: Any,
) -> None:
    from controlplane.services import api_token_issue
    from tests.tracing.test_secrets_never_shown import ARGS

    call = {"id": "c1", "name": "call_partner_api", "arguments": ARGS}
    scripted_agent(
        [{"text": "", "tool_calls": [call]}, {"text": "Sent."}], ["call_partner_api"]
    )
    run = run_start(
        tenant=tenant, agent_slug="scripted", input="send it", started_by=None
    )
    run = drive(run)
    approval_decide(
        request=ApprovalRequest.objects.get(run=run),
        decided_by=operator_user,
        approve=True,
        reason="",
    )
    run = drive(run)
    assert run.is_terminal

    viewer = api_client_for(viewer_user, tenant)
    answer = viewer.get(f"/api/v1/runs/{run.id}/export/?format=otlp")
    assert answer.status_code == 200, answer.content
    alias = viewer.get(f"/api/v1/runs/{run.id}/export.otlp.json")
    assert alias.status_code == 200
    assert (
        json.loads(alias.content)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        == (answer.json()["resourceSpans"][0]["scopeSpans"][0]["spans"])
    )
    text = answer.content.decode()
    for secret in SECRETS:
        assert secret not in text, secret
    spans = answer.json()["resourceSpans"][0]["scopeSpans"][0]["spans"]
    root = next(s for s in spans if "parentSpanId" not in s)
    assert root["traceId"] == run.trace_id and len(root["spanId"]) == 16
    assert root["startTimeUnixNano"].isdigit()
    assert int(root["endTimeUnixNano"]) >= int(root["startTimeUnixNano"])
    chat = next(s for s in spans if s["name"].startswith("chat"))
    keys = {a["key"]: a["value"] for a in chat["attributes"]}
    assert set(keys["gen_ai.usage.input_tokens"]) == {"intValue"}
    assert "gen_ai.input.messages" in keys  # the payload, folded back in

    other_admin = make_member(other_tenant, "other-admin", "admin")
    secret = api_token_issue(tenant=other_tenant, user=other_admin).secret
    from django.test import Client

    posted = Client().post(
        "/v1/traces",
        data=answer.content,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    assert posted.status_code == 200, posted.content
    assert posted.json() == {}
    copy = Run.objects.get(tenant=other_tenant, trace_id=run.trace_id)
    assert {
        (s.span_id, s.name, s.parent_span_id) for s in Span.objects.filter(run=copy)
    } == {(s.span_id, s.name, s.parent_span_id) for s in Span.objects.filter(run=run)}
    assert Span.objects.filter(run=copy).count() == len(spans)
    # The original is untouched by its copy.
    assert Span.objects.filter(run=run).count() == len(spans)


def test_an_attribute_nested_deeper_than_ingest_reads_is_exported_as_json_text() -> (
    None
):
    """OTLP ingest refuses values nested deeper than ATTRIBUTE_MAX_DEPTH; the
    export sends such a structure from that depth on as its JSON text instead."""
    from tracing.export import otlp_trace_request
    from tracing.ingest import parse_request
    from tracing.ingest.otlp import ATTRIBUTE_MAX_DEPTH

    deep: Any = "bottom"
    for _ in range(40):
        deep = {"next": deep}
    now = timezone.now()
    span = Span(
        trace_id="a" * 32, span_id="b" * 16, name="deep", started_at=now, ended_at=now
    )
    body = otlp_trace_request(spans=[(span, {"tool.args": deep})], service_name="t")
    [parsed] = parse_request(json.dumps(body).encode(), content_type="application/json")
    value, original = parsed.attributes["tool.args"], deep
    for _ in range(ATTRIBUTE_MAX_DEPTH - 1):  # structured down to the limit
        value, original = value["next"], original["next"]
    assert isinstance(value, str) and json.loads(value) == original


def test_beat_schedules_the_retention_pass(settings: Any) -> None:
    from controlplane.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["runs-retention"]
    assert app.tasks[entry["task"]].name == retention_sweep_task.name
    assert entry["schedule"] == settings.DATA_RETENTION_INTERVAL_SECONDS


@pytest.mark.django_db(transaction=True)
def test_retention_removes_the_eval_worlds_no_run_acts_in_any_more(
    demo_agent: Agent, operator_user: Any, other_tenant: Tenant
) -> None:
    """An eval trial's shop world goes with the tenant's retention once no run
    acts in it: one whose run expired and one no run ever used go; one a
    recent run acts in, one made since the cutoff, the tenant's real shop and
    another tenant's old world stay."""
    tenant = demo_agent.tenant
    order = {"order_id": "4821", "customer": "Ada", "item": "Kettle", "amount": 30}
    expired, in_use, never_used, recent = shop_worlds_create(
        tenant=tenant, orders=[order], labels=["expired", "in use", "never", "recent"]
    )
    (elsewhere,) = shop_worlds_create(
        tenant=other_tenant, orders=[order], labels=["other tenant"]
    )
    old = timezone.now() - dt.timedelta(days=40)
    ShopWorld.objects.exclude(id=recent.id).update(created_at=old)
    gone_run = _demo_run(demo_agent, operator_user)
    kept_run = _demo_run(demo_agent, operator_user)
    Run.objects.filter(id=gone_run.id).update(world_id=expired.id)
    Run.objects.filter(id=kept_run.id).update(world_id=in_use.id)
    _age(gone_run, 40)
    real_orders = ShopOrder.objects.filter(tenant=tenant, world=None).count()
    assert real_orders > 0  # the demo's shop

    report = tenant_retention_apply(tenant=tenant, retention_days=30)

    assert report.deleted.runs == 1 and report.shop_worlds == 2
    left = set(ShopWorld.objects.values_list("label", flat=True))
    assert left == {"in use", "recent", "other tenant"}
    assert not ShopOrder.objects.filter(world_id__in=[expired.id, never_used.id])
    assert ShopOrder.objects.filter(world=in_use).count() == 1
    assert ShopOrder.objects.filter(world=elsewhere).count() == 1
    assert ShopOrder.objects.filter(tenant=tenant, world=None).count() == real_orders
    audit = AuditEvent.objects.get(tenant=tenant, action="data.retention")
    assert audit.after["shop_worlds"] == 2
