"""Graders judge real finished runs of the Kettlecraft demo agent by reading
their trace (tool calls, final answer), the shop after them, and an LLM judge
served over real HTTP in the OpenAI chat protocol (one that is down is an
error, never a pass)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.devserver import ChatCompletionsServer
from runs.evals.definitions import DefinitionError, case_validate
from runs.evals.graders import case_grade, graders_check_against
from runs.models import Run
from runs.services import run_start
from runs.services.decide import approval_decide
from tests.agents import endpoint_for

pytestmark = pytest.mark.django_db(transaction=True)


def _demo_run(agent: Any, user: Any, drive_run: Any, *, approve: bool) -> Run:
    run = run_start(
        tenant=agent.tenant,
        agent_slug=agent.slug,
        input="Order #4821 arrived with a dented spout.",
        started_by=user,
    )
    run = drive_run(run)
    approval_decide(
        request=ApprovalRequest.objects.get(run=run),
        decided_by=user,
        approve=approve,
        reason="" if approve else "ask the customer for a photo first",
    )
    return drive_run(run)


def _grade(run: Run, *graders: dict[str, Any]) -> Any:
    checked = case_validate({"slug": "c", "input": "x", "graders": list(graders)})
    return case_grade(run=run, graders=checked["graders"])


def test_code_graders_pass_an_approved_demo_run_and_say_why(
    demo_agent, operator_user, drive_run
):
    run = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    verdict = _grade(
        run,
        {"kind": "must_call", "tool": "get_delivery_date",
         "args": {"order_id": "4821"}},
        {"kind": "must_call", "tool": "create_replacement", "status": "succeeded"},
        {"kind": "must_not_call", "tool": "refund"},
        {"kind": "args", "tool": "lookup_order", "path": "$.order_id",
         "equals": "4821"},
        {"kind": "args", "tool": "create_replacement",
         "schema": {"type": "object", "required": ["reason"]}},
        {"kind": "final_answer_regex", "pattern": "replacement kettle"},
        {"kind": "final_answer_regex", "pattern": "could not ship", "absent": True},
        {"kind": "world_state", "object": "replacements", "order_id": "4821",
         "count": 1},
        {"kind": "world_state", "object": "refunds", "order_id": "4821", "count": 0},
    )  # fmt: skip
    assert [r.passed for r in verdict.results] == [True] * 9, verdict.results
    assert verdict.passed and not verdict.error
    assert (
        verdict.results[0].reason
        == 'called get_delivery_date with {"order_id": "4821"} (1x)'
    )
    assert verdict.results[7].reason == "1 replacements for order 4821, as expected"


def test_code_graders_fail_the_deny_path_naming_what_went_wrong(
    demo_agent, operator_user, drive_run
):
    approved = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    run = _demo_run(demo_agent, operator_user, drive_run, approve=False)
    verdict = _grade(
        run,
        {"kind": "must_call", "tool": "create_replacement", "status": "succeeded"},
        {"kind": "must_not_call", "tool": "create_replacement"},
        {"kind": "args", "tool": "lookup_order", "path": "order_id", "equals": "4822"},
        {"kind": "args", "tool": "refund", "path": "amount", "equals": 1},
        {"kind": "final_answer_regex", "pattern": "on its way"},
        {"kind": "world_state", "object": "replacements", "order_id": "4821",
         "count": 1},
        {"kind": "must_call", "tool": "lookup_order"},
    )  # fmt: skip
    reasons = [r.reason for r in verdict.results]
    assert [r.passed for r in verdict.results] == [False] * 6 + [True]
    assert not verdict.passed and not verdict.error
    assert reasons[0].startswith("never called create_replacement (succeeded)")
    assert reasons[1].startswith("called create_replacement: step 1,")
    assert reasons[1].endswith("(denied)")
    assert reasons[2] == 'call 1 of lookup_order: order_id is "4821", expected "4822"'
    assert reasons[3] == "refund was never called, so no arguments to check"
    assert reasons[4] == "the final answer does not match /on its way/"
    # The approved run's replacement was made before this run: not counted.
    assert reasons[5] == "0 replacements for order 4821, expected 1"
    assert _grade(approved, {"kind": "world_state", "object": "replacements",
                             "order_id": "4821", "count": 1}).passed  # fmt: skip


def test_final_answer_json_graders_read_paths_of_a_json_answer(
    scripted_agent, drive_run, tenant
):
    agent = scripted_agent(
        [{"text": '{"order": {"id": "4821", "tags": ["damaged", "kettle"]}}'}], []
    )
    run = drive_run(run_start(tenant=tenant, agent_slug=agent.slug, input="x",
                              started_by=None))  # fmt: skip
    verdict = _grade(
        run,
        {"kind": "final_answer_json", "path": "$.order.id", "equals": "4821"},
        {"kind": "final_answer_json", "path": "order.tags", "contains": "kettle"},
        {"kind": "final_answer_json", "path": "order.tags[0]", "equals": "ok"},
        {"kind": "final_answer_json", "path": "order.missing", "contains": "x"},
    )
    assert [r.passed for r in verdict.results] == [True, True, False, False]
    assert verdict.results[2].reason == 'order.tags[0] is "damaged", expected "ok"'
    assert verdict.results[3].reason == "the final answer has nothing at order.missing"


def _judge(tenant: Any, base_url: str) -> dict[str, Any]:
    endpoint = endpoint_for(tenant, kind="openai", base_url=base_url,
                            options={"max_retries": 0}, slug="judge")  # fmt: skip
    rubric = "apologizes; gives a clear next step; mentions no internal names"
    return {"kind": "llm_judge", "rubric": rubric, "endpoint": endpoint.slug,
            "model": "judge"}  # fmt: skip


def test_the_llm_judge_asks_a_real_endpoint_with_the_rubric_and_the_trace(
    demo_agent, operator_user, drive_run
):
    run = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    with ChatCompletionsServer() as server:
        grader = _judge(demo_agent.tenant, f"{server.base_url}/v1")
        server.reply("PASS. It apologizes and gives the delivery date.")
        server.reply("FAIL - it names the create_replacement tool.")
        passed = _grade(run, grader)
        failed = _grade(run, grader)
    assert passed.passed and passed.results[0].reason == (
        "judge: It apologizes and gives the delivery date."
    )
    assert not failed.passed and not failed.error
    assert failed.results[0].reason == "judge: it names the create_replacement tool."
    body = server.requests[0]["body"]
    assert body["max_completion_tokens"] == 100
    prompt = body["messages"][-1]["content"]
    assert "apologizes; gives a clear next step; mentions no internal names" in prompt
    assert "get_delivery_date" in prompt and run.final_answer in prompt
    assert "Answer PASS or FAIL, then one reason." in prompt


def test_a_judge_that_is_down_or_answers_neither_is_an_error_not_a_pass(
    demo_agent, operator_user, drive_run
):
    run = _demo_run(demo_agent, operator_user, drive_run, approve=True)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = _grade(run, {"kind": "must_call", "tool": "lookup_order"},
                  _judge(demo_agent.tenant, f"http://127.0.0.1:{port}/v1"))  # fmt: skip
    assert not down.passed and down.error
    assert down.results[0].passed
    judge = down.results[1]
    assert judge.error and not judge.passed
    assert judge.reason.startswith("judge endpoint 'judge' (judge) failed:")
    with ChatCompletionsServer() as server:
        grader = _judge(demo_agent.tenant, f"{server.base_url}/v1")
        server.reply("Looks fine to me.")
        vague = _grade(run, grader)
    assert vague.error and not vague.passed
    assert "neither PASS nor FAIL" in vague.results[0].reason
    missing = _grade(run, {**grader, "endpoint": "nowhere"})
    assert missing.results[0].reason == "no model endpoint 'nowhere' in this tenant"


def test_graders_naming_a_tool_the_agent_lacks_are_refused_for_that_version(
    demo_agent,
):
    case = case_validate({
        "slug": "c", "input": "x",
        "approvals": [{"tool": "wire_money", "decision": "approve"}],
        "graders": [
            {"kind": "must_call", "tool": "get_delivery_date"},
            {"kind": "must_not_call", "tool": "delete_customer"},
            {"kind": "llm_judge", "rubric": "r", "endpoint": "scripted", "model": "m"},
            {"kind": "llm_judge", "rubric": "r", "endpoint": "nope", "model": "m"},
        ],
    })  # fmt: skip
    problems = graders_check_against(demo_agent.current_version, [case])
    assert problems == {
        "cases[0].graders[1].tool": [
            "agent kettlecraft-support v1 has no tool 'delete_customer'"
        ],
        "cases[0].graders[2].endpoint": [
            "model endpoint 'scripted' is scripted; a judge needs a model that "
            "reads the rubric"
        ],
        "cases[0].graders[3].endpoint": ["no model endpoint 'nope' in this tenant"],
        "cases[0].approvals[0].tool": [
            "agent kettlecraft-support v1 has no tool 'wire_money'"
        ],
    }


def test_a_grader_definition_with_an_unknown_kind_or_key_is_refused_by_name():
    with pytest.raises(DefinitionError) as refused:
        case_validate({"slug": "c", "input": "x", "graders": [
            {"kind": "must_call", "tool": "t", "tol": 1},
            {"kind": "vibes"},
            {"kind": "args", "tool": "t", "path": "a..b", "equals": 1, "schema": {}},
            {"kind": "final_answer_regex", "pattern": "("},
        ]})  # fmt: skip
    fields = refused.value.fields
    assert fields["graders[0].tol"] == [
        "unknown key; allowed: kind, tool, args, status"
    ]
    assert fields["graders[1].kind"][0].startswith("unknown grader kind 'vibes'")
    assert fields["graders[2].path"][0].startswith("'a..b' is not a path")
    assert fields["graders[2]"] == ["needs exactly one of: equals, schema"]
    assert fields["graders[3].pattern"][0].startswith("not a regular expression")
