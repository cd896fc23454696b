"""Starting a demo script (runs/demo_scripts.py): its run in a shop world of its
own, or (script 11) an eval run; and the late approval's "meanwhile" refund."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction

from approvals.models import ApprovalRequest
from controlplane.celery import app as celery_app
from controlplane.models import Tenant
from runs.demo import DEMO_CUSTOMER, DEMO_ORDERS
from runs.demo_scripts import DEMO_EVAL_K, DEMO_EVAL_SUITE, DemoScript
from runs.models import EvalSuite, Run
from runs.services.eval_runs import eval_run_start
from runs.services.lifecycle import RunInputError, run_start
from shop.models import ShopOrder
from shop.services import shop_order_refund_in_full, shop_world_create

__all__ = ["DemoStarted", "demo_refund_while_waiting", "demo_script_start"]

REFUND_TASK = "runs.tasks.demo_refund_while_waiting_task"


@dataclass(frozen=True)
class DemoStarted:
    kind: str  # "run" or "eval_run"
    id: uuid.UUID


def demo_script_start(
    *, tenant: Tenant, script: DemoScript, user: User | None
) -> DemoStarted:
    """Start the script as `user`. Refused (RunInputError on `agent`) when the
    demo was not seeded in this tenant (`manage.py seed_demo`)."""
    if script.kind == "eval":
        suite = EvalSuite.objects.filter(tenant=tenant, slug=DEMO_EVAL_SUITE).first()
        if suite is None:
            raise RunInputError(
                "suite", f"no suite {DEMO_EVAL_SUITE!r}: run manage.py seed_demo"
            )
        eval_run = eval_run_start(
            tenant=tenant,
            suite=suite,
            agent_slug=script.agent,
            k=DEMO_EVAL_K,
            user=user,
        )
        return DemoStarted("eval_run", eval_run.id)
    with transaction.atomic():
        world = shop_world_create(
            tenant=tenant, orders=DEMO_ORDERS, label=f"demo {script.slug}"
        )
        run = run_start(
            tenant=tenant,
            agent_slug=script.agent,
            input=script.input,
            started_by=user,
            world_id=world.id,
            end_user=DEMO_CUSTOMER,
        )
        if script.refund_while_waiting:
            # Named, not imported: `runs.tasks` imports the services.
            transaction.on_commit(
                lambda: celery_app.signature(REFUND_TASK).apply_async(
                    kwargs={"run_id": str(run.id)}
                )
            )
    return DemoStarted("run", run.id)


def demo_refund_while_waiting(*, run_id: str) -> str:
    """Once the run waits on its replacement's approval, refund the order in
    full in the run's world. Returns "refunded", "waiting" (not yet: ask again)
    or "gone" (the run ended or was never a demo run: nothing to do)."""
    run = Run.objects.filter(id=run_id).first()
    if run is None or run.world_id is None or run.is_terminal:
        return "gone"
    pending = ApprovalRequest.objects.filter(
        run_id=run.id,
        tool_name="create_replacement",
        status=ApprovalRequest.Status.PENDING,
    ).first()
    if pending is None:
        return "waiting"
    order_id = str(pending.args_snapshot.get("order_id", ""))
    order = ShopOrder.objects.filter(
        tenant_id=run.tenant_id, world_id=run.world_id, order_id=order_id
    ).first()
    if order is None:
        return "gone"
    shop_order_refund_in_full(
        order=order, reason="refunded by finance while the replacement waited"
    )
    return "refunded"
