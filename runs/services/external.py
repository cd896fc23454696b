"""Runs recorded elsewhere: an agent instrumented with OpenTelemetry outside the
control plane sends its trace to POST /v1/traces and appears as a read-only run.

Such a run is terminal from the start (stop_reason `external`), holds no step
token or lease and is never advanced, cancelled or recovered; its agent is a
placeholder named after the sending service.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Least
from django.utils import timezone
from django.utils.text import slugify

from controlplane.models import Tenant
from runs.models import Agent, Run

__all__ = ["EXTERNAL_STOP_REASON", "run_external_for_trace", "run_external_update"]

EXTERNAL_STOP_REASON = "external"


def _external_agent(*, tenant: Tenant, service: str) -> Agent:
    slug = ("external-" + (slugify(service) or "agent"))[:64]
    agent = Agent.objects.filter(tenant=tenant, slug=slug).first()
    if agent is not None:
        return agent
    try:
        with transaction.atomic():
            return Agent.objects.create(
                tenant=tenant,
                slug=slug,
                name=f"External: {service}"[:200],
                model_adapter=Agent.Adapter.SCRIPTED,
                model="external",
                tool_names=[],
                script=[],
            )
    except IntegrityError:
        return Agent.objects.get(tenant=tenant, slug=slug)


def run_external_for_trace(
    *, tenant: Tenant, trace_id: str, service: str, started_at: Any
) -> Run:
    """The tenant's external run for this trace id, created on first sight.

    A trace id names one run in a tenant; if it is a native run's, ValueError
    (ingest refuses those traces before it gets here)."""
    run = Run.objects.filter(tenant=tenant, trace_id=trace_id).first()
    if run is None:
        agent = _external_agent(tenant=tenant, service=service)
        try:
            with transaction.atomic():
                return Run.objects.create(
                    tenant=tenant,
                    agent=agent,
                    input="",
                    status=Run.Status.SUCCEEDED,
                    stop_reason=EXTERNAL_STOP_REASON,
                    stop_detail=f"recorded by {service} and sent over OTLP",
                    trace_id=trace_id,
                    started_at=started_at,
                    finished_at=started_at,
                )
        except IntegrityError:  # a concurrent ingest of the same trace won
            run = Run.objects.get(tenant=tenant, trace_id=trace_id)
    if run.stop_reason != EXTERNAL_STOP_REASON:
        raise ValueError(f"trace {trace_id} is a native run's, not an external one")
    return run


def run_external_update(
    *,
    run: Run,
    input_tokens: int = 0,
    output_tokens: int = 0,
    failed: bool = False,
    input: str | None = None,
    final_answer: str | None = None,
    finished_at: Any = None,
) -> None:
    """Fold what a batch of spans said into the run's summary fields."""
    changes: dict[str, Any] = {
        "input_tokens": _saturating_add("input_tokens", input_tokens),
        "output_tokens": _saturating_add("output_tokens", output_tokens),
        "updated_at": timezone.now(),
    }
    if failed:
        changes["status"] = Run.Status.FAILED
    if input is not None:
        changes["input"] = input
    if final_answer is not None:
        changes["final_answer"] = final_answer
    if finished_at is not None:
        changes["finished_at"] = finished_at
    Run.objects.filter(id=run.id, stop_reason=EXTERNAL_STOP_REASON).update(**changes)


_COUNTER_MAX = 2**63 - 1


def _saturating_add(name: str, amount: int) -> Any:
    """F(name) + amount, stopping at the column's maximum instead of overflowing
    (a sender may repeat a trace with large counts as often as it likes)."""
    amount = max(0, min(amount, _COUNTER_MAX))
    return Least(F(name), Value(_COUNTER_MAX - amount)) + amount
