"""The evaluation pages (docs/ui.md "Evals"): suites, a suite's cases and its
eval runs, an eval run's progress and results, and two eval runs compared.

The shells carry what the server knows at once (suites, cases, the start form's
choices); the modules read the eval run and the comparison from the API and
follow an eval run while it goes on. Members read; the controls that write
(import, case add/edit/delete, start) are rendered for EVAL_WRITE only, and
the API refuses them anyway."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse

from controlplane.permissions import Action, context_may
from controlplane.tenancy import TenantContext
from frontend.views import _not_found, _page, page_gate
from runs.evals import selectors as eval_selectors
from runs.evals.history import (
    eval_agent_choices,
    eval_run_headline,
    eval_runs_of_suite,
    eval_suite_latest_runs,
)
from runs.evals.results import eval_run_get_for

PAGE = "evals"


def _grader_text(grader: dict[str, Any]) -> str:
    """A grader in one line: its kind, then its keys (`must_call tool=lookup_order
    args={"order_id": "4821"}`)."""
    parts = [str(grader.get("kind", "?"))]
    for key, value in grader.items():
        if key == "kind":
            continue
        shown = value if isinstance(value, str) else json.dumps(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


def _approval_text(entry: dict[str, Any]) -> str:
    text = f"{entry.get('tool')}: {entry.get('decision')}"
    if entry.get("args") is not None:
        text += f" {json.dumps(entry['args'])}"
    if entry.get("reason"):
        text += f" (“{entry['reason']}”)"
    return text


def _can_write(context: TenantContext) -> bool:
    return context_may(context, Action.EVAL_WRITE)


@page_gate(Action.EVAL_READ, PAGE)
def evals_page(request: HttpRequest, context: TenantContext) -> HttpResponse:
    """The tenant's suites: cases, the latest eval run's figures, export; import
    for operators and admins."""
    latest = eval_suite_latest_runs(tenant=context.tenant)
    suites = [
        {
            "suite": suite,
            "latest": eval_run_headline(latest[suite.id])
            if suite.id in latest
            else None,
        }
        for suite in eval_selectors.eval_suite_list_for(tenant=context.tenant)
    ]
    extra = {"suites": suites, "can_write_evals": _can_write(context)}
    return _page(request, "frontend/evals.html", context, PAGE, extra)


@page_gate(Action.EVAL_READ, PAGE)
def eval_suite_page(
    request: HttpRequest, context: TenantContext, suite_slug: str
) -> HttpResponse:
    """One suite: its cases (edited here by operators and admins), its eval
    runs, and the form that starts one."""
    suite = eval_selectors.eval_suite_get_for(tenant=context.tenant, slug=suite_slug)
    if suite is None:
        return _not_found(
            request, context, PAGE, "Suite not found",
            f"There is no eval suite {suite_slug[:64]} in {context.tenant.name}.",
        )  # fmt: skip
    cases = [
        {
            "case": case,
            "graders": [_grader_text(g) for g in case.graders],
            "approvals": [_approval_text(a) for a in case.approvals],
            "graders_json": json.dumps(case.graders, indent=2),
            "approvals_json": json.dumps(case.approvals, indent=2),
            "world_json": json.dumps(case.world, indent=2),
        }
        for case in eval_selectors.eval_cases_of(suite=suite)
    ]
    runs = [
        eval_run_headline(r)
        for r in eval_runs_of_suite(tenant=context.tenant, suite=suite)[:50]
    ]
    agents = eval_agent_choices(tenant=context.tenant)
    extra = {
        "suite": suite,
        "cases": cases,
        "eval_runs": runs,
        "agents": agents,
        "can_write_evals": _can_write(context),
    }
    return _page(request, "frontend/eval_suite.html", context, PAGE, extra)


def _missing_run(
    request: HttpRequest, context: TenantContext, eval_run_id: object, note: str = ""
) -> HttpResponse:
    return _not_found(
        request, context, PAGE, "Eval run not found",
        f"There is no eval run {str(eval_run_id)[:40]} in {context.tenant.name}"
        f"{note}. The link may be mistyped, or it belongs to another tenant.",
    )  # fmt: skip


@page_gate(Action.EVAL_READ, PAGE)
def eval_run_page(
    request: HttpRequest, context: TenantContext, eval_run_id: object
) -> HttpResponse:
    """An eval run: progress while it goes, then its figures and each case's
    trials with their graders' reasons; "Compare with…" another of the suite."""
    eval_run = eval_run_get_for(tenant=context.tenant, eval_run_id=eval_run_id)
    if eval_run is None:
        return _missing_run(request, context, eval_run_id)
    others = [
        eval_run_headline(r)
        for r in eval_runs_of_suite(tenant=context.tenant, suite=eval_run.suite)[:50]
        if r.id != eval_run.id
    ]
    extra = {"eval_run": eval_run, "others": others}
    return _page(request, "frontend/eval_run.html", context, PAGE, extra)


@page_gate(Action.EVAL_READ, PAGE)
def eval_compare_page(
    request: HttpRequest,
    context: TenantContext,
    eval_run_id: object,
    other_eval_run_id: object,
) -> HttpResponse:
    """Two eval runs of a suite: flips (each opens the diff of its two trials),
    the deltas with their intervals, and the small-sample warning."""
    for side, key in (("before", eval_run_id), ("after", other_eval_run_id)):
        if eval_run_get_for(tenant=context.tenant, eval_run_id=key) is None:
            return _missing_run(request, context, key, f" (the {side} eval run)")
    extra = {"before_id": str(eval_run_id), "after_id": str(other_eval_run_id)}
    return _page(request, "frontend/eval_compare.html", context, PAGE, extra)
