"""A fixed set of runs for the runs list's filters, search and sort (API and
browser tests): known statuses, agents, times, costs, errors and waits."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from approvals.models import ApprovalRequest
from runs.models import Run, Step, ToolCall
from tests.agents import make_agent
from tracing.models import Span

T0 = dt.datetime(2026, 11, 1, 10, 0, tzinfo=dt.UTC)

# name: (agent, status, input, final answer, cost, created (hours after T0),
#        duration seconds, steps, tokens in, tokens out, span error, waiting on)
RUNS: dict[str, tuple[Any, ...]] = {
    "refund": ("alpha", "succeeded", "Refund the kettle of order 4821",
               "Refund issued for the kettle", "0.5", 0, 60, 3, 100, 50, False, None),
    "parcel": ("alpha", "failed", "Track parcel 77", "", "2", 26, 5, 1, 20, 0,
               True, None),
    "lid": ("beta", "waiting_approval", "Replace the broken lid", "", "0.1", 47,
            None, 2, 300, 10, False, "approval"),
    "invoices": ("beta", "waiting_approval", "Summarise the invoices", "",
                 "1.25", 53, None, 4, 500, 500, False, "budget"),
    "catalogue": ("beta", "waiting_approval", "Search the catalogue", "", "0.75",
                  72, None, 5, 40, 40, False, "input"),
    "ping": ("alpha", "succeeded", "Ping the warehouse", "Pong from Leeds", "0.5",
             96, 2, 1, 5, 5, True, None),
}  # fmt: skip
# The tools each run called, in order (`tool=<name>`); the others called none.
TOOLS_CALLED: dict[str, list[str]] = {
    "refund": ["lookup_order", "lookup_order", "refund"],
    "parcel": ["lookup_order"],
    "lid": ["lookup_order", "create_replacement"],
    "ping": ["run_code"],
}
# The end user each run serves; the others serve none.
END_USERS = {"refund": "c-8812", "lid": "c-8812", "parcel": "c-1234"}
KIND_OF = {
    "approval": ApprovalRequest.Kind.TOOL_CALL,
    "input": ApprovalRequest.Kind.TOOL_ERROR,
    "budget": ApprovalRequest.Kind.BUDGET_EXTENSION,
}


def seed_run_list(tenant: Any, user: Any) -> dict[str, Run]:
    """The runs of RUNS in `tenant`, started by `user`; returns them by name."""
    agents = {slug: make_agent(tenant, slug) for slug in ("alpha", "beta")}
    made: dict[str, Run] = {}
    for name, row in RUNS.items():
        slug, status, text, answer, cost, hours, seconds, steps, tin, tout = row[:10]
        span_error, waiting = row[10:]
        created = T0 + dt.timedelta(hours=hours)
        run = Run.objects.create(
            tenant=tenant,
            agent=agents[slug],
            agent_version=agents[slug].current_version,
            started_by=user,
            input=text,
            end_user=END_USERS.get(name, ""),
            final_answer=answer,
            status=status,
            cost=Decimal(cost),
            steps=steps,
            input_tokens=tin,
            output_tokens=tout,
            trace_id=f"{len(made) + 1:032x}",
            started_at=created,
            finished_at=None
            if seconds is None
            else created + dt.timedelta(seconds=seconds),
        )
        # created_at is auto_now_add: set the known time afterwards.
        Run.objects.filter(pk=run.pk).update(created_at=created)
        run.refresh_from_db()
        Span.objects.create(
            run=run,
            trace_id=run.trace_id,
            span_id=f"{len(made) + 1:016x}",
            name="execute_tool lookup",
            status=Span.Status.ERROR if span_error else Span.Status.OK,
            started_at=created,
            ended_at=created,
        )
        record_tool_calls(run, TOOLS_CALLED.get(name, []))
        if waiting:
            ApprovalRequest.objects.create(
                tenant=tenant,
                run=run,
                kind=KIND_OF[waiting],
                tool_name="create_replacement" if waiting == "approval" else "",
                rule="ask",
                args_snapshot={},
                args_sha256="0" * 64,
                expires_at=created + dt.timedelta(days=400),
            )
        made[name] = run
    return made


def record_tool_calls(run: Run, tools: list[str]) -> None:
    """One step holding a call of each tool, as the engine records them."""
    if not tools:
        return
    step = Step.objects.create(run=run, index=0, started_at=run.created_at)
    for position, tool in enumerate(tools):
        ToolCall.objects.create(
            run=run,
            step=step,
            position=position,
            call_id=f"call_{position}",
            tool_name=tool,
            args={},
            args_sha256="0" * 64,
            idempotency_key=f"{run.pk}-{position}",
            status=ToolCall.Status.SUCCEEDED,
        )
