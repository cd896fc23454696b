"""A fresh world per trial (docs/evals.md, "A world per trial"): a case's
`world` becomes a shop of its own for each trial; the trial's run reads and
writes only there, the tenant's real shop is untouched, and `world_state`
graders read the trial's world."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from runs.demo import DEMO_CUSTOMER_NAME, DEMO_ORDERS
from runs.engine.envelope import ToolFailure
from runs.engine.tools import ToolContext
from runs.evals.graders import case_grade
from runs.models import EvalRun, EvalTrial, Run
from runs.services.eval_runs import eval_run_start
from runs.services.evals import eval_suite_create
from runs.tools.shop import create_replacement, get_delivery_date, lookup_order
from shop.models import Refund, Replacement, ShopOrder, ShopWorld
from shop.services import shop_world_create
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WORLD_ORDER = {
    "order_id": "4821",
    "customer": "Grace Trial",
    "item": "Copper kettle, 1.7 l",
    "amount": "64.50",
    "damaged": True,
    "delivered_days_ago": 5,
    "note": "Leave at the back door.",
}
CASE = {
    "slug": "own-world",
    "input": "Order #4821 arrived with a dented spout.",
    "world": {"orders": [WORLD_ORDER]},
    "approvals": [{"tool": "create_replacement", "decision": "approve"}],
    "graders": [
        {
            "kind": "world_state",
            "object": "replacements",
            "order_id": "4821",
            "count": 1,
        },
        {"kind": "world_state", "object": "refunds", "order_id": "4821", "count": 0},
    ],  # fmt: skip
}


def _ctx(tenant: Any, world: ShopWorld | None, call_id: str) -> ToolContext:
    return ToolContext.for_call(
        f"run-{call_id}",
        call_id,
        tenant_id=str(tenant.id),
        world_id="" if world is None else str(world.id),
    )


def test_the_shop_tools_read_and_write_only_the_calls_world(shop):
    real = ShopOrder.objects.get(tenant=shop, world=None, order_id="4821")
    one = shop_world_create(tenant=shop, orders=[WORLD_ORDER])
    two = shop_world_create(tenant=shop, orders=[WORLD_ORDER])

    seen = lookup_order({"order_id": "4821"}, _ctx(shop, one, "a"))
    assert seen["customer"] == "Grace Trial" and seen["amount"] == "64.50"
    assert seen["note"] == "Leave at the back door."
    made = create_replacement(
        {"order_id": "4821", "reason": "dented spout"}, _ctx(shop, one, "b")
    )
    assert made["created"] is True

    assert lookup_order({"order_id": "4821"}, _ctx(shop, one, "c"))["replacements"] == 1
    # The other world and the real shop see none of it.
    assert lookup_order({"order_id": "4821"}, _ctx(shop, two, "d"))["replacements"] == 0
    assert (
        get_delivery_date({"order_id": "4821"}, _ctx(shop, two, "e"))["shipment"]
        == "original"
    )
    real_view = lookup_order({"order_id": "4821"}, _ctx(shop, None, "f"))
    assert real_view["customer"] == DEMO_CUSTOMER_NAME
    assert real_view["replacements"] == 0
    assert Replacement.objects.get().order.world_id == one.id
    assert not Replacement.objects.filter(order=real).exists()


def test_a_world_has_only_its_own_orders(shop):
    world = shop_world_create(tenant=shop, orders=[{**WORLD_ORDER, "order_id": "1234"}])
    with pytest.raises(ToolFailure, match="there is no order 4821"):
        lookup_order({"order_id": "4821"}, _ctx(shop, world, "a"))
    assert (
        lookup_order({"order_id": "1234"}, _ctx(shop, world, "b"))["customer"]
        == "Grace Trial"
    )


def test_two_trials_each_get_their_own_order_and_only_their_own_replacement(
    demo_agent, operator_user, celery_worker_process
):
    tenant = demo_agent.tenant
    real = ShopOrder.objects.get(tenant=tenant, world=None, order_id="4821")
    real_before = (real.customer, real.amount, real.status, real.delivery_date)
    suite = eval_suite_create(
        tenant=tenant,
        actor=operator_user,
        document={"slug": "worlds", "name": "Worlds", "cases": [CASE]},
    )
    eval_run = eval_run_start(
        tenant=tenant, suite=suite, agent_slug=demo_agent.slug, k=2,
        user=operator_user,
    )  # fmt: skip

    def done() -> EvalRun | None:
        fresh = EvalRun.objects.get(id=eval_run.id)
        return fresh if fresh.status == EvalRun.Status.FINISHED else None

    finished = wait_for(done, timeout=90, what="the eval run to finish")
    assert "notes" not in finished.summary
    trials = list(EvalTrial.objects.filter(eval_run=eval_run).select_related("run"))
    assert len(trials) == 2
    worlds = {t.run.world_id for t in trials}
    assert len(worlds) == 2 and None not in worlds
    for trial in trials:
        run = trial.run
        assert run.status == Run.Status.SUCCEEDED
        order = ShopOrder.objects.get(world_id=run.world_id)
        assert (order.order_id, order.customer) == ("4821", "Grace Trial")
        # Its own replacement, made by its own call, and nothing else.
        replacement = Replacement.objects.get(order=order)
        call = run.tool_call_rows.get(tool_name="create_replacement")
        assert replacement.idempotency_key == call.idempotency_key
        looked = run.tool_call_rows.get(tool_name="lookup_order")
        data = looked.result["data"]
        assert data["customer"] == "Grace Trial" and data["replacements"] == 0
        assert trial.passed is True
        assert [r["reason"] for r in trial.grader_results] == [
            "1 replacements for order 4821, as expected",
            "0 refunds for order 4821, as expected",
        ]
    # The tenant's real shop is untouched.
    real.refresh_from_db()
    assert (real.customer, real.amount, real.status, real.delivery_date) == (
        real_before
    )
    assert not Replacement.objects.filter(order=real).exists()
    assert not Refund.objects.filter(order=real).exists()
    real_orders = ShopOrder.objects.filter(tenant=tenant, world=None)
    assert real_orders.count() == len(DEMO_ORDERS)


def test_the_world_state_grader_grades_each_trial_by_its_own_world(
    demo_agent, operator_user
):
    """Rows in another trial's world or the real shop do not count for a trial."""
    tenant = demo_agent.tenant
    suite = eval_suite_create(
        tenant=tenant,
        actor=operator_user,
        document={"slug": "worlds", "name": "Worlds", "cases": [CASE]},
    )
    eval_run = eval_run_start(
        tenant=tenant, suite=suite, agent_slug=demo_agent.slug, k=2,
        user=operator_user,
    )  # fmt: skip
    first, second = (
        t.run for t in EvalTrial.objects.filter(eval_run=eval_run).order_by("index")
    )
    assert first.world_id != second.world_id
    # One replacement in the first trial's world, two in the real shop.
    create_replacement(
        {"order_id": "4821", "reason": "dented"},
        ToolContext.for_call(str(first.id), "x", tenant_id=str(tenant.id),
                             world_id=str(first.world_id)),
    )  # fmt: skip
    for key in ("y", "z"):
        create_replacement(
            {"order_id": "4821", "reason": "dented"},
            ToolContext.for_call(str(second.id), key, tenant_id=str(tenant.id)),
        )
    graders = CASE["graders"][:1]
    assert case_grade(run=first, graders=graders).passed is True
    verdict = case_grade(run=second, graders=graders)
    assert verdict.passed is False
    assert verdict.results[0].reason == ("0 replacements for order 4821, expected 1")
    assert Decimal(ShopOrder.objects.get(world_id=first.world_id).amount) == Decimal(
        "64.50"
    )
