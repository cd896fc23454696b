"""The eleven demo scripts (docs/demo.md), each started the way the `/demos/`
page starts it (the API, as the demo operator) and run by a real Celery worker
on the scripted model; each asserts what a person would see: the answer, the
replacements shipped, the stop reason, the approval's state."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import close_old_connections
from django.utils import timezone

from approvals.models import ApprovalRequest
from runs.demo import (
    DEMO_CUSTOMER,
    DEMO_EVAL_SUITE,
    INJECTION_REFUSAL,
    LOOP_TURNS,
    demo_seed_eval_task_07,
    demo_seed_shop,
)
from runs.demo_scripts import DEMO_SCRIPTS
from runs.engine.hooks import DEFAULT_ESCALATION
from runs.memory import MEMORY_TRUST_LABEL
from runs.models import Agent, AgentVersion, EvalRun, Run, RunReview, ToolCall
from shop.models import Refund, Replacement, ShopOrder
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(tenant: Any) -> Any:
    demo_seed_shop(tenant=tenant)
    demo_seed_eval_task_07(tenant=tenant)
    return tenant


@pytest.fixture
def operator_api(seeded: Any, operator_user: Any, api_client_for: Any) -> Any:
    return api_client_for(operator_user, seeded)


def start(api: Any, slug: str) -> str:
    response = api.post(f"/api/v1/demo-scripts/{slug}/start/", format="json")
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def settled(run_id: str, timeout: float = 90) -> Run:
    def ended() -> Run | None:
        run = Run.objects.get(id=run_id)
        return run if run.is_terminal else None

    return wait_for(ended, timeout=timeout, what=f"run {run_id} to end")


def pending_approval(run_id: str) -> ApprovalRequest:
    return wait_for(
        lambda: ApprovalRequest.objects.filter(
            run_id=run_id, status=ApprovalRequest.Status.PENDING
        ).first(),
        timeout=60,
        what="the replacement to ask for approval",
    )


def decide(api: Any, approval: ApprovalRequest, decision: str, reason: str = "") -> Any:
    return api.post(
        f"/api/v1/approvals/{approval.id}/decide/",
        {"decision": decision, "reason": reason},
        format="json",
    )


def calls(run: Run) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run=run).order_by("step__index", "position"))


def world_replacements(run: Run) -> int:
    return Replacement.objects.filter(order__world_id=run.world_id).count()


def real_shop_untouched(tenant: Any) -> None:
    real = ShopOrder.objects.filter(tenant=tenant, world=None)
    assert not Replacement.objects.filter(order__in=real).exists()
    assert not Refund.objects.filter(order__in=real).exists()


def test_the_page_lists_eleven_scripts_and_the_seed_installs_their_agents(
    seeded, operator_api
):
    numbers = {s.number.rstrip("b") for s in DEMO_SCRIPTS}
    assert numbers == {str(n) for n in range(1, 12)}
    listed = operator_api.get("/api/v1/demo-scripts/").json()
    assert [s["slug"] for s in listed] == [s.slug for s in DEMO_SCRIPTS]
    for script in DEMO_SCRIPTS:
        assert Agent.objects.filter(tenant=seeded, slug=script.agent).exists()
    # Seeding again writes no new version and no second memory entry.
    versions = AgentVersion.objects.count()
    demo_seed_shop(tenant=seeded)
    assert AgentVersion.objects.count() == versions
    orders = ShopOrder.objects.filter(tenant=seeded, world=None)
    assert sorted(o.order_id for o in orders) == ["4790", "4821"]


def test_an_unknown_script_is_404_and_a_viewer_may_not_start_one(
    seeded, viewer_user, api_client_for, operator_api
):
    assert operator_api.post("/api/v1/demo-scripts/nope/start/").status_code == 404
    viewer = api_client_for(viewer_user, seeded)
    assert viewer.get("/api/v1/demo-scripts/").status_code == 200
    refused = viewer.post("/api/v1/demo-scripts/happy-path/start/")
    assert refused.status_code == 403
    assert not Run.objects.exists()


def test_a_script_of_an_unseeded_tenant_is_a_400_naming_the_agent(
    tenant, operator_user, api_client_for
):
    api = api_client_for(operator_user, tenant)
    refused = api.post("/api/v1/demo-scripts/happy-path/start/")
    assert refused.status_code == 400
    assert "agent" in refused.json()["error"]["fields"]
    assert not Run.objects.exists()


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_1_happy_path(seeded, operator_api, celery_worker_process):
    run_id = start(operator_api, "happy-path")
    assert decide(operator_api, pending_approval(run_id), "approve").status_code == 200
    run = settled(run_id)
    assert run.status == Run.Status.SUCCEEDED, (run.stop_reason, run.stop_detail)
    assert run.end_user == DEMO_CUSTOMER
    replacement = Replacement.objects.get(order__world_id=run.world_id)
    assert run.final_answer == (
        "I'm sorry about the dented spout. A replacement kettle is on its way and "
        f"will arrive on {replacement.delivery_date.isoformat()}."
    )
    assert [c.tool_name for c in calls(run)] == [
        "lookup_order", "create_replacement", "get_delivery_date"
    ]  # fmt: skip
    real_shop_untouched(seeded)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_2_deny_asks_the_customer_for_a_photo(
    seeded, operator_api, celery_worker_process
):
    run_id = start(operator_api, "deny-ask-for-photo")
    approval = pending_approval(run_id)
    denied = decide(
        operator_api, approval, "deny", "ask the customer for a photo first"
    )
    assert denied.status_code == 200, denied.content
    run = settled(run_id)
    assert world_replacements(run) == 0
    answer = run.final_answer
    assert "could you send us a photo of the damage?" in answer
    assert "on its way" not in answer and "colleague" not in answer
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.DENIED
    # The evaluator says what happened: nothing was shipped.
    assert run.status == Run.Status.FAILED
    assert "no replacement was shipped" in run.evaluation["reason"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_3_double_click_approve_ships_one_replacement(
    seeded, operator_user, api_client_for, celery_worker_process
):
    run_id = start(api_client_for(operator_user, seeded), "double-click-approve")
    approval = pending_approval(run_id)
    answers: list[int] = []
    barrier = threading.Barrier(2)

    def click() -> None:
        api = api_client_for(operator_user, seeded)
        barrier.wait()
        try:
            answers.append(decide(api, approval, "approve").status_code)
        finally:
            close_old_connections()

    clicks = [threading.Thread(target=click) for _ in range(2)]
    for thread in clicks:
        thread.start()
    for thread in clicks:
        thread.join(30)
    assert sorted(answers) == [200, 409]
    run = settled(run_id)
    assert run.status == Run.Status.SUCCEEDED
    assert world_replacements(run) == 1
    replace = next(c for c in calls(run) if c.tool_name == "create_replacement")
    assert (replace.status, replace.attempts) == ("succeeded", 1)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_4_crash_after_create_replacement_recovers_without_a_second_kettle(
    seeded, operator_api, celery_worker_process
):
    run_id = start(operator_api, "crash-after-replacement")
    decide(operator_api, pending_approval(run_id), "approve")
    run = settled(run_id, timeout=150)
    assert run.status == Run.Status.UNVERIFIED, (run.stop_reason, run.stop_detail)
    assert world_replacements(run) == 1
    replace = next(c for c in calls(run) if c.tool_name == "create_replacement")
    # Killed once after its effect, re-run with the same key: the first kettle.
    assert (replace.status, replace.attempts) == ("succeeded", 2)
    assert replace.result["data"]["created"] is False
    assert "is on its way" in run.final_answer


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_4b_crash_with_key_support_off_ends_in_status_unknown(
    seeded, operator_api, celery_worker_process
):
    run_id = start(operator_api, "crash-without-keys")
    decide(operator_api, pending_approval(run_id), "approve")
    run = settled(run_id, timeout=150)
    replace = next(c for c in calls(run) if c.tool_name == "create_replacement")
    assert (replace.status, replace.attempts) == ("unknown", 1)
    assert replace.result["error"]["code"] == "EUNKNOWN"
    assert world_replacements(run) == 1  # it happened once and was never repeated
    assert "cannot confirm that it went through" in run.final_answer
    assert "on its way" not in run.final_answer
    assert "get_delivery_date" not in [c.tool_name for c in calls(run)]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_5_late_approval_after_a_refund_is_blocked_by_the_resume_recheck(
    seeded, operator_api, celery_worker_process
):
    run_id = start(operator_api, "late-approval")
    approval = pending_approval(run_id)
    run = Run.objects.get(id=run_id)
    refund = wait_for(
        lambda: Refund.objects.filter(order__world_id=run.world_id).first(),
        what="the refund made while the approval waits",
    )
    assert refund.amount == refund.order.amount
    # Two days pass before anyone decides: the request was asked for then (its
    # expiry, a day from now, keeps it open: a tenant whose rule waits longer).
    ApprovalRequest.objects.filter(id=approval.id).update(
        requested_at=timezone.now() - dt.timedelta(days=2)
    )
    assert decide(operator_api, approval, "approve").status_code == 200
    run = settled(run_id)
    assert world_replacements(run) == 0
    replace = next(c for c in calls(run) if c.tool_name == "create_replacement")
    assert replace.status != ToolCall.Status.SUCCEEDED
    assert "refunded in full" in replace.result["error"]["message"]
    assert "already been refunded in full" in run.final_answer
    assert "on its way" not in run.final_answer
    real_shop_untouched(seeded)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_6_injection_message_trips_the_guardrail(
    seeded, operator_api, celery_worker_process
):
    run = settled(start(operator_api, "injection"))
    assert (run.status, run.stop_reason) == ("policy_blocked", "guardrail_tripped")
    assert run.final_answer == INJECTION_REFUSAL
    assert calls(run) == [] and run.steps == 0  # the model was never asked
    assert not Refund.objects.exists()
    review = RunReview.objects.get(run=run)
    assert (review.guardrail, review.verdict) == ("injection", "tripped")


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_7_hash_order_number_gets_an_actionable_schema_error(
    seeded, operator_api, celery_worker_process
):
    run = settled(start(operator_api, "schema-error"))
    first, second = calls(run)
    assert first.args == {"order_id": "#4821"}
    assert first.status == ToolCall.Status.REFUSED  # never reached the tool
    error = first.result["error"]
    assert error["code"] == "EINVAL"
    assert error["message"] == (
        "$.order_id: '#4821' does not match '^[0-9]{4}$'; expected: Order number "
        'without "#", e.g. "4821" (four digits).'
    )
    assert (second.args, second.status) == ({"order_id": "4821"}, "succeeded")
    assert run.final_answer.startswith(
        "I found order 4821: the Copper kettle, 1.7 l, delivered."
    )


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_8_not_found_suggests_the_customers_recent_order_and_asks(
    seeded, operator_api, celery_worker_process
):
    run = settled(start(operator_api, "not-found"))
    [lookup] = calls(run)
    assert lookup.status == ToolCall.Status.FAILED
    message = lookup.result["error"]["message"]
    assert message.startswith("there is no order 4812. This customer's most recent")
    assert "4821 (Copper kettle, 1.7 l" in message
    assert message.endswith("Ask the customer to confirm before acting.")
    delivered = ShopOrder.objects.get(world_id=run.world_id, order_id="4821")
    assert run.final_answer == (
        "I'm sorry, I couldn't find an order 4812. Your most recent order is 4821 "
        f"(the Copper kettle, 1.7 l, delivered {delivered.delivery_date}). Is that "
        "the one that arrived damaged? Please confirm and I'll take it from there."
    )
    assert world_replacements(run) == 0


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_9_follow_up_a_week_later_reads_the_memory(
    seeded, operator_api, celery_worker_process
):
    run = settled(start(operator_api, "follow-up"))
    recall, lookup = calls(run)
    assert (recall.tool_name, recall.status) == ("memory", "succeeded")
    assert recall.result["data"]["trust"] == MEMORY_TRUST_LABEL
    assert "2026-10-29 · chose replacement for order 4821" in run.final_answer
    assert "Shall I send another replacement for order 4821" in run.final_answer
    assert world_replacements(run) == 0


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_10_a_looping_model_stops_at_ten_turns_and_escalates(
    seeded, operator_api, celery_worker_process
):
    run = settled(start(operator_api, "budget-exhaustion"))
    # The escalate hook runs once the run's end is committed: its review and
    # answer land together a moment after the run reads ended.
    wait_for(RunReview.objects.filter(run=run).exists, what="the escalation's review")
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("budget_exhausted", "max_steps")
    assert run.steps == LOOP_TURNS
    assert len(calls(run)) == LOOP_TURNS
    assert run.final_answer == DEFAULT_ESCALATION
    review = RunReview.objects.get(run=run)
    assert (review.verdict, review.status) == ("escalated", "open")
    assert review.reason.startswith("stopped max_steps")
    listed = operator_api.get("/api/v1/reviews/?status=open").json()["results"]
    assert [r["run"] for r in listed] == [str(run.id)]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_11_eval_run_of_task_07_five_times_reports_pass_at_1_and_pass_hat_k(
    seeded, operator_api, celery_worker_process
):
    response = operator_api.post("/api/v1/demo-scripts/eval-task-07/start/")
    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "eval_run"

    def finished() -> EvalRun | None:
        found = EvalRun.objects.get(id=response.json()["id"])
        return found if found.status == EvalRun.Status.FINISHED else None

    eval_run = wait_for(finished, timeout=180, what="the eval run to finish")
    assert eval_run.suite.slug == DEMO_EVAL_SUITE
    assert eval_run.k == 5
    summary = eval_run.summary
    assert summary["trials"] == 5
    assert (summary["pass_at_1"], summary["pass_hat_k"]) == (1.0, 1.0)
    assert Replacement.objects.filter(order__world__isnull=False).count() == 5
    real_shop_untouched(seeded)
