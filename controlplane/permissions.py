"""The permission gate: the matrix of which role may do what in its tenant, and
the one question every door asks of it.

admin: everything in the tenant (its members and everyone's API tokens too);
operator: start and cancel runs, decide approvals, send OTLP traces, ask for
external agents' gates, and read;
viewer: read. Every member manages their own API tokens and sees who they are
in a tenant.

Each door declares the action it needs and asks here: a DRF view maps its HTTP
methods to actions in `gate` (checked by `MayAct`, the default permission class),
a WebSocket consumer names its `gate_action`, and a plain Django view (a page,
OTLP ingest, the tenant switch) is marked with `@declares(action)` and asks
`context_may`. tests/test_permissions.py has a test per cell, and
tests/test_gate_coverage.py fails for a route that declares no action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, TypeVar

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from controlplane.models import Role
from controlplane.tenancy import TenantContext, request_tenant_context


class Action(StrEnum):
    RUN_READ = "run.read"
    RUN_START = "run.start"
    RUN_CANCEL = "run.cancel"
    # Admins only: a run and everything recorded about it (exporting one is
    # run.read), and how long the tenant's runs are kept (docs/data.md).
    RUN_DELETE = "run.delete"
    RETENTION_WRITE = "retention.write"
    # Agents, their versions and model endpoints, and MCP servers.
    AGENT_READ = "agent.read"
    MCP_WRITE = "mcp.write"  # register, refresh, accept and configure MCP servers
    # Admins only: create, edit (a new version), disable and delete agents, and
    # their model endpoints.
    AGENT_WRITE = "agent.write"
    STREAM_READ = "stream.read"  # WebSocket streams of runs and the tenant
    PAGE_READ = "page.read"  # the browser pages
    APPROVAL_READ = "approval.read"
    APPROVAL_DECIDE = "approval.decide"
    POLICY_READ = "policy.read"
    POLICY_WRITE = "policy.write"
    BUDGET_READ = "budget.read"
    BUDGET_WRITE = "budget.write"
    AUDIT_READ = "audit.read"
    # Secret names, who set them and when (agents and MCP servers refer to
    # them by name) for every member; setting and deleting for admins. No
    # action reads a value: the store is write-only (controlplane.secrets).
    SECRET_READ = "secret.read"
    SECRET_WRITE = "secret.write"
    TRACE_INGEST = "trace.ingest"  # OTLP spans of external agents
    # Put an external agent's tool call to the tenant's policy (POST
    # /api/v1/gates/): whoever may start runs may ask for a gate.
    GATE_REQUEST = "gate.request"
    # Every member: who they are in a tenant (and switching to it), and their
    # own API tokens.
    TENANT_READ = "tenant.read"
    TOKEN_MANAGE = "token.manage"
    # Admins only: the tenant's members (invite, create, role, deactivate) and
    # every member's API tokens (list, issue for them, revoke).
    MEMBER_MANAGE = "member.manage"
    TOKEN_MANAGE_ANY = "token.manage_any"
    # Evaluation suites and cases: every member reads them; operators and
    # admins write them (they are test data, not configuration that runs).
    EVAL_READ = "eval.read"
    EVAL_WRITE = "eval.write"
    # What the `memory` tool keeps about the end users runs serve: every member
    # reads it (runs show the same tool output); deleting it is for admins.
    MEMORY_READ = "memory.read"
    MEMORY_DELETE = "memory.delete"


_READ = frozenset(
    {
        Action.RUN_READ,
        Action.AGENT_READ,
        Action.STREAM_READ,
        Action.PAGE_READ,
        Action.APPROVAL_READ,
        Action.POLICY_READ,
        Action.BUDGET_READ,
        Action.SECRET_READ,
        Action.TENANT_READ,
        Action.TOKEN_MANAGE,
        Action.EVAL_READ,
        Action.MEMORY_READ,
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
        Action.GATE_REQUEST,
        Action.EVAL_WRITE,
    },
    Role.VIEWER: _READ,
}


def role_may(role: str, action: Action) -> bool:
    return action in MATRIX.get(role, frozenset())


def roles_that_may(action: Action) -> tuple[str, ...]:
    """The roles whose cell allows `action`, in Role order (admin first): the
    approver roles are `roles_that_may(Action.APPROVAL_DECIDE)`."""
    return tuple(role for role in Role.values if role_may(role, action))


def context_may(context: TenantContext | None, action: Action) -> bool:
    """For consumers and pages: a member of the tenant whose role allows it."""
    return context is not None and role_may(context.role, action)


# What a DRF view declares: the action each HTTP method needs.
Gate = Mapping[str, Action]

_ECHOES = ("HEAD", "OPTIONS")


def declared_action(view: Any, method: str) -> Action | None:
    """The action `view` declares for `method`; None when it declares none.

    HEAD and OPTIONS need what GET needs, or the one action of a view that
    declares only one (a POST-only view answers OPTIONS to those who may post).
    """
    gate: Gate = getattr(view, "gate", None) or {}
    method = method.upper()
    if method in gate:
        return gate[method]
    if method in _ECHOES:
        if "GET" in gate:
            return gate["GET"]
        actions = set(gate.values())
        if len(actions) == 1:
            return actions.pop()
    return None


class MayAct(BasePermission):
    """The gate at every DRF view: a member of the caller's tenant whose role
    allows the action the view declares (`gate`) for this method. A handler
    that declares none is refused, so a forgotten declaration fails closed."""

    message = "You are not a member of this tenant."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        method = request.method or ""
        context = request_tenant_context(request)
        if context is None:
            return False
        action = declared_action(view, method)
        if action is None:
            # A method the view does not offer is answered 405 by DRF; one it
            # offers without declaring an action is refused.
            self.message = "This operation declares no permission."
            return not hasattr(view, method.lower())
        if not role_may(context.role, action):
            self.message = f"Your role may not do this ({action})."
            return False
        return True


View = TypeVar("View", bound=Callable[..., Any])


def declares(action: Action) -> Callable[[View], View]:
    """Mark a plain Django view with the action it asks `context_may` about;
    the route walk in tests/test_gate_coverage.py reads the mark."""

    def mark(view: View) -> View:
        view.gate_action = action  # type: ignore[attr-defined]
        return view

    return mark
