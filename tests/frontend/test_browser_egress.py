"""The run page shows each connection run_code's sandbox made or was refused (the
`sandbox` span's egress events), in real Chromium against Daphne; the injected
credential shows by its secret's name only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from controlplane.secrets import secret_set
from runs.services import run_start
from tests.agents import make_agent
from tests.runs.conftest import drive
from tests.sandbox.egress_servers import upstream_server

pytestmark = [pytest.mark.browser]

SECRET = "pk-page-egress-9a8b7c6d5e4f3a2b1c0d"

PROGRAM = """
import urllib.request
for url in URLS:
    try:
        urllib.request.urlopen(url, timeout=10).read()
    except OSError as exc:
        print(exc)
"""


def test_the_sandbox_span_lists_each_egress_decision(
    tenant: Any, operator_user: Any, open_page: Any
) -> None:
    secret_set(tenant=tenant, name="PARTNER_KEY", value=SECRET, actor=None)
    with upstream_server() as upstream:
        target = f"localhost:{upstream.port}"
        urls = [f"http://{target}/orders", "http://10.20.30.40:8080/"]
        make_agent(
            tenant,
            "egress",
            tools=["run_code"],
            script=[
                {
                    "tool_calls": [
                        {
                            "id": "c1",
                            "name": "run_code",
                            "arguments": {"code": f"URLS = {urls!r}\n" + PROGRAM},
                        }
                    ]
                },
                {"text": "done"},
            ],
            tool_settings={
                "run_code": {
                    "network": [f"private:{target}", "10.20.30.40:8080"],
                    "credentials": {target: {"secret": "PARTNER_KEY", "tls": False}},
                    "approval": "never",
                }
            },
        )
        run = drive(
            run_start(tenant=tenant, agent_slug="egress", input="x", started_by=None)
        )
        assert len(upstream.requests) == 1
    page = open_page(operator_user, f"/runs/{run.id}/")
    tree = page.get_by_role("tree")
    tree.get_by_role("treeitem", name=re.compile(r"^sandbox")).click()
    table = page.get_by_test_id("span-egress")
    rows = table.locator("li")
    expect(rows).to_have_count(2)
    allowed = table.locator("li.egress-allow")
    expect(allowed).to_contain_text(target)
    expect(allowed).to_contain_text("PARTNER_KEY")
    refused = table.locator("li.egress-deny")
    expect(refused).to_contain_text("10.20.30.40:8080")
    expect(refused).to_contain_text("private address")
    assert SECRET not in page.content()
