"""The spans of a run (DESIGN.md §7), created through the OpenTelemetry API;
tracing stores them (`tracing.processor`), this module knows what a run is.

One trace per run (`Run.trace_id`) whose root `invoke_agent {agent}` has an id
derived from the run, so every task can parent its `step` span on it from a
`traceparent` alone. Spans that outlive a task (the root, an approval wait) are
stored when they start and started again with the same ids when they end.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from approvals.models import ApprovalRequest
from controlplane.redaction import redact
from runs.engine.evaluator import verdict_of
from runs.models import Run
from tracing.live import SpanDeltaRelay
from tracing.models import Span
from tracing.processor import (
    RUN_ID_KEY,
    TENANT_ID_KEY,
    long_lived,
    span_batch_flush_if_slow,
)
from tracing.setup import fixed_ids, tracer
from tracing.store import span_abandon

__all__ = [
    "approval_span_open",
    "approval_span_settle",
    "gate_span_open",
    "gate_span_settle",
    "chat_span",
    "guard_span",
    "root_span_id",
    "run_root_end",
    "run_verdict",
    "spans_abandon_of_dead_workers",
    "spans_end_of_finished_runs",
    "step_span",
    "tool_span",
    "traceparent_for",
]

logger = logging.getLogger(__name__)

_LIMIT_FIELDS = {
    "steps": ("max_steps", "steps"),
    "tool_calls": ("max_tool_calls", "tool_calls"),
    "input_tokens": ("max_input_tokens", "input_tokens"),
    "output_tokens": ("max_output_tokens", "output_tokens"),
    "cost": ("max_cost", "cost"),
}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def root_span_id(run: Run) -> int:
    """The run's root span id: 64 bits of the run id (never zero)."""
    return (run.id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1


def _trace_id(run: Run) -> int:
    return int(run.trace_id, 16)


def traceparent_for(run: Run) -> str:
    """W3C traceparent naming the run's root span; what a task is given."""
    return f"00-{run.trace_id}-{root_span_id(run):016x}-01"


def _parent_context(trace_id: int, span_id: int) -> otel_context.Context:
    parent = SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _context_from_traceparent(value: str) -> otel_context.Context | None:
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return _parent_context(trace_id, span_id)


def _run_attributes(run: Run) -> dict[str, Any]:
    return {RUN_ID_KEY: str(run.id), TENANT_ID_KEY: str(run.tenant_id)}


def _version_attributes(run: Run) -> dict[str, Any]:
    """The model the run's pinned agent version calls, and which version it is."""
    version = run.agent_version
    if version is None:
        return {}
    return {
        "gen_ai.provider.name": version.endpoint.kind,
        "gen_ai.request.model": version.model,
        "cp.agent.version": version.number,
    }


def _traced(run: Run) -> bool:
    if len(run.trace_id) != 32:
        return False
    try:
        return int(run.trace_id, 16) != 0
    except ValueError:
        return False


def _ns(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _budget_attributes(run: Run) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name, (limit_key, used_field) in _LIMIT_FIELDS.items():
        limit = (run.limits or {}).get(limit_key)
        if limit is None:
            continue
        used = getattr(run, used_field)
        remaining = Decimal(str(limit)) - Decimal(str(used))
        attributes[f"cp.budget.remaining.{name}"] = (
            float(remaining) if name == "cost" else int(remaining)
        )
    return attributes


def subagent_span_id(tool_call_id: Any) -> int:
    """The span of a call that started a sub-agent run (its root's parent):
    64 bits of the call's row id, never the call's approval span's."""
    return ((uuid.UUID(str(tool_call_id)).int & 0xFFFF_FFFF_FFFF_FFFF) ^ 0x5A) or 1


def _root_parent(run: Run) -> otel_context.Context:
    """A top-level run's root has no parent; a sub-agent run's is the span of
    its parent's call, in the same trace (runs.subagent_spans)."""
    if run.parent_tool_call_id is None:
        return otel_context.Context()
    return _parent_context(_trace_id(run), subagent_span_id(run.parent_tool_call_id))


def _root_start(run: Run) -> None:
    # No look first: the first step of a run stores its root; a step that runs
    # step 0 again (after a crash, or a wait before the first model call) finds
    # the row in the store's get_or_create, which keeps it and logs nothing.
    agent = run.agent
    with (
        long_lived(),
        fixed_ids(trace_id=_trace_id(run), span_id=root_span_id(run)),
    ):
        # Started (and stored) now, ended by run_root_end in whichever process
        # finishes the run; this object is never ended, so never exported.
        tracer().start_span(
            f"invoke_agent {agent.slug}",
            context=_root_parent(run),
            kind=SpanKind.INTERNAL,
            attributes={
                **_run_attributes(run),
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent.slug,
                "gen_ai.agent.id": str(agent.id),
                **_version_attributes(run),
                "gen_ai.conversation.id": str(run.id),
                "gen_ai.input.messages": _json(
                    [{"role": "user", "content": run.input}]
                ),
            },
        )


def _resume_and_end(
    run: Run,
    *,
    span_id: str,
    attributes: dict[str, Any],
    error: str = "",
    error_type: str = "",
) -> None:
    """Start a stored long-lived span again with its ids and start time; end it."""
    row = Span.objects.filter(run=run, span_id=span_id).first()
    if row is None or row.status != Span.Status.RUNNING:
        return
    parent = (
        _parent_context(_trace_id(run), int(row.parent_span_id, 16))
        if row.parent_span_id
        else otel_context.Context()
    )
    with (
        long_lived(resumed=True),
        fixed_ids(trace_id=_trace_id(run), span_id=int(span_id, 16)),
    ):
        span = tracer().start_span(
            row.name,
            context=parent,
            start_time=_ns(row.started_at),
            attributes={**_run_attributes(run), **row.attributes, **attributes},
        )
    if error:
        span.set_attribute("error.type", error_type or error)
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def run_root_end(run: Run) -> None:
    """End the run's root span with its outcome; close what it left open."""
    for span in Span.objects.filter(
        run=run, status=Span.Status.RUNNING, trace_id=run.trace_id
    ).exclude(span_id=f"{root_span_id(run):016x}"):
        span_abandon(span=span, reason=f"the run ended ({run.status})")
    verdict, reason = run_verdict(run)
    error = ""
    if run.status not in (Run.Status.SUCCEEDED, Run.Status.UNVERIFIED):
        # What went wrong in words: the evaluator's reason when it failed the
        # run, else the host's detail; never the bare stop reason "done".
        error = (
            f"evaluation failed: {reason}"
            if verdict == "failed"
            else run.stop_detail or run.stop_reason or run.status
        )
    _resume_and_end(
        run,
        span_id=f"{root_span_id(run):016x}",
        attributes={
            "cp.run.status": run.status,
            "cp.run.stop_reason": run.stop_reason,
            "cp.run.stop_detail": run.stop_detail,
            "cp.evaluation.verdict": verdict,
            "cp.evaluation.reason": reason,
            "gen_ai.usage.input_tokens": run.input_tokens,
            "gen_ai.usage.output_tokens": run.output_tokens,
            "cp.run.cost": float(run.cost),
            "cp.run.steps": run.steps,
            "cp.run.tool_calls": run.tool_calls,
            "gen_ai.output.messages": _json(
                [{"role": "assistant", "content": run.final_answer}]
            ),
            **_budget_attributes(run),
        },
        error=error,
        error_type="evaluation_failed" if verdict == "failed" else run.stop_reason,
    )


def run_verdict(run: Run) -> tuple[str, str]:
    """The verdict on a finished run and its reason (see `verdict_of`)."""
    return verdict_of(run.status, run.evaluation)


def spans_end_of_finished_runs() -> int:
    """End the root span of runs whose finisher died after committing the outcome
    (before its step span ended the root): the root has no lease, so only this
    sees it. A finisher alive ends it within milliseconds; this waits a span lease."""
    cutoff = timezone.now() - dt.timedelta(seconds=settings.TRACING_SPAN_LEASE_SECONDS)
    roots = Span.objects.filter(
        status=Span.Status.RUNNING,
        parent_span_id="",
        lease_expires_at__isnull=True,
        run__status__in=Run.TERMINAL,
        run__finished_at__lt=cutoff,
    ).select_related("run")
    ended = 0
    for root in roots[:1000]:
        run = root.run
        if root.trace_id != run.trace_id or root.span_id != f"{root_span_id(run):016x}":
            continue  # an ingested span without a parent, not a run's root
        try:
            run_root_end(run)
            ended += 1
        except Exception:  # noqa: BLE001 - one run's trace never stops the sweep
            logger.warning("tracing: root end of run %s", run.id, exc_info=True)
    return ended


def spans_abandon_of_dead_workers(run: Run) -> None:
    """Abandon the run's task spans still running; the caller holds or just
    cleared the run's lease, so their workers died (or lost it) before ending them."""
    try:
        stale = Span.objects.filter(
            run=run, status=Span.Status.RUNNING, lease_expires_at__isnull=False
        ).filter(Q(lease_expires_at__lt=timezone.now()) | ~Q(worker=""))
        for span in stale:
            span_abandon(span=span, reason="its worker stopped before ending it")
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: sweeping spans of run %s", run.id, exc_info=True)


@contextmanager
def step_span(
    run: Run,
    *,
    traceparent: str | None = None,
    taken_over: bool = False,
    resumes_step: int | None = None,
) -> Iterator[trace.Span]:
    """The span of one task's step, a child of the run's root; ends the root when
    the run is over. `taken_over`: the previous step's worker did not release the
    lease, so its spans may still be running (recovery sweeps the others).
    `resumes_step`: the task finishes the open calls of that step (after an
    approval or a crash) instead of asking the model: the span is named for it."""
    if not _traced(run):
        yield trace.INVALID_SPAN
        return
    try:
        if taken_over:
            spans_abandon_of_dead_workers(run)
        if run.steps == 0:  # a later step runs after the first one stored it
            _root_start(run)
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: root span of run %s", run.id, exc_info=True)
    parent = _context_from_traceparent(traceparent or "") or _context_from_traceparent(
        traceparent_for(run)
    )
    # A step's span carries the index of the step it works on (the API's), so a
    # resumed step is not named after the model call that comes next.
    index = run.steps if resumes_step is None else resumes_step
    attributes: dict[str, Any] = {**_run_attributes(run), "cp.step.index": index}
    if resumes_step is not None:
        attributes["cp.step.resumed"] = True
    name = f"step {index}" if resumes_step is None else f"step {index} (resumed)"
    with tracer().start_as_current_span(
        name, context=parent, attributes=attributes
    ) as span:
        try:
            yield span
        finally:
            span.set_attribute("cp.run.status", run.status)
            for key, value in _budget_attributes(run).items():
                span.set_attribute(key, value)
    if run.is_terminal:
        try:
            run_root_end(run)
        except Exception:  # noqa: BLE001
            logger.warning("tracing: root end of run %s", run.id, exc_info=True)


class ChatRecorder:
    def __init__(self, span: trace.Span, run: Run | None = None) -> None:
        self.span = span
        self.run = run
        self.relay: SpanDeltaRelay | None = None

    def deltas(self) -> SpanDeltaRelay | None:
        """A sink for the reply's streamed text: live in the run's stream while
        the model writes (the span keeps the whole output when it ends)."""
        if self.run is None or not self.span.is_recording():
            return None
        span_id = f"{self.span.get_span_context().span_id:016x}"
        self.relay = SpanDeltaRelay(run_id=self.run.id, span_id=span_id)
        return self.relay

    def reply(self, reply: Any) -> None:
        """Record a ModelReply or a ModelError on the chat span."""
        span = self.span
        if self.relay is not None:
            self.relay.close()  # the tail, before the span's end goes out
            span.set_attribute("cp.model.live_messages", self.relay.messages)
        _routing_attributes(span, getattr(reply, "routing", None))
        if isinstance(reply, Exception):
            span.set_attribute(
                "error.type", getattr(reply, "kind", type(reply).__name__)
            )
            span.set_status(Status(StatusCode.ERROR, str(reply)))
            return
        span.set_attribute("cp.model.provider", reply.provider or "")
        span.set_attribute("gen_ai.response.model", reply.model or "")
        span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
        span.set_attribute("gen_ai.usage.input_tokens", reply.usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", reply.usage.output_tokens)
        if reply.response_id or reply.provider_request_id:
            span.set_attribute(
                "gen_ai.response.id", reply.response_id or reply.provider_request_id
            )
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [call.to_dict() for call in reply.tool_calls]
        span.set_attribute("gen_ai.output.messages", _json([message]))


def _routing_attributes(span: trace.Span, routing: Any) -> None:
    """Which endpoint and model answered, the circuit's state, a fallback's
    reason (runs.engine.adapters.breaker): on the span, and an event when the
    fallback answered or the circuit opened."""
    if not isinstance(routing, dict) or not span.is_recording():
        return
    span.set_attribute("cp.model.endpoint", str(routing.get("endpoint") or ""))
    span.set_attribute("cp.model.circuit", str(routing.get("circuit") or ""))
    span.set_attribute("cp.model.fallback_used", bool(routing.get("fallback_used")))
    answered = routing.get("answered_by") or {}
    if routing.get("fallback_used"):
        span.set_attribute("cp.model.fallback_reason", str(routing["fallback_reason"]))
        span.set_attribute("cp.model.answered_by.endpoint", str(answered["endpoint"]))
        span.set_attribute("cp.model.answered_by.model", str(answered["model"]))
        span.add_event(
            "model.fallback",
            {
                "cp.model.fallback_reason": str(routing["fallback_reason"]),
                "cp.model.answered_by.endpoint": str(answered["endpoint"]),
                "cp.model.answered_by.model": str(answered["model"]),
            },
        )
    if routing.get("circuit_opened"):
        span.add_event(
            "model.circuit_opened",
            {"cp.model.endpoint": str(routing.get("endpoint") or "")},
        )
    error = routing.get("primary_error")
    if isinstance(error, dict):
        span.set_attribute("cp.model.primary_error", str(error.get("kind") or ""))


@contextmanager
def chat_span(
    run: Run, *, messages_json: str, tools: Any, max_tokens: int | None = None
) -> Iterator[ChatRecorder]:
    """`chat {model}` around one model call; the caller records the reply.
    `messages_json`: the model's input messages, encoded."""
    if not _traced(run):
        yield ChatRecorder(trace.INVALID_SPAN)
        return
    agent = run.agent
    version = _version_attributes(run)
    attributes: dict[str, Any] = {
        **_run_attributes(run),
        "gen_ai.operation.name": "chat",
        **version,
        "gen_ai.agent.name": agent.slug,
        "gen_ai.input.messages": messages_json,
        "gen_ai.tool.definitions": _json(list(tools)),
    }
    if max_tokens:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    with (
        tracer().start_as_current_span(
            f"chat {version.get('gen_ai.request.model', '')}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
        ) as span,
        span_batch_flush_if_slow(),
    ):  # visible while a slow model works
        yield ChatRecorder(span, run)


class ToolRecorder:
    def __init__(self, span: trace.Span, run: Run) -> None:
        self.span = span
        self.run = run

    def result(self, result: Any, *, executed: bool = True) -> None:
        """Record a ToolResult; a sandbox report becomes a `sandbox` child span."""
        span = self.span
        span.set_attribute("gen_ai.tool.call.result", _json(result.to_dict()))
        span.set_attribute("cp.tool.executed", executed)
        if not result.ok:
            code = result.error.code if result.error is not None else None
            span.set_attribute("error.type", str(code or "tool_error"))
            span.set_status(Status(StatusCode.ERROR, str(code or "tool_error")))
        for ref in result.refs:
            if ref.get("kind") == "sandbox_result":
                self._sandbox(ref.get("result") or {})

    def tools_loaded(self, names: list[str]) -> None:
        """The deferred tools a tool_search call added to the run's tools."""
        if names:
            self.span.set_attribute("cp.tool_search.loaded", names)

    def _sandbox(self, report: dict[str, Any]) -> None:
        if not self.span.is_recording():
            return
        end = time_ns()
        duration_ms = report.get("duration_ms") or 0
        attributes: dict[str, Any] = {**_run_attributes(self.run)}
        for key in ("termination_cause", "exit_code", "signal_name", "error"):
            if report.get(key) is not None:
                attributes[f"cp.sandbox.{key}"] = report[key]
        for group in ("limits", "enforcement", "usage"):
            value = report.get(group)
            if isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(item, (str, bool, int, float)):
                        attributes[f"cp.sandbox.{group}.{key}"] = item
                    elif item is not None:
                        attributes[f"cp.sandbox.{group}.{key}"] = _json(item)
            elif isinstance(value, (str, bool, int, float)):
                attributes[f"cp.sandbox.{group}"] = value
        counts = report.get("network_counts")
        if isinstance(counts, dict):
            for decision, count in counts.items():
                attributes[f"cp.sandbox.egress.{decision}"] = int(count)
        span = tracer().start_span(
            "sandbox",
            start_time=end - int(float(duration_ms) * 1_000_000),
            attributes=attributes,
        )
        for entry in report.get("network_log") or ():
            if isinstance(entry, dict):
                _egress_event(span, entry, default_ns=end)
        cause = report.get("termination_cause")
        if cause and cause not in ("exited", "exit"):
            span.set_attribute("error.type", str(cause))
        span.end(end_time=end)


# A proxy log entry's keys shown on its `egress` span event (all of them: the log
# holds the credential's secret name, never its value).
_EGRESS_KEYS = (
    "target", "host", "port", "method", "decision", "reason", "address",
    "connect_attempted", "bytes_out", "bytes_in", "credential", "tls",
)  # fmt: skip


def _egress_event(span: trace.Span, entry: dict[str, Any], *, default_ns: int) -> None:
    """One `egress` event per connection the sandbox's proxy allowed or refused."""
    attributes: dict[str, Any] = {}
    for key in _EGRESS_KEYS:
        value = entry.get(key)
        if isinstance(value, (str, bool, int, float)):
            attributes[f"cp.egress.{key}"] = value
    addresses = entry.get("addresses")
    if isinstance(addresses, list):
        attributes["cp.egress.addresses"] = [str(a) for a in addresses]
    at = entry.get("at")
    timestamp = int(float(at) * 1e9) if isinstance(at, (int, float)) else default_ns
    span.add_event("egress", attributes=attributes, timestamp=timestamp)


def time_ns() -> int:
    import time

    return time.time_ns()


@contextmanager
def tool_span(run: Run, *, call: Any, effect: str = "") -> Iterator[ToolRecorder]:
    """`execute_tool {tool}` around one tool execution."""
    if not _traced(run):
        yield ToolRecorder(trace.INVALID_SPAN, run)
        return
    attributes: dict[str, Any] = {
        **_run_attributes(run),
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.call_id,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.arguments": call.raw_arguments or _json(call.arguments),
    }
    if effect:
        attributes["cp.tool.effect"] = effect
    with (
        tracer().start_as_current_span(
            f"execute_tool {call.name}", attributes=attributes
        ) as span,
        span_batch_flush_if_slow(),
    ):  # visible while a slow tool runs
        yield ToolRecorder(span, run)


@contextmanager
def under_run_root(run: Run) -> Iterator[None]:
    """Spans started inside are children of the run's root span: work done for
    the run outside any step (the lifecycle hooks of a run a person ended)."""
    parent = _context_from_traceparent(traceparent_for(run)) if _traced(run) else None
    if parent is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def guard_span(
    run: Run, *, name: str, attributes: dict[str, Any]
) -> Iterator[trace.Span]:
    """`guardrail {name}` or `hook {name}` around one check; the caller sets its
    verdict and latency (runs.services.guards)."""
    if not _traced(run):
        yield trace.INVALID_SPAN
        return
    with tracer().start_as_current_span(
        name, attributes={**_run_attributes(run), **attributes}
    ) as span:
        yield span


@contextmanager
def compaction_span(run: Run, *, attributes: dict[str, Any]) -> Iterator[trace.Span]:
    """`compaction` around one compaction of the run's context (its summary
    call is a `chat` child); the caller sets what it dropped and kept."""
    if not _traced(run):
        yield trace.INVALID_SPAN
        return
    with tracer().start_as_current_span(
        "compaction", attributes={**_run_attributes(run), **attributes}
    ) as span:
        yield span


def _approval_span_id(tool_call_id: Any) -> int:
    import uuid

    return (uuid.UUID(str(tool_call_id)).int >> 64) or 1


def approval_span_open(run: Run, *, tool_call: Any, decision: dict[str, Any]) -> None:
    """Start `approval {tool}` under the current step; it ends when decided."""
    if not _traced(run):
        return
    try:
        with (
            long_lived(),
            fixed_ids(trace_id=_trace_id(run), span_id=_approval_span_id(tool_call.id)),
        ):
            tracer().start_span(
                f"approval {tool_call.tool_name}",
                attributes={
                    **_run_attributes(run),
                    "gen_ai.tool.name": tool_call.tool_name,
                    "gen_ai.tool.call.id": tool_call.call_id,
                    "cp.approval.status": "pending",
                    "cp.approval.rule": str(decision.get("rule") or ""),
                    "cp.approval.reason": str(decision.get("reason") or ""),
                },
            )
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: approval span of %s", tool_call.id, exc_info=True)


def approval_span_settle(run: Run, *, tool_call: Any) -> None:
    """End the approval span once the request is decided (no-op while pending)."""
    if not _traced(run):
        return
    try:
        request = ApprovalRequest.objects.filter(tool_call_id=tool_call.id).first()
        if request is None or request.status == ApprovalRequest.Status.PENDING:
            return
        _resume_and_end(
            run,
            span_id=f"{_approval_span_id(tool_call.id):016x}",
            attributes=_decision_attributes(request),
        )
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: approval span of %s", tool_call.id, exc_info=True)


def _decision_attributes(request: ApprovalRequest) -> dict[str, Any]:
    """The decision as a person reads it on the node: who, when, why, for how
    long, and what the arguments were before a reviewer's edit."""
    decided_at = getattr(request, "decided_at", None) or timezone.now()
    decider = getattr(request, "decided_by", None)
    attributes: dict[str, Any] = {
        "cp.approval.status": request.status,
        "cp.approval.rule": request.rule,
        "cp.approval.wait_seconds": round(
            (decided_at - request.requested_at).total_seconds(), 3
        ),
        "cp.approval.decided_at": decided_at.isoformat(),
        "cp.approval.decision_reason": request.reason,
        "cp.approval.scope": request.scope,
    }
    if decider is not None:
        attributes["cp.approval.decider"] = decider.get_username()
    if request.original_args is not None:
        editor = request.args_edited_by
        attributes["cp.approval.args_edited"] = True
        attributes["cp.approval.args_before"] = _json(redact(request.original_args))
        attributes["cp.approval.args_after"] = _json(redact(request.args_snapshot))
        if editor is not None:
            attributes["cp.approval.args_edited_by"] = editor.get_username()
    return attributes


def gate_span_open(
    run: Run, *, approval: ApprovalRequest, parent_span_id: str = ""
) -> None:
    """Start `approval {tool}` in an external run's trace, for a gated call of
    its agent: under the caller's span when it named one (its own spans arrive
    over OTLP and draw around it), else at the trace's top. Ends when decided."""
    if not _traced(run):
        return
    parent = (
        _parent_context(_trace_id(run), int(parent_span_id, 16))
        if parent_span_id
        else otel_context.Context()
    )
    try:
        with (
            long_lived(),
            fixed_ids(trace_id=_trace_id(run), span_id=_approval_span_id(approval.id)),
        ):
            tracer().start_span(
                f"approval {approval.tool_name}",
                context=parent,
                attributes={
                    **_run_attributes(run),
                    "gen_ai.tool.name": approval.tool_name,
                    # What the approvals API calls the call (`tool_call_id`).
                    "gen_ai.tool.call.id": str(approval.id),
                    "gen_ai.tool.call.arguments": _json(redact(approval.args_snapshot)),
                    "cp.approval.kind": approval.kind,
                    "cp.approval.status": "pending",
                    "cp.approval.rule": approval.rule,
                    "cp.approval.reason": approval.rule_reason,
                },
            )
    except Exception:  # noqa: BLE001 - tracing never stops a gate
        logger.warning("tracing: approval span of %s", approval.id, exc_info=True)


def gate_span_settle(run: Run, *, approval: ApprovalRequest) -> None:
    """End a gated external call's approval span with its decision."""
    if not _traced(run):
        return
    try:
        _resume_and_end(
            run,
            span_id=f"{_approval_span_id(approval.id):016x}",
            attributes=_decision_attributes(approval),
        )
    except Exception:  # noqa: BLE001 - tracing never stops a gate
        logger.warning("tracing: approval span of %s", approval.id, exc_info=True)


# --- questions to a person (runs.services.questions) ----------------------------


def _question_span_id(question_id: Any) -> int:
    import uuid

    # The call's `execute_tool` span, kept open while its question waits (one
    # per question: an MCP call may ask more than once).
    return (uuid.UUID(str(question_id)).int >> 64) or 1


def question_span_open(run: Run, *, tool_call: Any, question: Any) -> None:
    """Start `execute_tool {tool}` showing the question; it ends when answered."""
    if not _traced(run):
        return
    try:
        with (
            long_lived(),
            fixed_ids(trace_id=_trace_id(run), span_id=_question_span_id(question.id)),
        ):
            tracer().start_span(
                f"execute_tool {tool_call.tool_name}",
                attributes={
                    **_run_attributes(run),
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool_call.tool_name,
                    "gen_ai.tool.call.id": tool_call.call_id,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.call.arguments": _json(tool_call.args),
                    "cp.question.id": str(question.id),
                    "cp.question.kind": question.kind,
                    "cp.question.text": question.question,
                    "cp.question.choices": list(question.choices),
                    "cp.question.status": "pending",
                },
            )
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: question span of %s", tool_call.id, exc_info=True)


def question_span_settle(
    run: Run, *, tool_call: Any, question: Any, result: Any
) -> None:
    """End the call's span with who answered what (or that it expired)."""
    if not _traced(run):
        return
    try:
        attributes: dict[str, Any] = {
            "cp.question.status": question.status,
            "gen_ai.tool.call.result": _json(result.to_dict()),
            "cp.tool.executed": False,
        }
        if question.answered_by is not None:
            attributes["cp.question.answer"] = question.answer
            attributes["cp.question.answered_by"] = question.answered_by.get_username()
        if question.answered_at is not None:
            attributes["cp.question.answered_at"] = question.answered_at.isoformat()
        _resume_and_end(
            run,
            span_id=f"{_question_span_id(question.id):016x}",
            attributes=attributes,
            error="" if result.ok else "ETIMEDOUT",
        )
    except Exception:  # noqa: BLE001 - tracing never stops a run
        logger.warning("tracing: question span of %s", tool_call.id, exc_info=True)
