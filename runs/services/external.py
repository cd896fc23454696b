"""Runs recorded elsewhere: an agent instrumented with OpenTelemetry outside the
control plane sends its trace to POST /v1/traces and appears as a read-only run.

Such a run is terminal from the start (stop_reason `external`), holds no step
token or lease and is never advanced, cancelled or recovered; its agent is a
placeholder named after the sending service. Ingest is the runs app's: it
decides which run a trace is (refusing a native run's trace) and asks tracing
to decode and store its spans (`tracing.ingest`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Least
from django.utils import timezone
from django.utils.text import slugify

from budgets.prices import model_price_for
from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.models import Agent, Run
from tracing.ingest import OtlpSpan, SpanUsage, TraceSummary, time_of, trace_store
from tracing.store import telemetry_transaction

__all__ = [
    "EXTERNAL_STOP_REASON",
    "IngestResult",
    "UsageDelta",
    "ingest_spans",
    "run_external_for_trace",
    "run_external_update",
]

EXTERNAL_STOP_REASON = "external"


def _external_agent(*, tenant: Tenant, service: str) -> Agent:
    slug = ("external-" + (slugify(service) or "agent"))[:64]
    live = Agent.objects.filter(tenant=tenant, slug=slug, deleted_at__isnull=True)
    agent = live.first()
    if agent is not None:
        return agent
    try:
        with transaction.atomic():
            # No version: it runs nowhere here, it only names the runs.
            return Agent.objects.create(
                tenant=tenant, slug=slug, name=f"External: {service}"[:200]
            )
    except IntegrityError:
        return live.get()


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
                    # Nothing of it runs here: what its spans say is all.
                    settled_at=started_at,
                )
        except IntegrityError:  # a concurrent ingest of the same trace won
            run = Run.objects.get(tenant=tenant, trace_id=trace_id)
    if run.stop_reason != EXTERNAL_STOP_REASON:
        raise ValueError(f"trace {trace_id} is a native run's, not an external one")
    return run


@dataclass(frozen=True)
class UsageDelta:
    """How a batch of spans moves an external run's counters (negative where a
    re-sent span says less than the version it replaces)."""

    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)


def run_external_update(
    *,
    run: Run,
    usage: UsageDelta | None = None,
    failed: bool = False,
    input: str | None = None,
    final_answer: str | None = None,
    finished_at: Any = None,
) -> None:
    """Fold what a batch of spans said into the run's summary fields."""
    usage = usage or UsageDelta()
    changes: dict[str, Any] = {
        "steps": _bounded_move("steps", usage.steps, _COUNT_MAX),
        "tool_calls": _bounded_move("tool_calls", usage.tool_calls, _COUNT_MAX),
        "input_tokens": _bounded_move("input_tokens", usage.input_tokens, _TOKENS_MAX),
        "output_tokens": _bounded_move(
            "output_tokens", usage.output_tokens, _TOKENS_MAX
        ),
        "cost": _bounded_move("cost", usage.cost, _COST_MAX),
        "updated_at": timezone.now(),
        # The overview's rollups count the run again (runs/services/rollups.py).
        "rollup_pending": True,
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


# The columns' maxima: a sender may repeat a trace with large counts as often as
# it likes, so the counters stop there instead of overflowing.
_TOKENS_MAX = 2**63 - 1
_COUNT_MAX = 2**31 - 1
_COST_MAX = Decimal("99999999.999999")


def _bounded_move(name: str, amount: Any, maximum: Any) -> Any:
    """F(name) + amount, kept within 0 .. maximum."""
    if amount >= 0:
        amount = min(amount, maximum)
        return Least(F(name), Value(maximum - amount)) + amount
    zero = Decimal(0) if isinstance(amount, Decimal) else 0
    return Greatest(F(name) + amount, Value(zero))


def _usage_delta(tenant: Tenant, summary: TraceSummary) -> UsageDelta:
    """The counters' move, with each model call's cost: the sender's where it
    priced the call, else the tenant's price for the model (zero if unknown)."""
    prices: dict[str, Any] = {}

    def cost(usage: SpanUsage) -> Decimal:
        if usage.cost is not None:
            return usage.cost
        if not usage.model or not (usage.input_tokens or usage.output_tokens):
            return Decimal(0)
        if usage.model not in prices:
            prices[usage.model] = model_price_for(
                model=usage.model, tenant_id=tenant.id
            ).price
        amount: Decimal = prices[usage.model].cost(
            usage.input_tokens, usage.output_tokens
        )
        return amount

    return UsageDelta(
        steps=summary.delta("steps"),
        tool_calls=summary.delta("tool_calls"),
        input_tokens=summary.delta("input_tokens"),
        output_tokens=summary.delta("output_tokens"),
        cost=sum(map(cost, summary.added), Decimal(0))
        - sum(map(cost, summary.replaced), Decimal(0)),
    )


@dataclass
class IngestResult:
    spans: int  # stored (created or updated)
    runs: list[str]
    rejected: int = 0
    # One line per refused trace, for the OTLP partial-success error_message.
    errors: list[str] = field(default_factory=list)


def _message_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value[:20_000]
    return json.dumps(value, ensure_ascii=False, default=str)[:20_000]


def _trace_ingest(tenant: Tenant, trace_id: str, spans: list[OtlpSpan]) -> Run:
    """Store the trace's spans in the tenant's external run for it (created on
    first sight) and fold what they say into the run's summary."""
    first = min(spans, key=lambda s: s.start_ns)
    run = run_external_for_trace(
        tenant=tenant,
        trace_id=trace_id,
        service=first.service,
        started_at=time_of(first.start_ns),
    )
    # One ingest of a trace at a time: what a re-sent span replaces is read
    # and its count moved under the run's lock, so it is never counted twice.
    Run.objects.select_for_update().filter(id=run.id).first()
    summary = trace_store(
        tenant_id=tenant.id, run_id=run.id, trace_id=trace_id, spans=spans
    )
    run_external_update(
        run=run,
        usage=_usage_delta(tenant, summary),
        failed=summary.failed,
        input=_message_text(summary.input),
        final_answer=_message_text(summary.output),
        finished_at=summary.finished_at,
    )
    return run


def ingest_spans(*, tenant: Tenant, user: Any, spans: list[OtlpSpan]) -> IngestResult:
    """Store checked spans, one external run per trace id of `tenant`; the spans
    of a trace that is one of the tenant's native runs are refused (counted and
    named in the result, with an audit entry), all the others stored together.

    Only the caller's own tenant's external runs are written: a trace id names
    one run within a tenant (`Run`'s `one_run_per_trace`) and a span id one span
    within its run, so another tenant's spans, whatever their ids, are never
    read or written, and a native run's spans are never touched."""
    by_trace: dict[str, dict[str, OtlpSpan]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id][span.span_id] = span  # a repeated span: the last

    native = dict(
        Run.objects.filter(tenant=tenant, trace_id__in=list(by_trace))
        .exclude(stop_reason=EXTERNAL_STOP_REASON)
        .values_list("trace_id", "id")
    )
    result = IngestResult(spans=0, runs=[])
    with telemetry_transaction():
        # In trace id order: two requests holding the same traces lock their
        # runs in the same order, so neither waits on the other forever.
        for trace_id, members in sorted(by_trace.items()):
            if trace_id in native:
                result.rejected += len(members)
                result.errors.append(
                    f"trace {trace_id} is a run of this control plane; its spans "
                    "are recorded by the control plane and not accepted over OTLP"
                )
                audit_record(
                    tenant=tenant,
                    actor=user,
                    action="otlp.spans_rejected",
                    object_type="run",
                    object_id=str(native[trace_id]),
                    after={"trace_id": trace_id, "span_ids": sorted(members)[:100],
                           "rejected": len(members)},
                )  # fmt: skip
                continue
            run = _trace_ingest(tenant, trace_id, list(members.values()))
            result.spans += len(members)
            result.runs.append(str(run.id))
    return result
