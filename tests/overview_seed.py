"""A tenant's known history for the overview and budget pages: runs of two
agents in three hours with known statuses, durations and costs, tool calls
that failed, approvals decided after known waits, a pending one, and (with a
budget) settled ledger entries. Every figure the pages show follows from it
(`EXPECTED`)."""

from __future__ import annotations

import datetime as dt
import hashlib
from decimal import Decimal
from typing import Any

from django.utils import timezone

from approvals.models import ApprovalRequest
from budgets.ledger import budget_reserve, budget_settle
from budgets.models import Budget, BudgetLedgerEntry
from budgets.periods import Amounts
from runs.models import Agent, Run, Step, ToolCall
from tests.agents import make_agent

# (hour offset, agent, status, duration seconds or None, cost)
RUNS = [
    (0, "alpha", "succeeded", 10, "0.10"),
    (0, "alpha", "succeeded", 20, "0.10"),
    (0, "alpha", "succeeded", 30, "0.10"),
    (0, "alpha", "failed", 40, "0.05"),
    (1, "beta", "failed", 50, "0.30"),
    (1, "beta", "failed", 60, "0.30"),
    (1, "beta", "succeeded", 100, "0.40"),
    (2, "alpha", "running", None, "0"),
    (2, "alpha", "waiting_approval", None, "0"),
]
EXPECTED: dict[str, Any] = {
    "total": 9,
    "by_hour": [
        {"succeeded": 3, "failed": 1},
        {"succeeded": 1, "failed": 2},
        {"running": 1, "waiting_approval": 1},
    ],
    "p50_s": 40,
    "p95_s": 100,
    "hour_p50_s": [20, 60, None],
    "hour_p95_s": [40, 100, None],
    "waiting": 1,
    "decided": 3,
    "median_decision_s": 180,
    "agents_by_cost": [("beta", 1.0), ("alpha", 0.35)],
    "agents_by_failures": [("beta", 2), ("alpha", 1)],
    "tools_by_failures": [("lookup_order", 2), ("send_refund", 1)],
    "tools_by_cost": [("send_refund", 0.75)],
}


def hour_zero(now: dt.datetime | None = None) -> dt.datetime:
    """The first seeded hour: three whole hours before the current one."""
    now = now or timezone.now()
    return now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=3)


def _at(run: Run, created: dt.datetime, seconds: int | None) -> None:
    finished = None if seconds is None else created + dt.timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(
        created_at=created, started_at=created, finished_at=finished
    )


def seed_history(
    tenant: Any, user: Any, *, with_budget: bool = False
) -> dict[str, Any]:
    agents = {
        slug: Agent.objects.filter(tenant=tenant, slug=slug).first()
        or make_agent(tenant, slug)
        for slug in ("alpha", "beta")
    }
    start = hour_zero()
    runs: list[Run] = []
    for i, (hour, slug, status, seconds, cost) in enumerate(RUNS):
        agent: Agent = agents[slug]
        run = Run.objects.create(
            tenant=tenant, agent=agent, agent_version=agent.current_version,
            started_by=user, input=f"seeded run {i}", status=status,
            cost=Decimal(cost), input_tokens=100, output_tokens=10, steps=1,
        )  # fmt: skip
        _at(run, start + dt.timedelta(hours=hour, minutes=5 + i), seconds)
        runs.append(run)
    # Tool calls of the first beta run: two lookups failed, a refund's outcome
    # unknown; the refund cost 0.75 (settled in the ledger below).
    failing = runs[4]
    step = Step.objects.create(run=failing, index=0, started_at=start)
    calls = []
    for position, (tool, status) in enumerate(
        [("lookup_order", "failed"), ("lookup_order", "failed"),
         ("send_refund", "unknown"), ("lookup_order", "succeeded")]
    ):  # fmt: skip
        calls.append(ToolCall.objects.create(
            run=failing, step=step, position=position,
            call_id=f"call_{position}", tool_name=tool, args={},
            args_sha256="0" * 64, idempotency_key=f"k{position}", status=status,
        ))  # fmt: skip

    # Approvals: the waiting run's pending call, and three decided after 60,
    # 180 and 300 seconds (two budget extensions among them).
    def request(
        run: Run, kind: str, status: str, wait: int | None, **extra: Any
    ) -> None:
        made = ApprovalRequest.objects.create(
            tenant=tenant, run=run, kind=kind,
            tool_name=extra.pop("tool", "budget"), rule="seeded",
            args_snapshot={}, args_sha256=hashlib.sha256(b"{}").hexdigest(),
            status=status, expires_at=timezone.now() + dt.timedelta(hours=1),
            **extra,
        )  # fmt: skip
        requested = start + dt.timedelta(hours=1, minutes=10)
        decided = None if wait is None else requested + dt.timedelta(seconds=wait)
        ApprovalRequest.objects.filter(pk=made.pk).update(
            requested_at=requested, decided_at=decided,
            decided_by=user if wait is not None else None,
        )  # fmt: skip

    extension = {
        "scope": "period", "dimension": "tenant_cost_per_day", "name": "cost",
        "amount": "2.5", "limit": "5", "used": "4.9", "wanted": "0.2",
        "period": "day",
    }  # fmt: skip
    request(runs[8], "tool_call", "pending", None, tool="send_refund")
    request(runs[4], "tool_call", "approved", 60, tool="send_refund")
    request(runs[5], "budget_extension", "approved", 180, extension=extension)
    request(runs[6], "budget_extension", "denied", 300, extension=extension,
            reason="enough for today")  # fmt: skip
    entries: list[BudgetLedgerEntry] = []
    if with_budget:
        budget = Budget.objects.create(
            tenant=tenant, period_limits={"day": {"cost": "5"}, "month": {"cost": "80"}}
        )
        for run, kind, call_id, cost in [
            (runs[0], "model_call", "", "0.5"),
            (runs[4], "tool_call", "call_2", "0.75"),
            (runs[6], "model_call", "", "0.25"),
        ]:
            entry = budget_reserve(
                budget=budget, run_id=run.pk, kind=kind, call_id=call_id,
                amounts=Amounts(cost=Decimal("1")),
            )  # fmt: skip
            assert isinstance(entry, BudgetLedgerEntry)
            budget_settle(entry, Amounts(cost=Decimal(cost)))
            entries.append(entry)
        held = budget_reserve(
            budget=budget, run_id=runs[7].pk, kind="model_call",
            amounts=Amounts(cost=Decimal("0.2")),
        )  # fmt: skip
        assert isinstance(held, BudgetLedgerEntry)
        entries.append(held)
    return {"start": start, "runs": runs, "calls": calls, "entries": entries}
