"""What a decided budget-extension approval does to its waiting run.

Approve: a run cap grows here (a period limit grows by a grant in the budget
ledger) and the run resumes at the refused reservation. Deny or expiry: the run
ends `budget_exhausted` with the refused dimension, as it would have without
asking. Either way the run was waiting, so no worker holds it.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F

from budgets.periods import BudgetRefusal
from budgets.services import stop_reason_for
from runs.engine.stop import StopReason, terminal_status
from runs.models import Run
from runs.services.admission import budget_run_ended
from runs.services.lifecycle import run_end_unheld
from runs.spans import run_root_end

logger = logging.getLogger(__name__)


@transaction.atomic
def run_cap_extend(*, run_id: Any, cap: str, amount: Decimal) -> dict[str, str]:
    """Raise one of the run's caps by `amount`; returns its extensions so far."""
    run = Run.objects.select_for_update().get(id=run_id)
    extensions = dict(run.limit_extensions or {})
    extensions[cap] = str(Decimal(str(extensions.get(cap, "0"))) + amount)
    Run.objects.filter(id=run.id).update(
        limit_extensions=extensions, version=F("version") + 1
    )
    return extensions


@transaction.atomic
def run_end_budget_exhausted(*, run_id: Any, stop_reason: str, detail: str) -> bool:
    """End a run waiting for a budget extension that was denied or expired.

    `stop_reason` is the refused dimension: a tenant one (tenant_cost_per_day) or
    an engine cap reason (max_cost). False when the run was no longer waiting.
    """
    run = (
        Run.objects.select_for_update()
        .filter(id=run_id, status=Run.Status.WAITING_APPROVAL)
        .first()
    )
    if run is None:
        return False
    tenant_dimension = stop_reason.startswith("tenant_")
    reason = (
        stop_reason_for(BudgetRefusal(stop_reason, detail))
        if tenant_dimension
        else StopReason(stop_reason)
    )
    run_end_unheld(
        run,
        reason=reason,
        status=str(terminal_status(reason, None)),
        note=f"the run stopped ({stop_reason})",
        detail=detail,
        stop_reason=stop_reason,  # the exact dimension
    )
    # Releases what it still holds and frees its slot; the budget.exhausted event
    # was written when the reservation was refused.
    budget_run_ended(run=run, reason=reason, dimension=stop_reason, detail=detail)
    transaction.on_commit(lambda: _root_end(run))
    return True


def _root_end(run: Run) -> None:
    try:
        run_root_end(run)
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: root end of run %s", run.id, exc_info=True)
