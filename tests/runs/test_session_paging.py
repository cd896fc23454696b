"""The session API pages its entries (`after_seq`/`limit`, as the run events
API does): following `next_after_seq` reads a branched session's whole tree
exactly once in seq order, every page carrying the same whole `messages`; bad
paging input is a 400 naming the parameter; another tenant's run is a 404
(docs/api.md "Run diff", docs/engine.md "Session log")."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runs.engine.session import SessionEntry as Entry
from runs.engine.session import entry_id_for
from runs.models import Run, SessionEntry
from runs.services import run_start
from runs.services.branches import run_fork, run_retry
from runs.services.session import session_entries_append
from runs.session_api import SESSION_PAGE_DEFAULT, SESSION_PAGE_MAX

pytestmark = [pytest.mark.django_db(transaction=True)]

LOOKUP = {
    "text": "Let me look the order up.",
    "tool_calls": [
        {"id": "call_lookup", "name": "lookup_order", "arguments": {"order_id": "4821"}}
    ],
}
GREET = {"text": "The order is {{call_lookup.customer}}'s."}
# Labels logged on the original branch after it was branched: enough that the
# log outgrows the largest page.
LABELS = 1200


def read_all(client: Any, run: Run, query: str = "") -> list[dict[str, Any]]:
    """Every page of the run's session, following `next_after_seq`."""
    pages = []
    url = f"/api/v1/runs/{run.id}/session/?{query}"
    while True:
        response = client.get(url)
        assert response.status_code == 200, response.content
        pages.append(response.json())
        cursor = pages[-1]["next_after_seq"]
        if cursor is None:
            return pages
        assert cursor == pages[-1]["entries"][-1]["seq"]
        url = f"/api/v1/runs/{run.id}/session/?{query}&after_seq={cursor}"


@pytest.fixture
def branched(
    shop: Any, scripted_agent: Any, operator_user: Any, drive_run: Any
) -> tuple[Run, Run, Run]:
    """A session of three branches (the original, a retry and a fork of it)
    whose original branch also holds LABELS labels after its leaf."""
    agent = scripted_agent([LOOKUP, GREET], ["lookup_order"])
    original = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="whose is 4821?",
            started_by=operator_user,
        )  # fmt: skip
    )
    user_entry = SessionEntry.objects.get(
        run=original, type="message", payload__message__role="user"
    )
    retry = drive_run(run_retry(run=original, actor=operator_user))
    fork = drive_run(
        run_fork(
            run=original,
            actor=operator_user,
            from_entry=user_entry.entry_id,
            message="who ordered 4821?",
        )
    )
    last = SessionEntry.objects.filter(run=original).order_by("seq").last()
    assert last is not None
    labels = []
    parent = last.entry_id
    for seq in range(last.seq + 1, last.seq + 1 + LABELS):
        labels.append(Entry(seq, entry_id_for(seq), parent, "label", {"n": seq}))
        parent = entry_id_for(seq)
    session_entries_append(run_id=original.id, entries=labels)
    original.refresh_from_db()
    return original, retry, fork


def test_following_the_pages_reads_a_branched_log_once_in_seq_order(
    branched, operator_user, shop, api_client_for
):
    original, retry, fork = branched
    runs = {str(original.id), str(retry.id), str(fork.id)}
    stored = sorted(
        SessionEntry.objects.filter(run__in=branched).values_list(
            "seq", "run_id", "entry_id"
        )
    )
    assert len(stored) > SESSION_PAGE_MAX
    client = api_client_for(operator_user, shop)
    whole = client.get(f"/api/v1/runs/{fork.id}/session/").json()
    assert whole["messages"] == fork.engine_state["messages"]
    assert whole["leaf"] == fork.engine_state["session"]["leaf"]
    assert whole["count"] == len(stored)
    # The default page, then a small one that crosses the branches' rows
    # many times, then the largest.
    for query, size in [
        ("", SESSION_PAGE_DEFAULT),
        ("limit=7", 7),
        (f"limit={SESSION_PAGE_MAX}", SESSION_PAGE_MAX),
    ]:
        pages = read_all(client, fork, query)
        assert [len(p["entries"]) for p in pages[:-1]] == [size] * (len(pages) - 1)
        assert 0 < len(pages[-1]["entries"]) <= size
        read = [
            (e["seq"], uuid.UUID(e["run"]), e["id"])
            for page in pages
            for e in page["entries"]
        ]
        # Every entry, once, in seq order (the tree's order across branches).
        assert read == stored, query
        assert {e["run"] for p in pages for e in p["entries"]} == runs
        for page in pages:
            assert page["messages"] == whole["messages"]
            assert page["count"] == len(stored)
            assert page["run"] == str(fork.id)
    # Another branch of the same session pages the same tree, its own context.
    pages = read_all(client, retry, "limit=100")
    assert [(e["seq"], e["id"]) for p in pages for e in p["entries"]] == [
        (seq, entry) for seq, _, entry in stored
    ]
    assert pages[0]["messages"] == retry.engine_state["messages"]
    # `?leaf=` and paging together: the page is paged, the context is whole.
    second = whole["entries"][1]["id"]
    at = client.get(
        f"/api/v1/runs/{fork.id}/session/?leaf={second}&limit=3"
        f"&after_seq={stored[0][0]}"
    ).json()
    assert [e["seq"] for e in at["entries"]] == [s for s, _, _ in stored[1:4]]
    assert at["context_leaf"] == second
    assert at["messages"] == original.engine_state["messages"][:2]
    # An empty parameter is an absent one (as on the events API).
    blank = client.get(f"/api/v1/runs/{fork.id}/session/?after_seq=&limit=").json()
    assert blank["entries"] == whole["entries"]
    # Past the last entry: an empty last page.
    beyond = client.get(f"/api/v1/runs/{fork.id}/session/?after_seq={stored[-1][0]}")
    assert beyond.json()["entries"] == []
    assert beyond.json()["next_after_seq"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        (f"limit={SESSION_PAGE_MAX + 1}", "limit"),
        ("limit=ten", "limit"),
        ("limit=2.5", "limit"),
        ("limit=" + "9" * 40, "limit"),
        ("after_seq=-1", "after_seq"),
        ("after_seq=x", "after_seq"),
        ("after_seq=1e3", "after_seq"),
        ("after_seq=" + "9" * 30, "after_seq"),
        ("limit=5&leaf=nothex!", "leaf"),
    ],
)
def test_bad_paging_input_is_a_400_naming_the_field(
    query, field, demo_agent, operator_user, api_client_for
):
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug="kettlecraft-support",
        input="order 4821 arrived damaged",
        started_by=operator_user,
    )
    client = api_client_for(operator_user, demo_agent.tenant)
    response = client.get(f"/api/v1/runs/{run.id}/session/?{query}")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [field]


def test_another_tenants_run_is_a_404_on_every_page(
    branched, shop, operator_user, other_tenant, make_member, api_client_for
):
    original, _, fork = branched
    client = api_client_for(operator_user, shop)
    first = client.get(f"/api/v1/runs/{fork.id}/session/?limit=10").json()
    cursor = first["next_after_seq"]
    assert cursor is not None
    stranger = api_client_for(make_member(other_tenant, "sam", "admin"), other_tenant)
    for run in (original, fork):
        for query in ("", "limit=10", f"limit=10&after_seq={cursor}"):
            response = stranger.get(f"/api/v1/runs/{run.id}/session/?{query}")
            assert response.status_code == 404, (query, response.content)
            assert "entries" not in response.json()
