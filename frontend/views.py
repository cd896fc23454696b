"""Server-rendered shells of the browser UI; the ES modules fill them from the API.

Each page declares the action it needs and asks the permission gate here, so a
page the caller may not see is refused by the server (404 for another tenant's
run, 403 for the audit log of a non-admin) and controls a role may not use are
never rendered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from controlplane import selectors as tenancy_selectors
from controlplane.models import Role
from controlplane.permissions import Action, context_may, declares
from controlplane.tenancy import SESSION_TENANT_KEY, TenantContext, tenant_context_for
from runs import selectors as run_selectors
from runs.demo_scripts import DEMO_SCRIPTS
from runs.evaluators import EVALUATORS
from runs.models import AgentVersion, Run
from runs.services.agent_validation import APPROVAL_CHOICES, version_config_of
from runs.tools.registry import BUILTIN_TOOLS

PageBody = Callable[..., HttpResponse]


def _context(request: HttpRequest) -> TenantContext | None:
    return tenant_context_for(
        user=request.user, requested_slug=request.session.get(SESSION_TENANT_KEY)
    )


def _page(
    request: HttpRequest,
    template: str,
    context: TenantContext,
    page: str,
    extra: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    memberships = tenancy_selectors.memberships_of(user=context.user)
    values = {
        "page": page,
        "tenant_context": context,
        "memberships": memberships,
        "role": context.role,
        "can_decide": context_may(context, Action.APPROVAL_DECIDE),
        "can_start": context_may(context, Action.RUN_START),
        "can_cancel": context_may(context, Action.RUN_CANCEL),
        "can_edit_budget": context_may(context, Action.BUDGET_WRITE),
        "can_read_audit": context_may(context, Action.AUDIT_READ),
        "can_manage_members": context_may(context, Action.MEMBER_MANAGE),
        "can_manage_any_token": context_may(context, Action.TOKEN_MANAGE_ANY),
        "can_edit_agents": context_may(context, Action.AGENT_WRITE),
        "can_write_evals": context_may(context, Action.EVAL_WRITE),
        **(extra or {}),
    }
    return render(request, template, values, status=status)


def _not_found(
    request: HttpRequest, context: TenantContext, page: str, title: str, missing: str
) -> HttpResponse:
    """The product's 404 page (also under DEBUG, where Django would show its
    own): what is missing, in this tenant, and the ways back."""
    extra = {"missing_title": title, "missing": missing}
    return _page(request, "404.html", context, page, extra, status=404)


def page_gate(action: Action, page: str) -> Callable[[PageBody], PageBody]:
    """A signed-in member whose role may `action` gets the page (the body is
    called with their tenant context); others get a 403 page."""

    def decorate(body: PageBody) -> PageBody:
        @wraps(body)
        def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            context = _context(request)
            if context is None or not context_may(context, Action.PAGE_READ):
                # The chosen tenant may have removed or deactivated them while
                # others still count them in: offer those.
                user = request.user
                others = (
                    tenancy_selectors.memberships_of(user=user)
                    if isinstance(user, User)
                    else []
                )
                return render(
                    request,
                    "frontend/no_tenant.html",
                    {"page": page, "other_memberships": others},
                    status=403,
                )
            if not context_may(context, action):
                return _page(
                    request, "frontend/forbidden.html", context, page, status=403
                )
            return body(request, context, *args, **kwargs)

        return login_required(declares(action)(view))

    return decorate


@page_gate(Action.PAGE_READ, "overview")
def overview_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant at a glance: charts of runs, durations, approvals, spend."""
    return _page(request, "frontend/overview.html", context, "overview")


@page_gate(Action.PAGE_READ, "runs")
def runs_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The runs list: live status, filters and the start-a-run form."""
    extra = {"run_statuses": Run.Status.values}
    return _page(request, "frontend/runs.html", context, "runs", extra)


@page_gate(Action.PAGE_READ, "runs")
def run_page(request: HttpRequest, context: TenantContext, run_id: str) -> HttpResponse:
    """One run: its trace tree, span details, approvals, budget burn."""
    run = run_selectors.run_get_for(tenant=context.tenant, run_id=run_id)
    if run is None:
        return _not_found(
            request,
            context,
            "runs",
            "Run not found",
            f"There is no run {run_id[:40]} in {context.tenant.name}. The link "
            "may be mistyped, or the run belongs to another tenant.",
        )
    extra = {"run_id": str(run.id), "run": run}
    return _page(request, "frontend/run.html", context, "runs", extra)


@page_gate(Action.RUN_READ, "runs")
def run_diff_page(
    request: HttpRequest, context: TenantContext, run_id: str, other_id: str
) -> HttpResponse:
    """Two runs side by side, steps aligned by meaning (runs/run_diff.py)."""
    for side, key in (("left", run_id), ("right", other_id)):
        if run_selectors.run_for_tenant(tenant=context.tenant, run_id=key) is None:
            return _not_found(
                request,
                context,
                "runs",
                "Run not found",
                f"There is no run {key[:40]} in {context.tenant.name} (the {side} "
                "run of the comparison). The link may be mistyped, or the run "
                "belongs to another tenant.",
            )
    extra = {"run_id": run_id, "other_id": other_id}
    return _page(request, "frontend/run_diff.html", context, "runs", extra)


@page_gate(Action.PAGE_READ, "runs")
def run_replay_page(
    request: HttpRequest, context: TenantContext, run_id: str
) -> HttpResponse:
    """A run beside its replay from the record (runs/run_diff.py)."""
    if run_selectors.run_for_tenant(tenant=context.tenant, run_id=run_id) is None:
        return _not_found(
            request,
            context,
            "runs",
            "Run not found",
            f"There is no run {run_id[:40]} in {context.tenant.name}. The link may "
            "be mistyped, or the run belongs to another tenant.",
        )
    extra = {"run_id": run_id, "other_id": run_id, "replay": True}
    return _page(request, "frontend/run_diff.html", context, "runs", extra)


@page_gate(Action.PAGE_READ, "approvals")
def approvals_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """Every pending approval of the tenant, oldest first; and those decided."""
    extra = {"undo_seconds": settings.APPROVAL_UNDO_SECONDS}
    return _page(request, "frontend/approvals.html", context, "approvals", extra)


@page_gate(Action.PAGE_READ, "budget")
def budget_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's limits and usage; those who may write the budget edit them."""
    return _page(request, "frontend/budget.html", context, "budget")


