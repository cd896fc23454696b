"""axe-core on every page of the product, in real Chromium against Daphne: no
serious or critical violation anywhere.

The pages come from the URL configuration (every page of `frontend.urls`, plus
the login, accept and not-found pages), so a page added later is checked too;
a page with an argument this test does not know how to fill fails loudly.

axe-core is vendored for the tests only (tests/frontend/vendor/axe.min.js,
v4.14.1 from npm's axe-core package, MPL-2.0: see axe-core.LICENSE there).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.urls import URLPattern
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from controlplane.members import member_create
from frontend import urls as frontend_urls
from runs.services import run_start
from runs.services.evals import eval_suite_create
from tests.eval_compare_data import CASES, finished, start
from tests.frontend.test_browser import shop, waiting_run

__all__ = ["shop"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.worker,
    pytest.mark.usefixtures("runs_settle_before_flush"),
]

AXE = (Path(__file__).parent / "vendor" / "axe.min.js").read_text()
SERIOUS = {"serious", "critical"}


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Run axe on what the page shows now; the serious and critical findings."""
    page.evaluate(AXE)  # DevTools evaluation: the page's CSP does not apply
    found: list[dict[str, Any]] = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ["violations"]}))
          .violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" ") + " :: "
              + n.failureSummary)}))"""
    )
    return [v for v in found if v["impact"] in SERIOUS]


def page_paths(values: dict[str, str]) -> list[str]:
    """Every page of the product's UI, its arguments filled from `values`."""
    paths = []
    for pattern in frontend_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        names = re.findall(r"<(?:\w+:)?(\w+)>", route)
        missing = [n for n in names if n not in values]
        assert not missing, f"teach test_accessibility a value for {missing} ({route})"
        for name in names:
            route = re.sub(rf"<(?:\w+:)?{name}>", values[name], route)
        paths.append("/" + route)
    return paths


def test_axe_finds_no_serious_violation_on_any_page(
    shop: Any,
    admin_user: Any,
    operator_user: Any,
    viewer_user: Any,
    open_page: Any,
    daphne: Any,
    chromium: Any,
    ui_worker: Any,
) -> None:
    run = waiting_run(shop, operator_user)
    approval = ApprovalRequest.objects.get(run=run)
    from runs.models import Agent

    agent = Agent.objects.get(tenant=shop, slug="kettlecraft-support")
    page = open_page(admin_user, "/runs/")
    failures: dict[str, list[dict[str, Any]]] = {}

    def check(where: str) -> None:
        found = axe_violations(page)
        if found:
            failures[where] = found

    # A second run for the run diff page: queued, nothing to compare yet.
    other = run_start(
        tenant=shop, agent_slug="kettlecraft-support", input="Where is order 4821?",
        started_by=operator_user, end_user="customer-42",
    )  # fmt: skip
    # A suite and two finished eval runs of it for the eval pages.
    suite = eval_suite_create(
        tenant=shop, actor=operator_user,
        document={"slug": "kettle", "name": "Kettle support", "cases": CASES},
    )  # fmt: skip
    first = finished(start(suite, agent, operator_user, version=1, k=1))
    second = finished(start(suite, agent, operator_user, version=1, k=1))
    values = {
        "run_id": str(run.id),
        "agent_id": str(agent.id),
        "other_id": str(other.id),
        "suite_slug": suite.slug,
        "eval_run_id": str(first.id),
        "other_eval_run_id": str(second.id),
        "end_user": other.end_user,
    }
    for path in page_paths(values):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        check(path)

    # The run page with a span's payloads open (scrollable regions) and the
    # approval's form, and the inbox's decided tab.
    page.goto(f"/runs/{run.id}/")
    tree = page.get_by_role("tree")
    tree.get_by_role("treeitem", name=re.compile(r"^chat")).first.click()
    expect(page.locator("#detail pre").first).to_be_visible()
    check("run page, a chat span selected")
    tree.get_by_role("treeitem", name=re.compile(r"^approval")).first.click()
    expect(page.locator("#detail .approval-card")).to_be_visible()
    check("run page, the approval selected")
    page.set_viewport_size({"width": 390, "height": 844})
    check("run page at 390×844")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto("/approvals/?tab=decided")
    page.wait_for_load_state("networkidle")
    check("inbox, decided tab")

    # Pages people see outside the product's pages: not found, forbidden, the
    # accept page of a password link, and the login page.
    assert page.goto(f"/runs/{approval.id}/").status == 404
    check("run not found")
    viewer = open_page(viewer_user, "/runs/")
    assert viewer.goto("/audit/").status == 403
    found = axe_violations(viewer)
    if found:
        failures["forbidden"] = found
    anonymous = chromium.new_context(base_url=daphne.url)
    try:
        visitor = anonymous.new_page()
        added = member_create(
            tenant=shop, username="nina-new", email="", role="viewer",
            actor=admin_user,
        )  # fmt: skip
        assert added.link is not None
        token = added.link.token
        for path in ("/login/", f"/accept/{token}/", "/accept/not-a-token/"):
            visitor.goto(path)
            found = axe_violations(visitor)
            if found:
                failures[f"anonymous {path}"] = found
    finally:
        anonymous.close()
    assert not failures, "\n".join(
        f"{where}: {v['impact']} {v['id']} ({v['help']}): {v['nodes']}"
        for where, found in failures.items()
        for v in found
    )
    assert approval.status == "pending"
