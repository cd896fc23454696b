"""The trace an eval trial runs under, handed to the agent in its environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# W3C trace context in the environment (the name OpenTelemetry's environment
# carriers use), and the bare trace id for agents that do not use it.
TRACEPARENT_ENV = "TRACEPARENT"
TRACE_ID_ENV = "CONTROLPLANE_TRACE_ID"


def trace_context_from_env(environ: Mapping[str, str] | None = None) -> Any:
    """An OpenTelemetry context whose remote parent is the `TRACEPARENT` the eval
    runner set, so the agent's spans join the trial's trace: pass it as
    `tracer.start_as_current_span(name, context=...)`. None when the variable
    is absent or OpenTelemetry is not installed."""
    environ = os.environ if environ is None else environ
    traceparent = environ.get(TRACEPARENT_ENV)
    if not traceparent:
        return None
    try:
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
    except ImportError:  # the client does not depend on OpenTelemetry
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})