@page_gate(Action.MEMORY_READ, "end-users")
def end_users_page(
    request: HttpRequest, context: TenantContext, end_user: str = ""
) -> HttpResponse:
    """The end users runs serve: what the memory tool keeps about each, and
    their budget use; admins delete an end user's memory."""
    extra = {
        "end_user": end_user,
        "can_delete_memory": context_may(context, Action.MEMORY_DELETE),
    }
    return _page(request, "frontend/end_users.html", context, "end-users", extra)


@page_gate(Action.RUN_READ, "demos")
def demos_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The eleven demo scripts (docs/demo.md), each with a run button for
    those who may start runs; viewers read what each shows."""
    extra = {"scripts": DEMO_SCRIPTS}
    return _page(request, "frontend/demos.html", context, "demos", extra)


@page_gate(Action.AUDIT_READ, "audit")
def audit_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's audit log (admins only)."""
    return _page(request, "frontend/audit.html", context, "audit")


@page_gate(Action.SECRET_READ, "secrets")
def secrets_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's secret names, who set them and when; admins set and delete
    (the value input is write-only: nothing on the page ever shows a value)."""
    extra = {"can_write_secrets": context_may(context, Action.SECRET_WRITE)}
    return _page(request, "frontend/secrets.html", context, "secrets", extra)


@page_gate(Action.AGENT_READ, "mcp")
def mcp_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's MCP servers and their tools' pin status; admins refresh a
    server and accept a changed definition."""
    extra = {"can_write_mcp": context_may(context, Action.MCP_WRITE)}
    return _page(request, "frontend/mcp_servers.html", context, "mcp", extra)


@page_gate(Action.MEMBER_MANAGE, "members")
def members_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's members (admins): invite, create, roles, deactivation."""
    extra = {"roles": Role.values}
    return _page(request, "frontend/members.html", context, "members", extra)


@page_gate(Action.TOKEN_MANAGE, "tokens")
def tokens_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """API tokens: a member's own; an admin's view takes in every member's."""
    return _page(request, "frontend/tokens.html", context, "tokens")


def _form_values(version: AgentVersion | None) -> dict[str, Any]:
    """What the agent form shows: the version's configuration, the lists one
    entry a line and the objects as JSON (a new agent's: empty)."""
    config: dict[str, Any] = {} if version is None else version_config_of(version)
    return {
        "name": config.get("name", ""),
        "endpoint": config.get("endpoint", ""),
        "model": config.get("model", ""),
        "fallback_endpoint": config.get("fallback_endpoint") or "",
        "fallback_model": config.get("fallback_model", ""),
        "evaluated_models": "\n".join(config.get("evaluated_models", [])),
        "system_prompt": config.get("system_prompt", ""),
        "skills": json.dumps(config.get("skills", []), indent=2),
        "tools": "\n".join(config.get("tools", [])),
        "tool_settings": json.dumps(config.get("tool_settings", {}), indent=2),
        "default_limits": json.dumps(config.get("default_limits", {}), indent=2),
        "evaluator": config.get("evaluator", ""),
        "script": json.dumps(config.get("script", []), indent=2),
        "guardrails": json.dumps(config.get("guardrails", []), indent=2),
        "hooks": json.dumps(config.get("hooks", []), indent=2),
        "subagents": json.dumps(config.get("subagents", []), indent=2),
    }


def _form_choices(context: TenantContext) -> dict[str, Any]:
    return {
        "endpoints": run_selectors.model_endpoint_list_for(tenant=context.tenant),
        "builtin_tools": sorted(BUILTIN_TOOLS),
        "evaluators": sorted(EVALUATORS),
        "approval_choices": APPROVAL_CHOICES,
    }


@page_gate(Action.AGENT_READ, "agents")
def agents_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's agents and model endpoints; admins create them here."""
    extra = {
        "agents": run_selectors.agent_list_for(tenant=context.tenant),
        "form": _form_values(None),
        **_form_choices(context),
    }
    return _page(request, "frontend/agents.html", context, "agents", extra)


@page_gate(Action.AGENT_READ, "agents")
def agent_page(
    request: HttpRequest, context: TenantContext, agent_id: str
) -> HttpResponse:
    """One agent: its current configuration, its versions (compare, restore)
    and, for admins, the edit form and disable and delete."""
    agent = run_selectors.agent_get_for(tenant=context.tenant, agent_id=agent_id)
    if agent is None or agent.current_version is None:
        return _not_found(
            request,
            context,
            "agents",
            "Agent not found",
            f"There is no agent {agent_id[:40]} in {context.tenant.name}. It may "
            "have been deleted, or the link is mistyped.",
        )
    versions = list(run_selectors.agent_versions_for(agent=agent))
    extra = {
        "agent": agent,
        "version": agent.current_version,
        "config": version_config_of(agent.current_version),
        "versions": versions,
        "form": _form_values(agent.current_version),
        **_form_choices(context),
    }
    return _page(request, "frontend/agent.html", context, "agents", extra)
