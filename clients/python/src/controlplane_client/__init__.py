"""A typed client for the agent control plane, for agents that run in their own
process: gates (a tool call put to the tenant's policy, approved in the browser),
budget reservations, and webhook signature checks."""

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
from controlplane_client.webhooks import (
    SIGNATURE_HEADER,
    WebhookSignatureError,
    sign_webhook,
    verify_webhook,
)

__all__ = [
    "SIGNATURE_HEADER",
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
    "verify_webhook",
]
