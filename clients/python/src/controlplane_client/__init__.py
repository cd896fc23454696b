"""A typed client for the agent control plane, for agents that run in their own
process: gates (a tool call put to the tenant's policy, approved in the browser),
budget reservations, webhook signature checks, and eval runs of the agent
(`controlplane-client eval run`, controlplane_client.cli)."""

from controlplane_client.client import ControlPlaneClient
from controlplane_client.gating import current_trace_ids, gated
from controlplane_client.models import (
    BudgetExhausted,
    ControlPlaneError,
    Gate,
    GateDenied,
    GateTimeout,
    Reservation,
)
from controlplane_client.tracecontext import (
    TRACE_ID_ENV,
    TRACEPARENT_ENV,
    trace_context_from_env,
)
from controlplane_client.webhooks import (
    SIGNATURE_HEADER,
    WebhookSignatureError,
    sign_webhook,
    verify_webhook,
)

__all__ = [
    "SIGNATURE_HEADER",
    "TRACEPARENT_ENV",
    "TRACE_ID_ENV",
    "BudgetExhausted",
    "ControlPlaneClient",
    "ControlPlaneError",
    "Gate",
    "GateDenied",
    "GateTimeout",
    "Reservation",
    "WebhookSignatureError",
    "current_trace_ids",
    "gated",
    "sign_webhook",
    "trace_context_from_env",
    "verify_webhook",
]
