"""The eval pages' server-rendered shells: who gets which control, and another
tenant's suite or eval run is the product's 404 page naming what is missing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from runs.demo import demo_seed_shop
from runs.models import Agent
from runs.services.eval_external import eval_run_start_external
from runs.services.evals import eval_suite_create
from tests.conftest import _member
from tests.eval_compare_data import CASES, start

pytestmark = pytest.mark.django_db(transaction=True)


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def theirs(other_tenant: Any) -> Any:
    """Another tenant's suite and eval run (its runs never leave the queue here)."""
    demo_seed_shop(tenant=other_tenant)
    olga = _member(other_tenant, "olga", "admin")
    agent = Agent.objects.get(tenant=other_tenant, slug="kettlecraft-support")
    suite = eval_suite_create(
        tenant=other_tenant, actor=olga,
        document={"slug": "secret-suite", "name": "Theirs", "cases": CASES},
    )  # fmt: skip
    return start(suite, agent, olga, version=1, k=1)


def test_an_operator_gets_the_writing_controls_and_a_viewer_none(
    tenant: Any, operator_user: Any, viewer_user: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    eval_suite_create(
        tenant=tenant, actor=operator_user,
        document={"slug": "kettle", "name": "Kettle", "cases": CASES},
    )  # fmt: skip
    writer = _client(operator_user).get("/evals/suites/kettle/")
    assert writer.status_code == 200
    for marker in (b'id="case-form"', b'id="start-form"', b"case-edit", b"case-delete"):
        assert marker in writer.content
    assert b'id="import-form"' in _client(operator_user).get("/evals/").content
    reader = _client(viewer_user).get("/evals/suites/kettle/")
    assert reader.status_code == 200
    assert b"replacement-promised" in reader.content
    for marker in (b'id="case-form"', b'id="start-form"', b"case-edit", b"case-delete"):
        assert marker not in reader.content
    assert b'id="import-form"' not in _client(viewer_user).get("/evals/").content


def test_another_tenants_suite_and_eval_runs_are_not_found(
    tenant: Any, operator_user: Any, theirs: Any
) -> None:
    demo_seed_shop(tenant=tenant)
    agent = Agent.objects.get(tenant=tenant, slug="kettlecraft-support")
    suite = eval_suite_create(
        tenant=tenant, actor=operator_user,
        document={"slug": "kettle", "name": "Kettle", "cases": CASES},
    )  # fmt: skip
    ours = start(suite, agent, operator_user, version=1, k=1)
    client = _client(operator_user)
    listing = client.get("/evals/")
    assert b"secret-suite" not in listing.content and b"Theirs" not in listing.content
    missing = client.get("/evals/suites/secret-suite/")
    assert missing.status_code == 404 and b"There is no eval suite" in missing.content
    page = client.get(f"/evals/runs/{theirs.id}/")
    assert page.status_code == 404 and b"There is no eval run" in page.content
    compare = client.get(f"/evals/runs/{ours.id}/compare/{theirs.id}/")
    assert compare.status_code == 404
    assert b"(the after eval run)" in compare.content
    unknown = client.get(f"/evals/runs/{uuid.uuid4()}/compare/{ours.id}/")
    assert unknown.status_code == 404 and b"(the before eval run)" in unknown.content
    assert client.get(f"/evals/runs/{ours.id}/").status_code == 200


def test_an_external_agents_eval_run_is_shown_with_its_agents_name(
    tenant: Any, operator_user: Any
) -> None:
    suite = eval_suite_create(
        tenant=tenant, actor=operator_user,
        document={"slug": "outside", "name": "Outside", "cases": [
            {"slug": "hello", "input": "hi",
             "graders": [{"kind": "final_answer_regex", "pattern": "hello"}]},
        ]},
    )  # fmt: skip
    eval_run = eval_run_start_external(
        tenant=tenant, suite=suite, agent_name="payments-bot", k=1, user=operator_user
    )
    client = _client(operator_user)
    page = client.get(f"/evals/runs/{eval_run.id}/")
    assert page.status_code == 200
    assert b"external agent payments-bot" in page.content
    for path in ("/evals/suites/outside/", "/evals/"):
        listed = client.get(path)
        assert listed.status_code == 200
        assert b"payments-bot (external)" in listed.content
        assert b"vNone" not in listed.content
