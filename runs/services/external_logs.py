"""Log records of runs recorded elsewhere (`POST /v1/logs`, gRPC LogsService).

The GenAI events among them carry the model input and output of a span of an
external run (`tracing.ingest.logs`); they are kept for the tenant and put on the
span whichever arrives first. As with spans, which run a trace is is this app's
call: a trace that is one of the tenant's native runs is refused (its spans are
the control plane's own), and only the caller's tenant's rows are written.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from controlplane.models import Tenant
from controlplane.services import audit_record
from runs.models import Run
from runs.services.external import EXTERNAL_STOP_REASON
from tracing.ingest import (
    LogMessage,
    OtlpLogRecord,
    log_messages_of,
    log_messages_store,
    span_log_messages_apply,
)
from tracing.store import telemetry_transaction

__all__ = ["LogIngestResult", "ingest_logs"]


@dataclass
class LogIngestResult:
    log_records: int  # stored
    spans_updated: int  # spans already stored that got messages now
    rejected: int = 0
    # One line per reason, for the OTLP partial-success error_message.
    errors: list[str] = field(default_factory=list)


def ingest_logs(
    *, tenant: Tenant, user: Any, records: list[OtlpLogRecord]
) -> LogIngestResult:
    """Keep the GenAI messages of checked log records for `tenant` and put them
    on their spans; records that carry none (no span, not a GenAI event) and the
    records of a native run's trace are refused (counted and named)."""
    messages, skipped = log_messages_of(records)
    result = LogIngestResult(log_records=0, spans_updated=0)
    if skipped:
        result.rejected += len(skipped)
        result.errors.append(
            f"{len(skipped)} log record(s) are not GenAI events of a span (a "
            "gen_ai.*.message, gen_ai.choice or gen_ai.client.inference."
            "operation.details event with a trace and span id) and are not stored"
        )
    by_trace: dict[str, list[LogMessage]] = defaultdict(list)
    for message in messages:
        by_trace[message.trace_id].append(message)
    runs = {
        trace_id: (run_id, stop_reason)
        for trace_id, run_id, stop_reason in Run.objects.filter(
            tenant=tenant, trace_id__in=list(by_trace)
        ).values_list("trace_id", "id", "stop_reason")
    }
    with telemetry_transaction():
        for trace_id, members in by_trace.items():
            records_of_trace = len({message.record for message in members})
            run_id, stop_reason = runs.get(trace_id, (None, EXTERNAL_STOP_REASON))
            if stop_reason != EXTERNAL_STOP_REASON:
                result.rejected += records_of_trace
                result.errors.append(
                    f"trace {trace_id} is a run of this control plane; its log "
                    "records are not accepted over OTLP"
                )
                audit_record(
                    tenant=tenant,
                    actor=user,
                    action="otlp.logs_rejected",
                    object_type="run",
                    object_id=str(run_id),
                    after={"trace_id": trace_id, "rejected": records_of_trace},
                )
                continue
            log_messages_store(tenant_id=tenant.id, run_id=run_id, messages=members)
            result.log_records += records_of_trace
            if run_id is not None:  # else the span's arrival puts them on it
                result.spans_updated += span_log_messages_apply(
                    tenant_id=tenant.id,
                    run_id=run_id,
                    trace_id=trace_id,
                    span_ids=sorted({message.span_id for message in members}),
                )
    return result
