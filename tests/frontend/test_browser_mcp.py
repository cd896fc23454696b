"""The MCP servers page in real Chromium: an admin refreshes a server whose tool
changed, sees the tool disabled with both definitions, and accepts it; a viewer
sees the pin status and no controls. A real MCP server over streamable HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from runs.models import McpTool
from runs.services.mcp import mcp_server_register
from tests.runs.mcp_servers import HttpMcpServer, build, redefine

pytestmark = [pytest.mark.browser]


def test_admin_accepts_a_changed_tool_and_a_viewer_only_reads(
    tenant: Any, admin_user: Any, viewer_user: Any, open_page: Any
) -> None:
    http = HttpMcpServer(build(0, 0, False))
    try:
        mcp_server_register(
            tenant=tenant, actor=admin_user,
            data={"slug": "warranty", "name": "Warranty", "transport": "http",
                  "url": http.url, "network": http.network},
        )  # fmt: skip
        page = open_page(admin_user, "/mcp-servers/")
        refused: list[str] = []
        page.on(
            "console",
            lambda msg: (
                refused.append(msg.text)
                if "Content Security Policy" in msg.text
                else None
            ),
        )
        page.reload()
        row = page.locator('tr[data-tool="warranty_lookup"]')
        expect(row.get_by_test_id("tool-status")).to_have_text("active")
        expect(row).to_contain_text("readOnlyHint: true")
        expect(row).to_contain_text("unknown (treated as an irreversible write)")

        def lookup(order_id: str) -> str:
            return "covered"

        redefine(http.server, "warranty_lookup", lookup, "Look up a warranty (v2).")
        page.get_by_role("button", name="Refresh the tools of Warranty").click()
        expect(page.locator("#mcp-status")).to_contain_text("changed: warranty_lookup")
        expect(row.get_by_test_id("tool-status")).to_have_text(
            "changed: disabled until accepted"
        )
        expect(row.get_by_test_id("listed-now")).to_contain_text(
            "Look up a warranty (v2)."
        )

        viewer = open_page(viewer_user, "/mcp-servers/")
        viewer_row = viewer.locator('tr[data-tool="warranty_lookup"]')
        expect(viewer_row.get_by_test_id("tool-status")).to_have_text(
            "changed: disabled until accepted"
        )
        expect(viewer.get_by_role("button", name="Accept")).to_have_count(0)
        expect(viewer.locator("main")).to_contain_text("Read only")

        row.get_by_role(
            "button", name="Accept the new definition of warranty_lookup"
        ).click()
        expect(row.get_by_test_id("tool-status")).to_have_text("active")
        expect(row).to_contain_text("Look up a warranty (v2).")
    finally:
        http.stop()
    assert refused == []  # no script or style of the page refused by the CSP
    tool = McpTool.objects.get(name="warranty_lookup")
    assert tool.status == "active"
    assert tool.accepted_description == "Look up a warranty (v2)."
    assert tool.accepted_by == admin_user
