"""The eval comparison API: two eval runs of a suite, run for real through a
worker (two versions of the demo agent), compared case by case: the case that
flipped with the two trial runs to diff, the metric deltas with their intervals,
cost and latency deltas and the small-sample warning. Bad input: another
tenant's run, runs of two suites, a run not finished."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runs.demo import demo_seed_shop
from runs.engine.eval_comparison import sample_size_warning
from runs.models import Agent, EvalRun, EvalTrial
from runs.services.evals import eval_suite_create
from tests.conftest import _member
from tests.eval_compare_data import CASES, finished, start, suite_with_two_versions

pytestmark = pytest.mark.django_db(transaction=True)


def _url(a: Any, b: Any) -> str:
    return f"/api/v1/evals/runs/{a}/compare/{b}/"


def test_two_versions_compared_show_the_regressed_case_with_its_trials_to_diff(
    demo_agent, operator_user, viewer_user, api_client_for, celery_worker_process
):
    suite = suite_with_two_versions(demo_agent, operator_user)
    v1 = finished(start(suite, demo_agent, operator_user, version=1, k=2))
    v2 = finished(start(suite, demo_agent, operator_user, version=2, k=2))
    reader = api_client_for(viewer_user, demo_agent.tenant)

    answer = reader.get(_url(v1.id, v2.id))
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["suite"] == "kettle"
    assert (body["before"]["version"], body["after"]["version"]) == (1, 2)
    assert body["k"] == 2 and body["trials_per_case"] == 2
    assert body["cases_compared"] == 2
    assert body["cases_added"] == [] and body["cases_removed"] == []
    assert [(f["case"], f["direction"]) for f in body["flips"]] == [
        ("replacement-promised", "regressed")
    ]
    flip = body["flips"][0]
    assert (flip["before_pass_at_1"], flip["after_pass_at_1"]) == (1.0, 0.0)
    # The pair to diff: a passing trial of v1 and a failing trial of v2, both of
    # that case, the lowest index of each.
    good = EvalTrial.objects.get(run_id=flip["diff"]["before_run"])
    bad = EvalTrial.objects.get(run_id=flip["diff"]["after_run"])
    assert (good.eval_run_id, good.case_slug, good.passed, good.index) == (
        v1.id, "replacement-promised", True, 0,
    )  # fmt: skip
    assert (bad.eval_run_id, bad.case_slug, bad.passed, bad.index) == (
        v2.id, "replacement-promised", False, 0,
    )  # fmt: skip
    diff = reader.get(
        f"/api/v1/runs/{good.run_id}/diff/{bad.run_id}/"
    )  # the link the page offers
    assert diff.status_code == 200 and diff.json()["first_divergence"] is not None

    at_1 = body["metrics"]["pass_at_1"]
    assert (at_1["before"], at_1["after"], at_1["delta"]) == (1.0, 0.5, -0.5)
    assert at_1["interval"]["low"] < -0.5 < at_1["interval"]["high"]
    assert at_1["interval"]["confidence"] == 0.95
    for metric in ("pass_at_k", "pass_hat_k"):
        assert body["metrics"][metric]["delta"] == -0.5
        assert body["metrics"][metric]["interval"] is not None
    # v2 makes one model call fewer and ships nothing: fewer steps and tokens.
    # The scripted model is free, so cost moves by nothing.
    cost = body["metrics"]["cost"]
    assert (cost["before"], cost["after"], cost["delta"]) == (0.0, 0.0, 0.0)
    assert body["metrics"]["steps"]["delta"] == -1.0
    assert body["metrics"]["tokens"]["delta"] < 0
    assert "delta" in body["metrics"]["latency_ms"]
    # Two cases cannot show a 50-point drop: the interval reaches past zero.
    assert body["warning"] == (
        "2 cases × 2 trials cannot show a 50-point drop (it would need about "
        f"{round(body['minimum_detectable_difference'] * 100)} points or "
        f"{_cases_needed(body)} cases)"
    )
    rows = {c["case"]: c for c in body["cases"]}
    assert rows["replacement-promised"]["before"]["passed"] == 2
    assert rows["replacement-promised"]["after"]["passed"] == 0
    assert rows["delivery-date"]["flip"] is None
    assert len(rows["delivery-date"]["after"]["runs"]) == 2

    # The other way round the same case is fixed, its diff pair reversed.
    back = reader.get(_url(v2.id, v1.id)).json()
    assert [(f["case"], f["direction"]) for f in back["flips"]] == [
        ("replacement-promised", "fixed")
    ]
    assert back["flips"][0]["diff"] == {
        "before_run": flip["diff"]["after_run"],
        "after_run": flip["diff"]["before_run"],
    }
    assert back["metrics"]["pass_at_1"]["delta"] == 0.5

    # The suite's eval runs, newest first, with their figures.
    listed = reader.get("/api/v1/evals/suites/kettle/runs/").json()
    assert [(r["id"], r["version"], r["pass_at_1"]) for r in listed] == [
        (str(v2.id), 2, 0.5),
        (str(v1.id), 1, 1.0),
    ]


def _cases_needed(body: dict[str, Any]) -> str:
    warning = sample_size_warning(
        cases=2, trials=2, delta=-0.5,
        detectable=body["minimum_detectable_difference"],
    )  # fmt: skip
    assert warning is not None
    return warning.rsplit(" or ", 1)[1].split(" ")[0]


def test_another_tenants_eval_run_is_not_found_naming_the_side(
    demo_agent, operator_user, api_client_for, other_tenant
):
    suite = suite_with_two_versions(demo_agent, operator_user)
    ours = start(suite, demo_agent, operator_user, version=1, k=1)
    demo_seed_shop(tenant=other_tenant)
    olga = _member(other_tenant, "olga", "admin")
    their_agent = Agent.objects.get(tenant=other_tenant, slug=demo_agent.slug)
    their_suite = eval_suite_create(
        tenant=other_tenant, actor=olga,
        document={"slug": "kettle", "name": "Theirs", "cases": CASES},
    )  # fmt: skip
    theirs = start(their_suite, their_agent, olga, version=1, k=1)
    client = api_client_for(operator_user, demo_agent.tenant)
    for url, side in (
        (_url(theirs.id, ours.id), "before"),
        (_url(ours.id, theirs.id), "after"),
        (_url(ours.id, uuid.uuid4()), "after"),
    ):
        answer = client.get(url)
        assert answer.status_code == 404, url
        error = answer.json()["error"]
        assert error["eval_run"] == side
        assert f"the {side} one" in error["message"]
        assert "Theirs" not in answer.content.decode()
    # Olga reads hers, not ours.
    stranger = api_client_for(olga, other_tenant)
    assert stranger.get(_url(theirs.id, ours.id)).json()["error"]["eval_run"] == "after"
    assert client.get("/api/v1/evals/runs/not-a-uuid/compare/x/").status_code == 404
    assert stranger.get("/api/v1/evals/suites/nope/runs/").status_code == 404


def test_eval_runs_of_two_suites_are_refused_naming_both_suites(
    demo_agent, operator_user, api_client_for
):
    suite = suite_with_two_versions(demo_agent, operator_user)
    other = eval_suite_create(
        tenant=demo_agent.tenant, actor=operator_user,
        document={"slug": "other", "name": "Other", "cases": CASES[1:]},
    )  # fmt: skip
    a = start(suite, demo_agent, operator_user, version=1, k=1)
    b = start(other, demo_agent, operator_user, version=1, k=1)
    answer = api_client_for(operator_user, demo_agent.tenant).get(_url(a.id, b.id))
    assert answer.status_code == 400
    message = answer.json()["error"]["fields"]["other_id"][0]
    assert "suite 'kettle'" in message and "suite 'other'" in message
    assert "only eval runs of one suite can be compared" in message


def test_an_eval_run_not_finished_is_a_conflict_naming_it_and_its_progress(
    demo_agent, operator_user, api_client_for, viewer_user
):
    suite = suite_with_two_versions(demo_agent, operator_user)
    a = start(suite, demo_agent, operator_user, version=1, k=1)
    b = start(suite, demo_agent, operator_user, version=2, k=1)
    # No worker: both are still running. Mark the first finished by hand to see
    # the second named (the statuses are what the comparison reads first).
    EvalRun.objects.filter(id=a.id).update(status=EvalRun.Status.FINISHED)
    answer = api_client_for(viewer_user, demo_agent.tenant).get(_url(a.id, b.id))
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "not_finished" and error["eval_run"] == "after"
    assert error["status"] == "running"
    assert error["message"] == (
        f"The after eval run ({str(b.id)[:8]}) is running, 0 of 2 trials done: "
        "compare it once it has finished."
    )
    swapped = api_client_for(viewer_user, demo_agent.tenant).get(_url(b.id, a.id))
    assert swapped.status_code == 409
    assert swapped.json()["error"]["eval_run"] == "before"
    assert EvalRun.objects.get(id=b.id).status == EvalRun.Status.RUNNING
