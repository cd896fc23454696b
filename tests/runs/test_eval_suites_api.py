"""Eval suites through the API: CRUD of suites and cases, YAML import that is
strict (unknown keys named by path, nothing written) and export that round-trips,
roles and tenants."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controlplane.models import AuditEvent
from runs.evals.demo import DEMO_SUITE_FILE, demo_seed_evals
from runs.evals.graders import graders_check_against
from runs.evals.selectors import eval_suite_document
from runs.models import EvalCase, EvalSuite

pytestmark = pytest.mark.django_db

SUITES = "/api/v1/evals/suites/"
CASE = {"slug": "one", "input": "order 4821 is dented",
        "graders": [{"kind": "must_call", "tool": "lookup_order"}]}  # fmt: skip
SUITE = {"slug": "smoke", "name": "Smoke", "cases": [CASE]}


def test_operators_create_read_edit_and_delete_suites_and_cases(
    tenant, operator_user, api_client_for
):
    api = api_client_for(operator_user, tenant)
    created = api.post(SUITES, SUITE, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["cases"][0]["graders"] == CASE["graders"]
    assert [s["slug"] for s in api.get(SUITES).json()] == ["smoke"]
    assert api.get(SUITES).json()[0]["case_count"] == 1
    patched = api.patch(f"{SUITES}smoke/", {"name": "Smoke test"}, format="json")
    assert patched.json()["name"] == "Smoke test"
    deny = {"tool": "create_replacement", "decision": "deny", "reason": "photo"}
    second = {**CASE, "slug": "two", "approvals": [deny]}
    assert api.post(f"{SUITES}smoke/cases/", second, format="json").status_code == 201
    edited = api.patch(f"{SUITES}smoke/cases/two/", {"input": "new"}, format="json")
    assert edited.json()["input"] == "new"
    assert edited.json()["approvals"] == second["approvals"]
    assert [c["slug"] for c in api.get(f"{SUITES}smoke/cases/").json()] == [
        "one",
        "two",
    ]
    assert api.delete(f"{SUITES}smoke/cases/two/").status_code == 204
    last = api.delete(f"{SUITES}smoke/cases/one/")
    assert last.status_code == 409
    assert EvalCase.objects.filter(slug="one").exists()
    assert api.delete(f"{SUITES}smoke/").status_code == 204
    assert not EvalSuite.objects.exists() and not EvalCase.objects.exists()
    assert AuditEvent.objects.filter(action="eval_suite.create").count() == 1


def test_viewers_read_but_cannot_write(
    tenant, operator_user, viewer_user, api_client_for
):
    api_client_for(operator_user, tenant).post(SUITES, SUITE, format="json")
    viewer = api_client_for(viewer_user, tenant)
    assert viewer.get(f"{SUITES}smoke/").status_code == 200
    assert viewer.post(SUITES, {**SUITE, "slug": "x"}, format="json").status_code == 403
    assert (
        viewer.patch(f"{SUITES}smoke/", {"name": "X"}, format="json").status_code == 403
    )
    assert viewer.delete(f"{SUITES}smoke/").status_code == 403
    text = yaml.safe_dump({**SUITE, "slug": "y"})
    refused = viewer.post(f"{SUITES}import/", text, content_type="application/yaml")
    assert refused.status_code == 403
    assert list(EvalSuite.objects.values_list("slug", "name")) == [("smoke", "Smoke")]


def test_another_tenants_suites_are_not_found(
    tenant, other_tenant, operator_user, make_member, api_client_for
):
    api_client_for(operator_user, tenant).post(SUITES, SUITE, format="json")
    stranger = make_member(other_tenant, "olga", "admin")
    api = api_client_for(stranger, other_tenant)
    assert api.get(SUITES).json() == []
    for path in ("smoke/", "smoke/export/", "smoke/cases/", "smoke/cases/one/"):
        assert api.get(SUITES + path).status_code == 404, path
    assert api.delete(f"{SUITES}smoke/").status_code == 404
    assert EvalSuite.objects.filter(tenant=tenant).exists()


def test_bad_definitions_are_refused_naming_the_field_and_nothing_is_written(
    tenant, operator_user, api_client_for
):
    api = api_client_for(operator_user, tenant)
    empty = api.post(SUITES, {**SUITE, "cases": []}, format="json")
    assert empty.status_code == 400
    assert empty.json()["error"]["fields"] == {"cases": ["needs at least one entry"]}
    bad_case = {
        **CASE,
        "slug": "two",
        "graders": [{"kind": "must_call", "tool": "t", "tol": 1}],
    }
    typo = api.post(SUITES, {**SUITE, "cases": [CASE, bad_case]}, format="json")
    assert typo.status_code == 400
    assert list(typo.json()["error"]["fields"]) == ["cases[1].graders[0].tol"]
    assert api.post(SUITES, ["not", "a", "suite"], format="json").status_code == 400
    assert not EvalSuite.objects.exists() and not EvalCase.objects.exists()
    api.post(SUITES, SUITE, format="json")
    dup = api.post(f"{SUITES}smoke/cases/", CASE, format="json")
    assert dup.json()["error"]["fields"] == {"slug": ["case 'one' exists"]}
    unknown = api.post(f"{SUITES}smoke/cases/", {**CASE, "slug": "z", "x": 1},
                       format="json")  # fmt: skip
    assert unknown.json()["error"]["fields"] == {"x": ["unknown field"]}
    assert EvalCase.objects.count() == 1


def test_yaml_import_is_strict_and_a_bad_file_writes_nothing(
    tenant, operator_user, api_client_for
):
    api = api_client_for(operator_user, tenant)
    document = yaml.safe_load(DEMO_SUITE_FILE.read_text())
    document["cases"][2]["graders"][0]["tol"] = 0.1
    bad = api.post(f"{SUITES}import/", yaml.safe_dump(document),
                   content_type="application/yaml")  # fmt: skip
    assert bad.status_code == 400
    assert bad.json()["error"]["fields"] == {
        "cases[2].graders[0].tol": ["unknown key; allowed: kind, tool, args, status"]
    }
    broken = api.post(f"{SUITES}import/", {"yaml": "slug: [unclosed"}, format="json")
    assert list(broken.json()["error"]["fields"]) == ["yaml"]
    twice = api.post(f"{SUITES}import/", "slug: a\nslug: b\n",
                     content_type="application/yaml")  # fmt: skip
    assert "appears twice" in twice.json()["error"]["fields"]["yaml"][0]
    assert not EvalSuite.objects.exists() and not EvalCase.objects.exists()


def test_export_then_import_round_trips_exactly(tenant, operator_user, api_client_for):
    api = api_client_for(operator_user, tenant)
    text = DEMO_SUITE_FILE.read_text()
    imported = api.post(f"{SUITES}import/", {"yaml": text}, format="json")
    assert imported.status_code == 201 and imported.json()["created"] is True
    exported = api.get(f"{SUITES}kettlecraft/export/")
    assert exported["Content-Type"].startswith("application/yaml")
    assert exported.content.decode() == text
    again = api.post(f"{SUITES}import/", exported.content,
                     content_type="application/yaml")  # fmt: skip
    assert again.status_code == 200 and again.json()["created"] is False
    assert api.get(f"{SUITES}kettlecraft/export/").content.decode() == text
    # Import makes an existing suite exactly what the file says.
    document = yaml.safe_load(text)
    document["cases"] = document["cases"][:1]
    api.post(f"{SUITES}import/", yaml.safe_dump(document, sort_keys=False),
             content_type="application/yaml")  # fmt: skip
    assert list(EvalCase.objects.values_list("slug", flat=True)) == [
        "task-07-damaged-kettle"
    ]


def test_the_demo_suite_seeds_its_cases_and_judge_for_the_demo_agent(
    demo_agent: Any,
):
    suite = demo_seed_evals(tenant=demo_agent.tenant)
    document = eval_suite_document(suite=suite)
    assert [c["slug"] for c in document["cases"]] == [
        "task-07-damaged-kettle", "deny-ask-for-photo", "injection-in-order-note"
    ]  # fmt: skip
    task = document["cases"][0]
    assert {"kind": "must_call", "tool": "get_delivery_date",
            "args": {"order_id": "4821"}} in task["graders"]  # fmt: skip
    judge = next(g for g in task["graders"] if g["kind"] == "llm_judge")
    assert (
        "apologizes; gives a clear next step; mentions no internal names"
        in (judge["rubric"])
    )
    assert graders_check_against(demo_agent.current_version, document["cases"]) == {}
    demo_seed_evals(tenant=demo_agent.tenant)  # seeding again changes nothing
    # Beside the shop's own judge-free task_07 suite (demo script 11).
    assert EvalSuite.objects.filter(slug=suite.slug).count() == 1
    assert EvalCase.objects.filter(suite=suite).count() == 3
