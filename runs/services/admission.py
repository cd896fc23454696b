"""Run admission: the runs-per-period limits, concurrency slots, queued starts.

A new run is counted against the tenant's runs per day and month (a refusal
ends it before any step); it takes a concurrency slot or stays queued with no
step token and no task until one frees (oldest first).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q

from budgets.ledger import budget_release_for_run, budget_reserve, budget_settle
from budgets.models import Budget, BudgetLedgerEntry
from budgets.periods import Amounts, BudgetRefusal
from budgets.services import budget_update
from controlplane.models import Tenant
from runs.engine.stop import BUDGET_STOP_REASONS, StopReason
from runs.models import Run
from runs.services.dispatch import step_enqueue
from runs.services.spend import run_budget_event, run_budget_refused


def budget_admit_run(*, run: Run) -> BudgetRefusal | None:
    """Count the run against the runs-per-period limits; a refusal changes nothing.

    Call inside run_start's transaction. The budget row is locked first (as
    `run_slot_claim` locks it next): the ledger's lock order is the budget row,
    then the counters, and the reservation's counter rows stay locked until
    run_start commits, so taking the budget row after them could deadlock with
    a reservation that holds the budget row and waits for them."""
    budget = Budget.objects.select_for_update().filter(tenant_id=run.tenant_id).first()
    if budget is None:
        return None
    one = Amounts(runs=1)
    result = budget_reserve(
        budget=budget,
        run_id=run.pk,
        kind=BudgetLedgerEntry.Kind.RUN,
        amounts=one,
        end_user=run.end_user,
    )
    if isinstance(result, BudgetRefusal):
        return run_budget_refused(run, result, kind="run")
    budget_settle(result, one)
    return None


def _active_runs(tenant_id: Any) -> Any:
    return Run.objects.filter(tenant_id=tenant_id).filter(
        Q(
            status__in=[
                Run.Status.RUNNING,
                Run.Status.WAITING_APPROVAL,
                Run.Status.WAITING_INPUT,
            ]
        )
        | Q(status=Run.Status.QUEUED, step_token__isnull=False)
    )


def active_run_count(*, tenant_id: Any) -> int:
    """Runs holding a concurrency slot: queued with a task, running or waiting."""
    count: int = _active_runs(tenant_id).count()
    return count


def run_slot_claim(*, run: Run) -> bool:
    """Whether the new run may start now (call inside run_start's transaction).

    The budget row lock orders concurrent starts; a run that gets no slot stays
    queued with no step token and no task (nothing is held while it waits).
    """
    budget = Budget.objects.select_for_update().filter(tenant_id=run.tenant_id).first()
    if budget is None or budget.max_concurrent_runs is None:
        return True
    active: int = _active_runs(run.tenant_id).exclude(id=run.pk).count()
    return active < budget.max_concurrent_runs


def runs_start_queued(*, tenant_id: Any) -> int:
    """Start the tenant's oldest waiting runs while slots are free."""
    # Inside a run's end (its caller's transaction) no savepoint: a failure
    # here fails the end as a whole, which is what a savepoint would lead to.
    with transaction.atomic(savepoint=False):
        budget = Budget.objects.select_for_update().filter(tenant_id=tenant_id).first()
        waiting = Run.objects.select_for_update(skip_locked=True).filter(
            tenant_id=tenant_id, status=Run.Status.QUEUED, step_token__isnull=True
        )
        if budget is not None and budget.max_concurrent_runs is not None:
            free = budget.max_concurrent_runs - _active_runs(tenant_id).count()
            if free <= 0:
                return 0
            waiting = waiting.order_by("created_at", "id")[:free]
        else:
            waiting = waiting.order_by("created_at", "id")
        started = 0
        for run in waiting:
            step_enqueue(run)
            started += 1
        return started


def budget_run_ended(
    *, run: Run, reason: StopReason, dimension: str = "", detail: str = ""
) -> None:
    """The run ended: release what it still holds, say so if a run cap stopped it
    (the ledger already said so for a tenant limit), and free its slot.

    The queued runs start first: that locks the budget row, and the release then
    locks counter rows, both held until the caller's transaction commits (the
    ledger's one lock order: the budget row, then the counters)."""
    runs_start_queued(tenant_id=run.tenant_id)
    budget_release_for_run(run_id=run.pk)
    if not dimension and reason in BUDGET_STOP_REASONS:
        payload = {"dimension": str(reason), "detail": detail, "kind": "run_cap"}
        run_budget_event(run, "budget.exhausted", payload)


@transaction.atomic
def budget_update_and_admit(
    *, tenant: Tenant, actor: User | None, data: Any, remote_addr: str | None = None
) -> Budget:
    """Change the tenant's budget (budgets.services.budget_update); queued runs
    start if the concurrency limit grew."""
    budget = budget_update(
        tenant=tenant, actor=actor, data=data, remote_addr=remote_addr
    )
    runs_start_queued(tenant_id=tenant.pk)
    return budget
