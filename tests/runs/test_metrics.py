"""GET /metrics: Prometheus text, added up over every process (multiprocess mode),
scraped during real runs on a real Celery worker; protected by METRICS_TOKEN."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import ApprovalRequest
from controlplane.asgi import application
from controlplane.services import api_token_issue
from runs.models import Run, ToolCall
from runs.services import run_start
from tests.conftest import wait_for

TOKEN = "metrics-scrape-token-for-tests"
pytestmark = pytest.mark.usefixtures("metrics_token")


@pytest.fixture
def metrics_token(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN


def scrape(client: Client | None = None) -> dict[tuple[str, frozenset[Any]], float]:
    response = (client or Client()).get(
        "/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples: dict[tuple[str, frozenset[Any]], float] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: dict[Any, float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


@pytest.mark.worker
def test_a_scrape_during_a_real_run_shows_every_process_counters_move(
    demo_agent: Any, operator_user: Any, api_client_for: Any, celery_worker_process: Any
) -> None:
    api = api_client_for(operator_user, demo_agent.tenant)
    before = scrape()

    created = api.post(
        "/api/v1/runs/", {"agent": demo_agent.slug, "input": "Order 4821 is dented"},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    run_id = created.json()["id"]
    wait_for(
        lambda: Run.objects.get(id=run_id).status == Run.Status.WAITING_APPROVAL,
        timeout=60, what="the run to wait for its approval",
    )  # fmt: skip

    during = scrape()
    assert total(during, "controlplane_runs_started_total") == (
        total(before, "controlplane_runs_started_total") + 1
    )
    # Recorded by the worker's pool process, read here: the multiprocess files.
    for name in (
        "controlplane_model_call_duration_seconds_count",
        "controlplane_step_duration_seconds_count",
    ):
        assert total(during, name) > total(before, name), name
    ok = {"tool": "lookup_order", "status": "succeeded"}
    assert value(during, "controlplane_tool_calls_total", **ok) == (
        value(before, "controlplane_tool_calls_total", **ok) + 1
    )
    assert total(during, "controlplane_model_tokens_total") > total(
        before, "controlplane_model_tokens_total"
    )
    # Read from the database at scrape time.
    assert value(during, "controlplane_runs_waiting_for_human") >= 1
    assert value(during, "controlplane_runs_open", status="waiting_approval") >= 1
    assert value(during, "controlplane_approval_oldest_pending_seconds") > 0
    assert value(during, "controlplane_queue_depth") >= 0

    approval = ApprovalRequest.objects.get(run_id=run_id)
    decided = api.post(
        f"/api/v1/approvals/{approval.id}/decide/", {"decision": "approve"},
        format="json",
    )  # fmt: skip
    assert decided.status_code == 200, decided.content
    wait_for(
        lambda: Run.objects.get(id=run_id).status == Run.Status.SUCCEEDED,
        timeout=60, what="the run to succeed",
    )  # fmt: skip

    after = scrape()
    ended = {"status": "succeeded", "stop_reason": "done"}
    assert value(after, "controlplane_runs_ended_total", **ended) == (
        value(before, "controlplane_runs_ended_total", **ended) + 1
    )
    decision = "controlplane_approval_time_to_decision_seconds_count"
    assert value(after, decision, decision="approved") == (
        value(before, decision, decision="approved") + 1
    )
    shipped = {"tool": "create_replacement", "status": "succeeded"}
    assert value(after, "controlplane_tool_calls_total", **shipped) == (
        value(before, "controlplane_tool_calls_total", **shipped) + 1
    )
    assert value(after, "controlplane_runs_open", status="waiting_approval") == (
        value(before, "controlplane_runs_open", status="waiting_approval")
    )


@pytest.mark.worker
def test_tool_errors_and_sandbox_terminations_are_counted_by_code_and_cause(
    scripted_agent: Any, celery_worker_process: Any
) -> None:
    agent = scripted_agent(
        [
            {"tool_calls": [{"id": "c1", "name": "run_code",
                             "arguments": {"code": "raise SystemExit(3)"}}]},
            {"text": "The program failed."},
        ],
        ["run_code"],
    )  # fmt: skip
    before = scrape()

    run = run_start(tenant=agent.tenant, agent_slug=agent.slug, input="go",
                    started_by=None)  # fmt: skip
    wait_for(lambda: Run.objects.get(id=run.id).is_terminal, timeout=90, what="the run")
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.FAILED
    after = scrape()
    error = {"tool": "run_code", "code": call.result["error"]["code"]}
    assert value(after, "controlplane_tool_errors_total", **error) == (
        value(before, "controlplane_tool_errors_total", **error) + 1
    )
    cause = call.sandbox_result["termination_cause"]
    assert value(after, "controlplane_sandbox_terminations_total", cause=cause) == (
        value(before, "controlplane_sandbox_terminations_total", cause=cause) + 1
    )


def test_a_queued_run_raises_the_queue_depth_and_age(
    demo_agent: Any, transactional_db: Any
) -> None:

    before = scrape()
    run_start(tenant=demo_agent.tenant, agent_slug=demo_agent.slug, input="hi",
              started_by=None)  # fmt: skip
    after = scrape()  # no worker: the step message waits in Redis
    assert value(after, "controlplane_queue_depth") == (
        value(before, "controlplane_queue_depth") + 1
    )
    assert value(after, "controlplane_runs_open", status="queued") == (
        value(before, "controlplane_runs_open", status="queued") + 1
    )
    assert value(after, "controlplane_queue_oldest_age_seconds") >= 0


async def test_open_websocket_streams_are_a_live_gauge(
    demo_agent: Any, tenant: Any, admin_user: Any, transactional_db: Any
) -> None:
    run = await sync_to_async(run_start)(
        tenant=tenant, agent_slug=demo_agent.slug, input="hi",
        started_by=None,
    )  # fmt: skip
    secret = (
        await sync_to_async(api_token_issue)(tenant=tenant, user=admin_user)
    ).secret
    before = await sync_to_async(scrape)()
    ws = WebsocketCommunicator(
        application, f"/ws/runs/{run.id}/",
        headers=[(b"host", b"testserver"), (b"origin", b"http://testserver"),
                 (b"authorization", f"Bearer {secret}".encode())],
    )  # fmt: skip
    assert (await ws.connect())[0]
    await asyncio.sleep(0.1)
    during = await sync_to_async(scrape)()
    await ws.disconnect()
    after = await sync_to_async(scrape)()
    name = "controlplane_websocket_clients"
    assert value(during, name) == value(before, name) + 1
    assert value(after, name) == value(before, name)


def test_metrics_need_the_token_or_a_staff_session(
    tenant: Any, admin_user: Any, make_member: Any
) -> None:
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "not_authenticated"
    assert "controlplane_" not in anonymous.content.decode()
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    assert wrong.status_code == 401
    # A tenant admin is not an operator of the installation.
    member = Client()
    member.force_login(admin_user)
    assert member.get("/metrics").status_code == 401
    # An API token of a tenant is not the metrics token either.
    secret = api_token_issue(tenant=tenant, user=admin_user).secret
    assert (
        Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code
        == 401
    )
    admin_user.is_staff = True
    admin_user.save(update_fields=["is_staff"])
    staff = Client()
    staff.force_login(admin_user)
    response = staff.get("/metrics")
    assert response.status_code == 200
    assert b"controlplane_runs_started_total" in response.content
    assert Client().post("/metrics").status_code in (401, 403, 405)


def test_without_a_token_setting_no_bearer_is_accepted(settings: Any, db: Any) -> None:
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
