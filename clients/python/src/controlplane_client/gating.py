"""`@gated`: a function call that runs only once the control plane lets it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from controlplane_client.client import ControlPlaneClient
from controlplane_client.models import GateDenied

P = ParamSpec("P")
R = TypeVar("R")


def current_trace_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current OpenTelemetry span, as 32 and 16 hex
    digits; None when OpenTelemetry is not installed or no span is recording."""
    try:
        from opentelemetry import trace
    except ImportError:  # the client does not depend on OpenTelemetry
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def gated(
    client: ControlPlaneClient,
    *,
    tool: str | None = None,
    effect: str = "write",
    input_schema: Mapping[str, Any] | None = None,
    agent: str | None = None,
    trace_id: Callable[[], str] | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Gate every call of the decorated function through the tenant's policy.

    The call's arguments (bound to the function's parameter names) are the
    gate's; once it is allowed or approved the function is called with the
    gate's arguments as keywords (an approver's edit included). Denied, expired
    or cancelled: GateDenied, and the function is not called. The trace is the
    current OpenTelemetry span's (its span is the parent of the approval span),
    or `trace_id()` when given."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)
        name = tool or function.__name__

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            ids = current_trace_ids()
            if trace_id is not None:
                trace, span = trace_id(), (ids[1] if ids else None)
            elif ids is not None:
                trace, span = ids
            else:
                raise RuntimeError(
                    f"{name}: no current OpenTelemetry span and no trace_id given; "
                    "a gate belongs to a trace"
                )
            gate = client.gate(
                tool=name,
                arguments=dict(bound.arguments),
                trace_id=trace,
                span_id=span,
                effect=effect,
                input_schema=input_schema,
                agent=agent,
            )
            gate = client.wait(gate, timeout=timeout)
            if not gate.passed:
                raise GateDenied(gate)
            return function(**gate.arguments)  # type: ignore[call-arg]

        return call

    return decorate
