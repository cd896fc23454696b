"""The permission matrix: which role may do what in its tenant.

admin: everything in the tenant; operator: start and cancel runs, decide approvals,
send OTLP traces, and read; viewer: read. APIs (`action_required`), WebSocket
consumers, pages and OTLP ingest (`context_may`) ask here;
tests/test_permissions.py has a test per cell.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from controlplane.models import Role
from controlplane.tenancy import IsTenantMember, TenantContext, request_tenant_context


class Action(StrEnum):
    RUN_READ = "run.read"
    RUN_START = "run.start"
    RUN_CANCEL = "run.cancel"
    # Admins only: a run and everything recorded about it (exporting one is
    # run.read), and how long the tenant's runs are kept (docs/data.md).
    RUN_DELETE = "run.delete"
    RETENTION_WRITE = "retention.write"
    STREAM_READ = "stream.read"  # WebSocket streams of runs and the tenant
    PAGE_READ = "page.read"  # the browser pages
    APPROVAL_READ = "approval.read"
    APPROVAL_DECIDE = "approval.decide"
    POLICY_READ = "policy.read"
    POLICY_WRITE = "policy.write"
    BUDGET_READ = "budget.read"
    BUDGET_WRITE = "budget.write"
    AUDIT_READ = "audit.read"
    TRACE_INGEST = "trace.ingest"  # OTLP spans of external agents


_READ = frozenset(
    {
        Action.RUN_READ,
        Action.STREAM_READ,
        Action.PAGE_READ,
        Action.APPROVAL_READ,
        Action.POLICY_READ,
        Action.BUDGET_READ,
    }
)

MATRIX: dict[str, frozenset[Action]] = {
    Role.ADMIN: frozenset(Action),
    Role.OPERATOR: _READ
    | {
        Action.RUN_START,
        Action.RUN_CANCEL,
        Action.APPROVAL_DECIDE,
        Action.TRACE_INGEST,
    },
    Role.VIEWER: _READ,
}


def role_may(role: str, action: Action) -> bool:
    return action in MATRIX.get(role, frozenset())


def context_may(context: TenantContext | None, action: Action) -> bool:
    """For consumers and pages: a member of the tenant whose role allows it."""
    return context is not None and role_may(context.role, action)


def action_required(action: Action) -> type[BasePermission]:
    """A DRF permission class: a tenant member whose role allows `action`."""

    class MayDo(IsTenantMember):
        message = f"Your role may not do this ({action})."

        def has_permission(self, request: Request, view: Any) -> bool:
            if not super().has_permission(request, view):
                return False
            return context_may(request_tenant_context(request), action)

    MayDo.__name__ = f"May_{action.replace('.', '_')}"
    return MayDo


def method_actions(read: Action, write: Action) -> Any:
    """`get_permissions` for a view whose safe methods read and the rest write."""

    def get_permissions(view: Any) -> list[BasePermission]:
        safe = view.request.method in ("GET", "HEAD", "OPTIONS")
        return [action_required(read if safe else write)()]

    return get_permissions
