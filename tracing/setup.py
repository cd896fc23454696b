"""One place that sets up OpenTelemetry for the web (ASGI) and worker processes."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

__all__ = ["configure_tracing", "fixed_ids", "tracer"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None  # _provider's; a step starts several spans
# Spans that live longer than one task (the run's root, an approval wait) are
# started again with the same ids when they end in another process.
_next_ids: contextvars.ContextVar[tuple[int | None, int] | None] = (
    contextvars.ContextVar("tracing_next_ids", default=None)
)


class RunIdGenerator(RandomIdGenerator):
    """Random ids, except where the caller pinned the next span's ids."""

    def generate_span_id(self) -> int:
        pinned = _next_ids.get()
        return pinned[1] if pinned else super().generate_span_id()

    def generate_trace_id(self) -> int:
        pinned = _next_ids.get()
        if pinned and pinned[0] is not None:
            return pinned[0]
        return super().generate_trace_id()


@contextmanager
def fixed_ids(*, span_id: int, trace_id: int | None = None) -> Iterator[None]:
    """Make the span started inside this block take these ids."""
    token = _next_ids.set((trace_id, span_id))
    try:
        yield
    finally:
        _next_ids.reset(token)


def configure_tracing(
    *, extra_processors: list[SpanProcessor] | None = None, force: bool = False
) -> TracerProvider:
    """Install our tracer provider: the run span processor (database + stream) and,
    when OTEL_EXPORTER_OTLP_ENDPOINT is set, a batch OTLP/HTTP exporter behind
    redaction. Idempotent per process; call it after a fork (Celery workers)."""
    global _provider, _tracer
    from tracing.processor import RedactingSpanExporter, RunSpanProcessor

    with _lock:
        if _provider is not None and not force:
            return _provider
        provider = TracerProvider(
            resource=Resource.create({"service.name": settings.OTEL_SERVICE_NAME}),
            id_generator=RunIdGenerator(),
        )
        provider.add_span_processor(RunSpanProcessor())
        endpoint = settings.OTEL_EXPORTER_OTLP_ENDPOINT
        if endpoint:
            exporter = _otlp_exporter(endpoint)
            provider.add_span_processor(
                BatchSpanProcessor(RedactingSpanExporter(exporter))
            )
            logger.info("tracing: exporting spans over OTLP to %s", endpoint)
        for processor in extra_processors or []:
            provider.add_span_processor(processor)
        if _provider is not None:
            _provider.shutdown()
        _provider = provider
        _tracer = provider.get_tracer("agent-control-plane")
        _set_global(provider)
        return provider


def _otlp_exporter(endpoint: str) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter,
    )

    # The standard variables (headers, timeout, compression) are read by the
    # exporter; the endpoint is the base URL, as OTEL_EXPORTER_OTLP_ENDPOINT says.
    return OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")


def _set_global(provider: TracerProvider) -> None:
    # The API allows one set_tracer_provider per process; our provider is
    # replaced (tests, a re-fork) by swapping the proxy's delegate.
    trace._TRACER_PROVIDER = provider  # noqa: SLF001
    trace._TRACER_PROVIDER_SET_ONCE._done = True  # noqa: SLF001


def tracer() -> trace.Tracer:
    """Our tracer; configures tracing on first use in a process that did not."""
    if _tracer is None:
        configure_tracing()
    assert _tracer is not None
    return _tracer
