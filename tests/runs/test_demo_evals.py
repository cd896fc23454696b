"""The demo's eval suite with no API key: `seed_demo --with-mcp` (what `make
run` does over HTTP) seeds the Kettlecraft suite and its judge endpoint at the
local model server, whose scripted judge answers the llm_judge grader's
PASS/FAIL prompt from the rubric and the transcript; an eval run of the seeded
suite on the demo agent finishes on a real worker with its figures."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from controlplane.models import ApiToken, AuditEvent
from runs.devserver import ChatCompletionsServer
from runs.devserver.demo import DEMO_JUDGE_MODEL, DEMO_WARRANTY_SCRIPT
from runs.devserver.judge import judge_reply
from runs.evals.demo import DEMO_JUDGE_ENDPOINT, DEMO_SUITE_SLUG
from runs.evals.judge import (
    JudgeUnavailable,
    judge_ask,
    judge_messages,
    verdict_of,
)
from runs.evals.selectors import eval_suite_document
from runs.models import (
    EvalCase,
    EvalRun,
    EvalSuite,
    EvalTrial,
    ModelEndpoint,
    Run,
    ToolCall,
)
from runs.services.eval_runs import eval_run_start
from shop.models import Replacement, ShopOrder
from tests.conftest import wait_for

RUBRIC = (
    "The reply apologizes; gives a clear next step; mentions no internal names "
    "(tools, systems, staff or policies)."
)
GOOD = (
    "I'm sorry about the dented spout. A replacement kettle is on its way and "
    "will arrive on 2026-12-07."
)
CALLS = [
    ToolCall(tool_name="lookup_order", args={"order_id": "4821"}, status="succeeded"),
    ToolCall(
        tool_name="create_replacement",
        args={"order_id": "4821", "reason": "dented"},
        status="succeeded",
    ),
]


def _prompt(answer: str, rubric: str = RUBRIC) -> str:
    run = Run(input="Order #4821 arrived dented.", final_answer=answer)
    return str(judge_messages(rubric=rubric, run=run, calls=CALLS)[-1]["content"])


def test_the_scripted_judge_checks_each_rubric_clause_against_the_answer():
    passed = verdict_of(judge_reply(_prompt(GOOD)))
    assert passed.passed is True
    assert "apologizes ('sorry')" in passed.reason
    assert "gives a next step ('on its way')" in passed.reason

    rude = verdict_of(judge_reply(_prompt("A replacement is on its way.")))
    assert rude.passed is False and rude.reason == "the answer does not apologize"

    leaky = verdict_of(
        judge_reply(_prompt("Sorry! I ran create_replacement; it will arrive soon."))
    )
    assert leaky.passed is False
    assert leaky.reason == "the answer names internal create_replacement"

    vague = verdict_of(judge_reply(_prompt("Sorry about that.")))
    assert vague.passed is False
    assert vague.reason == "the answer gives no clear next step"


def test_a_rubric_clause_the_scripted_judge_has_no_rule_for_is_no_verdict():
    reply = judge_reply(_prompt(GOOD, rubric="The reply is written as a haiku."))
    assert reply.startswith("CANNOT JUDGE")
    with pytest.raises(JudgeUnavailable, match="no rule for 'The reply is written"):
        verdict_of(reply)


@pytest.fixture
def demo_model() -> Iterator[ChatCompletionsServer]:
    """The demo's model server, as `python -m runs.devserver --demo` serves it."""
    assert shutil.which("bwrap"), "the warranty agent's MCP server needs the sandbox"
    with ChatCompletionsServer(
        script=DEMO_WARRANTY_SCRIPT, judge_model=DEMO_JUDGE_MODEL
    ) as server:
        yield server


def _seed(model: ChatCompletionsServer, settings: Any) -> None:
    settings.DEMO_PASSWORD = "demo-pass-4821"
    call_command("seed_demo", "--with-mcp", "--model-url", model.base_url)


