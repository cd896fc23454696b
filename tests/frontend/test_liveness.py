"""What the header and the runs list say about the live stream, in real Chromium
against a real Daphne (heartbeat every 2 s) and Redis."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from runs.models import Run
from runs.services import run_start
from tests.conftest import wait_for
from tests.frontend.conftest import DaphneServer
from tests.runs.conftest import demo_agent, shop

pytestmark = [pytest.mark.browser]
__all__ = ["demo_agent", "shop"]

HEARTBEAT_SECONDS = 2
LIVE = re.compile(r"^● Live")
ACCESS_LINE = re.compile(r'(\S+) - - \[.*\] "(WSCONNECT|WSDISCONNECT) /ws/tenant/')


@pytest.fixture
def server(tmp_path: Path, transactional_db: Any) -> Iterator[DaphneServer]:
    daphne = DaphneServer(
        tmp_path, env={"STREAM_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS)}
    ).start()
    yield daphne
    daphne.stop()


@pytest.fixture
def finished_runs(demo_agent: Any, operator_user: Any) -> list[Run]:
    runs = [
        run_start(
            tenant=demo_agent.tenant,
            agent_slug=demo_agent.slug,
            input=f"question {i}",
            started_by=operator_user,
        )
        for i in range(3)
    ]
    # Finished, so nothing here needs a worker to move them.
    Run.objects.filter(id__in=[r.id for r in runs]).update(status=Run.Status.SUCCEEDED)
    return runs


def open_tenant_sockets(server: DaphneServer) -> set[str]:
    """Client addresses of /ws/tenant/ sockets Daphne holds open (its access log)."""
    open_now: set[str] = set()
    for line in server.output().splitlines():
        match = ACCESS_LINE.match(line)
        if match and match.group(2) == "WSCONNECT":
            open_now.add(match.group(1))
        elif match:
            open_now.discard(match.group(1))
    return open_now


def test_offline_page_stops_saying_live_within_two_heartbeats_and_keeps_its_rows(
    finished_runs: list[Run], operator_user: Any, open_page: Any, server: DaphneServer
) -> None:
    page = open_page(operator_user, "/runs/", server=server)
    conn = page.locator("#conn")
    rows = page.locator("#runs-body tr[data-run]")
    expect(conn).to_have_text(LIVE)
    expect(rows).to_have_count(3)
    expect(page.locator("#runs-stale")).to_be_hidden()

    # Offline, Chromium holds the socket's frames without closing it: only
    # the silence says the page is no longer live.
    page.context.set_offline(True)
    offline_at = time.monotonic()
    expect(conn).not_to_have_text(LIVE, timeout=4 * HEARTBEAT_SECONDS * 1000)
    went_stale_after = time.monotonic() - offline_at
    assert went_stale_after >= HEARTBEAT_SECONDS  # not on a heartbeat's own gap
    # The list's refresh fails: the rows stay, marked as not up to date.
    stale = page.locator("#runs-stale")
    expect(stale).to_be_visible(timeout=15_000)
    expect(stale).to_contain_text("Not up to date")
    expect(rows).to_have_count(3)
    for run in finished_runs:
        expect(page.locator(f'#runs-body tr[data-run="{run.id}"]')).to_be_visible()
    expect(page.locator("#runs-body")).not_to_contain_text("Failed to fetch")
    expect(conn).not_to_have_text(LIVE)

    page.context.set_offline(False)
    expect(conn).to_have_text(LIVE, timeout=30_000)
    expect(stale).to_be_hidden(timeout=15_000)
    expect(rows).to_have_count(3)


def test_logging_out_closes_the_sockets_of_every_tab(
    tenant: Any, operator_user: Any, open_page: Any, server: DaphneServer
) -> None:
    page = open_page(operator_user, "/runs/", server=server)
    other = page.context.new_page()
    other.goto("/approvals/")
    expect(page.locator("#conn")).to_have_text(LIVE)
    expect(other.locator("#conn")).to_have_text(LIVE)
    wait_for(lambda: len(open_tenant_sockets(server)) == 2, what="two open sockets")

    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/login/**")
    wait_for(
        lambda: not open_tenant_sockets(server),
        timeout=10,
        what="the server to see every tab's socket closed",
    )
    expect(other.locator("#conn")).to_have_text("■ Logged out")
    # The tab that stayed open does not reconnect with the ended session.
    time.sleep(2 * HEARTBEAT_SECONDS)
    assert not open_tenant_sockets(server)
