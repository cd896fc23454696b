"""GET /api/v1/runs/: filters, text search, sort and pages of the runs list, the
400s naming a bad parameter, and another tenant's runs never showing."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection

from runs.models import Run
from runs.selectors import RUN_SORT_FIELDS
from tests.run_list_data import RUNS, record_tool_calls, seed_run_list


@pytest.fixture
def runs(tenant: Any, operator_user: Any) -> dict[str, Run]:
    return seed_run_list(tenant, operator_user)


@pytest.fixture
def other_runs(other_tenant: Any, make_member: Any) -> dict[str, Run]:
    # The same agent slugs, words and waits in another tenant.
    return seed_run_list(other_tenant, make_member(other_tenant, "sam", "admin"))


@pytest.fixture
def client(tenant: Any, operator_user: Any, api_client_for: Any) -> Any:
    return api_client_for(operator_user, tenant)


def names(client: Any, runs: dict[str, Run], query: str) -> list[str]:
    response = client.get(f"/api/v1/runs/?{query}")
    assert response.status_code == 200, response.json()
    by_id = {str(run.id): name for name, run in runs.items()}
    body = response.json()
    assert body["count"] == len(body["results"]) or "limit=" in query
    return [by_id[row["id"]] for row in body["results"]]


NEWEST_FIRST = ["ping", "catalogue", "invoices", "lid", "parcel", "refund"]


FILTERS = [
    ("", NEWEST_FIRST),
    ("status=failed", ["parcel"]),
    ("status=waiting_approval", ["catalogue", "invoices", "lid"]),
    ("agent=alpha", ["ping", "parcel", "refund"]),
    ("agent=alpha&status=succeeded", ["ping", "refund"]),
    # [from, to): the hour bucket of `lid` (11-03 09:00) holds only it.
    ("from=2026-11-03T09:00:00Z&to=2026-11-03T10:00:00Z", ["lid"]),
    ("from=2026-11-03T09:00:01Z", ["ping", "catalogue", "invoices"]),
    # A date alone: `to` includes the day; an offset is honoured.
    ("from=2026-11-02&to=2026-11-03", ["invoices", "lid", "parcel"]),
    ("to=2026-11-01T12:30:00%2B02:00", ["refund"]),
    ("to=2026-11-01T12:30:00 02:00", ["refund"]),  # "+" sent unencoded
    ("from=2026-11-05T10:00:00", ["ping"]),  # no offset: UTC
    ("cost_gt=0.5", ["catalogue", "invoices", "parcel"]),
    ("cost_gt=0", ["ping", "catalogue", "invoices", "lid", "parcel", "refund"]),
    ("has_error=1", ["ping", "parcel"]),
    ("has_error=true", ["ping", "parcel"]),
    ("has_error=0", ["catalogue", "invoices", "lid", "refund"]),
    ("waiting=approval", ["lid"]),
    ("waiting=input", ["catalogue"]),
    ("waiting=budget", ["invoices"]),
    ("waiting=budget&agent=alpha", []),
    # Runs that called the tool, each once however many calls it made.
    ("tool=lookup_order", ["lid", "parcel", "refund"]),
    ("tool=refund", ["refund"]),
    ("tool=run_code", ["ping"]),
    ("tool=send_email", []),
    ("tool=Lookup_Order", []),  # names are exact
    # With the other filters (the overview's "by failures" link adds has_error).
    ("tool=lookup_order&has_error=1", ["parcel"]),
    ("tool=lookup_order&agent=beta", ["lid"]),
    ("tool=lookup_order&from=2026-11-02", ["lid", "parcel"]),
    ("tool=lookup_order&q=kettle", ["refund"]),
    # The end user a run serves, exactly.
    ("end_user=c-8812", ["lid", "refund"]),
    ("end_user=c-8812&status=succeeded", ["refund"]),
    ("end_user=c-1234", ["parcel"]),
    ("end_user=c-88", []),
    # Empty values filter nothing.
    (
        "status=&agent=&tool=&end_user=&from=&to=&cost_gt=&has_error=&waiting=&q=&sort=",
        NEWEST_FIRST,
    ),
]


def test_each_filter_lists_the_runs_that_match(
    client: Any, runs: dict[str, Run], other_runs: Any
) -> None:
    got = {query: names(client, runs, query) for query, _ in FILTERS}
    assert got == dict(FILTERS)


SEARCHES = [
    ("kettle", ["refund"]),  # input and final answer: listed once
    ("KETTLE", ["refund"]),
    ("issued", ["refund"]),  # the final answer alone
    ("leeds", ["ping"]),
    ("the", ["ping", "catalogue", "invoices", "lid", "refund"]),
    ("the lid", ["lid"]),  # every word
    ("refund parcel", []),
    ("100%", []),  # LIKE's wildcards are literal
    ("_", []),
]


def test_text_search_matches_every_word_in_input_or_final_answer(
    client: Any, runs: dict[str, Run], other_runs: Any
) -> None:
    got = {q: names(client, runs, f"q={quote(q)}") for q, _ in SEARCHES}
    assert got == dict(SEARCHES)


def test_search_combines_with_filters_and_pages(client: Any, runs: Any) -> None:
    assert names(client, runs, "q=the&agent=beta&sort=cost") == [
        "lid",
        "catalogue",
        "invoices",
    ]
    page = client.get("/api/v1/runs/?q=the&limit=2&offset=2").json()
    assert page["count"] == 5
    assert len(page["results"]) == 2


SORTS = [
    ("created_at", NEWEST_FIRST[::-1]),
    ("-cost", ["parcel", "invoices", "catalogue", "ping", "refund", "lid"]),
    ("cost", ["lid", "ping", "refund", "catalogue", "invoices", "parcel"]),
    ("agent", ["ping", "parcel", "refund", "catalogue", "invoices", "lid"]),
    ("-tokens", ["invoices", "lid", "refund", "catalogue", "parcel", "ping"]),
    ("steps", ["ping", "parcel", "lid", "refund", "invoices", "catalogue"]),
    ("status", ["parcel", "ping", "refund", "catalogue", "invoices", "lid"]),
    # Finished runs by their length; a run going on counts until now.
    ("duration", ["ping", "parcel", "refund", "catalogue", "invoices", "lid"]),
    ("-waiting", ["catalogue", "invoices", "lid", "ping", "parcel", "refund"]),
    # No end yet: last in both directions.
    ("finished_at", ["refund", "parcel", "ping", "catalogue", "invoices", "lid"]),
    ("-finished_at", ["ping", "parcel", "refund", "catalogue", "invoices", "lid"]),
]


def test_sort_by_a_column_with_newest_first_breaking_ties(
    client: Any, runs: Any
) -> None:
    got = {sort: names(client, runs, f"sort={sort}") for sort, _ in SORTS}
    assert got == dict(SORTS)


def test_pages_of_every_sort_neither_repeat_nor_skip_a_run(
    client: Any, runs: dict[str, Run]
) -> None:
    for sort in [f"{sign}{field}" for field in RUN_SORT_FIELDS for sign in ("", "-")]:
        whole = names(client, runs, f"sort={sort}")
        paged = [
            name
            for offset in range(0, len(RUNS), 4)
            for name in names(client, runs, f"sort={sort}&limit=4&offset={offset}")
        ]
        assert paged == whole, sort
        assert sorted(whole) == sorted(RUNS), sort


def test_rows_say_who_a_run_waits_on(client: Any, runs: dict[str, Run]) -> None:
    rows = {row["id"]: row for row in client.get("/api/v1/runs/").json()["results"]}
    assert rows[str(runs["lid"].id)]["waiting_on"] == {
        "approval": 1,
        "input": 0,
        "budget": 0,
    }
    assert rows[str(runs["catalogue"].id)]["waiting_on"]["input"] == 1
    assert rows[str(runs["refund"].id)]["waiting_on"] == {
        "approval": 0,
        "input": 0,
        "budget": 0,
    }


BAD = [
    ("status=bogus", "status"),
    ("sort=nope", "sort"),
    ("sort=--cost", "sort"),
    ("from=2026-13-01", "from"),
    ("from=2026-02-30T10:00:00Z", "from"),
    ("from=yesterday", "from"),
    ("to=12/03/2026", "to"),
    ("cost_gt=-1", "cost_gt"),
    ("cost_gt=abc", "cost_gt"),
    ("cost_gt=NaN", "cost_gt"),
    ("cost_gt=1e400", "cost_gt"),
    ("has_error=maybe", "has_error"),
    ("waiting=someone", "waiting"),
    ("q=a%00b", "q"),
    ("q=" + "x" * 201, "q"),
    ("agent=Not%20a%20slug", "agent"),
    ("tool=lookup.order", "tool"),
    ("tool=lookup%20order", "tool"),
    ("tool=" + "x" * 65, "tool"),
    ("tool=a%00b", "tool"),
    ("end_user=c%208812", "end_user"),
    ("end_user=" + "x" * 129, "end_user"),
]


def test_a_bad_parameter_is_a_400_naming_it(client: Any, runs: Any) -> None:
    for query, field in BAD:
        response = client.get(f"/api/v1/runs/?{query}")
        assert response.status_code == 400, (query, response.content)
        assert list(response.json()["error"]["fields"]) == [field], query
        assert "Traceback" not in response.content.decode()


def test_another_tenants_runs_never_match(
    client: Any,
    runs: dict[str, Run],
    other_runs: dict[str, Run],
    other_tenant: Any,
    api_client_for: Any,
) -> None:
    theirs = {str(run.id) for run in other_runs.values()}
    for query in [
        "",
        "agent=alpha",
        "q=kettle",
        "waiting=approval",
        "has_error=1",
        "cost_gt=0",
        "sort=-waiting",
        "sort=agent",
        "from=2026-01-01",
        "tool=lookup_order",
        "end_user=c-8812",
    ]:
        rows = client.get(f"/api/v1/runs/?{query}").json()["results"]
        assert rows, query
        assert not theirs & {row["id"] for row in rows}, query
    stranger = other_tenant.memberships.get().user
    other_client = api_client_for(stranger, other_tenant)
    mine = {str(run.id) for run in runs.values()}
    rows = other_client.get("/api/v1/runs/?q=kettle").json()["results"]
    assert [row["id"] for row in rows] == [str(other_runs["refund"].id)]
    assert not mine & {row["id"] for row in rows}
    waiting = other_client.get("/api/v1/runs/?sort=-waiting").json()["results"]
    assert sum(sum(row["waiting_on"].values()) for row in waiting) == 3


def test_a_tool_only_another_tenant_called_matches_none_of_mine(
    client: Any,
    runs: dict[str, Run],
    other_runs: dict[str, Run],
    other_tenant: Any,
    api_client_for: Any,
) -> None:
    theirs = other_runs["catalogue"]
    record_tool_calls(theirs, ["issue_voucher"])
    stranger = other_tenant.memberships.get().user
    seen = api_client_for(stranger, other_tenant).get(
        "/api/v1/runs/?tool=issue_voucher"
    )
    assert [row["id"] for row in seen.json()["results"]] == [str(theirs.id)]
    assert names(client, runs, "tool=issue_voucher") == []


def test_the_first_page_and_a_search_are_served_by_indexes(tenant: Any) -> None:
    """Newest first reads the (tenant, -created_at, -id) index; a search reads
    the tenant's rows by index, never the whole table."""
    from runs.selectors import RunListQuery, run_list_for
    from tests.test_indexes import plan, uses_index

    if connection.vendor == "postgresql":
        # Statistics left by earlier tests' runs would steer the planner here.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE runs_run")
    newest = plan(run_list_for(tenant=tenant)[:50])
    assert "run_list_newest" in newest, newest
    searched = plan(run_list_for(tenant=tenant, query=RunListQuery(text="kettle")))
    # The tenant's rows by index; on PostgreSQL with many runs the planner takes
    # the trigram indexes instead (bench_runs_search: 14x on a rare word), which
    # an empty test table cannot show.
    assert uses_index(searched), searched