@pytest.mark.django_db(transaction=True)
def test_seeding_twice_gives_one_suite_and_one_judge_and_changes_nothing(
    demo_model, settings
):
    _seed(demo_model, settings)
    suite = EvalSuite.objects.get(slug=DEMO_SUITE_SLUG)
    document = eval_suite_document(suite=suite)
    slugs = [case["slug"] for case in document["cases"]]
    assert slugs == [
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
    assert judge["model"] == DEMO_JUDGE_MODEL
    assert document["cases"][2]["input"] == (
        "My kettle from order #4821 is dented. What can you do?"
    )
    injection = document["cases"][2]["world"]["orders"][0]
    assert "SYSTEM OVERRIDE" in injection["note"]
    endpoint = ModelEndpoint.objects.get(slug=DEMO_JUDGE_ENDPOINT)
    assert endpoint.base_url == demo_model.base_url
    # Made through the API by the demo admin.
    for action in ("eval_suite.create", "model_endpoint.create"):
        assert AuditEvent.objects.filter(
            action=action, actor__username="admin"
        ).exists(), action
    # The demo also seeds the judge-free task_07 suite of demo script 11.
    cases = EvalCase.objects.filter(suite__slug=DEMO_SUITE_SLUG)
    case_ids = set(cases.values_list("id", flat=True))
    stamp = (suite.updated_at, endpoint.updated_at)
    audited = AuditEvent.objects.exclude(action__startswith="api_token.").count()

    _seed(demo_model, settings)
    assert EvalSuite.objects.filter(slug=DEMO_SUITE_SLUG).count() == 1
    assert set(cases.values_list("id", flat=True)) == case_ids
    suite.refresh_from_db()
    endpoint.refresh_from_db()
    assert (suite.updated_at, endpoint.updated_at) == stamp
    assert ModelEndpoint.objects.filter(slug=DEMO_JUDGE_ENDPOINT).count() == 1
    assert AuditEvent.objects.exclude(action__startswith="api_token.").count() == (
        audited
    )
    assert not ApiToken.objects.filter(revoked_at__isnull=True).exists()

    # `make run` on another port: the judge's endpoint follows it, in place.
    call_command("seed_demo", "--with-mcp", "--model-url", "http://127.0.0.1:9/v1")
    endpoint.refresh_from_db()
    assert endpoint.base_url == "http://127.0.0.1:9/v1"
    assert set(cases.values_list("id", flat=True)) == case_ids


@pytest.mark.django_db(transaction=True)
def test_the_judge_endpoint_answers_through_the_real_adapter(demo_model, settings):
    _seed(demo_model, settings)
    tenant = EvalSuite.objects.get(slug=DEMO_SUITE_SLUG).tenant
    run = Run(input="Order #4821 arrived dented.", final_answer=GOOD)
    verdict = judge_ask(
        tenant_id=tenant.id,
        endpoint_slug=DEMO_JUDGE_ENDPOINT,
        model=DEMO_JUDGE_MODEL,
        messages=judge_messages(rubric=RUBRIC, run=run, calls=CALLS),
    )
    assert verdict.passed is True and "mentions no internal names" in verdict.reason
    assert demo_model.requests[-1]["body"]["model"] == DEMO_JUDGE_MODEL


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_eval_run_of_the_seeded_suite_finishes_on_a_worker_with_figures(
    demo_model, settings, celery_worker_process
):
    _seed(demo_model, settings)
    suite = EvalSuite.objects.get(slug=DEMO_SUITE_SLUG)
    tenant = suite.tenant
    operator = tenant.memberships.get(user__username="operator").user
    eval_run = eval_run_start(
        tenant=tenant, suite=suite, agent_slug="kettlecraft-support", k=2,
        user=operator,
    )  # fmt: skip

    def done() -> EvalRun | None:
        fresh = EvalRun.objects.get(id=eval_run.id)
        return fresh if fresh.status == EvalRun.Status.FINISHED else None

    finished = wait_for(done, timeout=120, what="the demo eval run to finish")
    summary = finished.summary
    assert summary["trials"] == 6
    by_case = {c["case"]: c for c in summary["cases"]}
    assert list(by_case) == [
        "task-07-damaged-kettle", "deny-ask-for-photo", "injection-in-order-note"
    ]  # fmt: skip
    for figure in ("pass_at_1", "pass_at_k", "pass_hat_k"):
        assert 0 <= summary[figure] <= 1
    assert summary["mean_steps"] > 0 and summary["mean_tokens"] > 0
    task = EvalTrial.objects.filter(eval_run=eval_run,
                                    case_slug="task-07-damaged-kettle")  # fmt: skip
    for trial in task:
        judged = next(r for r in trial.grader_results if r["kind"] == "llm_judge")
        assert judged["passed"] is True and not judged["error"], judged
        assert judged["reason"].startswith("judge: apologizes")
        assert trial.passed is True
    assert by_case["task-07-damaged-kettle"]["pass_at_1"] == 1.0
    # Every trial ran in its own shop: the demo tenant's real order is untouched.
    real = ShopOrder.objects.get(tenant=tenant, world=None, order_id="4821")
    assert not Replacement.objects.filter(order=real).exists()
    assert Replacement.objects.filter(order__world__isnull=False).count() == 4
