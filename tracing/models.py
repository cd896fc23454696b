"""Spans of a run's trace and the run's append-only event log (DESIGN.md §3, §7).

Runs are `runs.Run` rows named by string: tracing sits below runs and never
imports it (the tables and their foreign keys are unchanged)."""

from __future__ import annotations

from django.db import models

from controlplane.models import Tenant

__all__ = ["RunEvent", "Span", "SpanLogMessage", "SpanPayload"]


class Span(models.Model):
    """One OpenTelemetry span, stored at start (status running) and updated at end."""

    class Status(models.TextChoices):
        RUNNING = "running"
        OK = "ok"
        ERROR = "error"
        UNSET = "unset"
        ABANDONED = "abandoned"  # its worker died before ending it

    # Looked up by run (and parent) through the (run, parent_span_id, started_at)
    # index: indexes of their own would only be more B-trees to write per span.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="spans", db_index=False
    )
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=300)
    kind = models.CharField(max_length=16, default="internal")
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.RUNNING
    )
    status_message = models.TextField(blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    attributes = models.JSONField(default=dict)
    events = models.JSONField(default=list)
    # name -> SpanPayload.sha256: model input/output, tool arguments/results.
    payloads = models.JSONField(default=dict)
    # Who is producing the span and until when; a running span past its lease
    # is abandoned by recovery.
    worker = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at", "id"]
        constraints = [
            # A span's identity is its id within its run, and a run's trace id is
            # unique within its tenant (runs.Run): span ids are unique per tenant
            # and trace, so one tenant's spans never collide with another's.
            models.UniqueConstraint(fields=["run", "span_id"], name="one_span_per_run")
        ]
        indexes = [models.Index(fields=["run", "parent_span_id", "started_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class SpanPayload(models.Model):
    """A large value (model input/output, tool arguments/results) stored once."""

    # Looked up by tenant through the (tenant, sha256) unique index.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    content = models.TextField()  # JSON text, already redacted
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "sha256"], name="one_payload_per_hash"
            )
        ]

    def __str__(self) -> str:
        return f"payload {self.sha256[:12]} ({self.size} bytes)"


class RunEvent(models.Model):
    """One entry of a run's append-only log; `seq` is gapless per run."""

    # Looked up by run through the (run, seq) unique index.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="events", db_index=False
    )
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="one_event_per_seq")
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq} of {self.run_id}"


class SpanLogMessage(models.Model):
    """Part of a span's model input or output that arrived as an OTLP log record
    (a GenAI event), kept so the span's payload can be put together whichever
    arrives first, the span or its events, and again when the span is sent again.

    Held by tenant and trace id until the trace's run exists (`run` empty: an
    hourly task drops those older than OTLP_LOG_PENDING_HOURS); from then on it
    goes with its run."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, db_index=False)
    run = models.ForeignKey(
        "runs.Run",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
    )
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    # The span payload it belongs to: gen_ai.input.messages, .output.messages or
    # gen_ai.system_instructions.
    key = models.CharField(max_length=64)
    # True: `content` is the whole payload (a details event); False: one message
    # of it, listed in (emitted_at, id) order.
    whole = models.BooleanField(default=False)
    emitted_at = models.DateTimeField()
    content = models.JSONField()  # redacted
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "trace_id", "span_id"]),
            models.Index(
                fields=["received_at"],
                condition=models.Q(run__isnull=True),
                name="pending_log_messages",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} of span {self.span_id}"
