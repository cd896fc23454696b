from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from runs.engine.adapters.scripted import ScriptedModel
from runs.engine.budget import BudgetLimits, ModelPrice
from runs.engine.contracts import ToolContract
from runs.engine.evaluator import Evaluation, EvaluationSubject, Verdict
from runs.engine.loop import AgentConfig, ApprovalResolution, LoopResult, run_in_process
from runs.engine.policy import PolicyContext, PolicyDecision
from runs.engine.stop import RunStatus, StopReason
from runs.engine.tools import Tool, ToolRegistry, idempotency_key_for
from tests.engine.fakes import Shop, call, read_only_contract

CONFIG = AgentConfig(
    name="kettlecraft-support",
    system_prompt="You help customers.",
    reserve_output_tokens=100,
)


def tool_results(result: LoopResult) -> list[dict[str, Any]]:
    return [
        {"id": m["tool_call_id"], **json.loads(m["content"])}
        for m in result.messages
        if m["role"] == "tool"
    ]


def assert_every_call_has_exactly_one_result(result: LoopResult) -> None:
    call_ids = [
        c["id"]
        for m in result.messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    ]
    answered = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
    assert sorted(call_ids) == sorted(answered)
    assert len(set(answered)) == len(answered)


def run(registry: ToolRegistry, script: list[dict[str, Any]], **kw: Any) -> LoopResult:
    return run_in_process(
        CONFIG,
        ScriptedModel(script),
        registry,
        user_input="Order 4821 arrived broken",
        **kw,
    )


class FixedEvaluator:
    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.subjects: list[EvaluationSubject] = []

    def evaluate(self, subject: EvaluationSubject) -> Evaluation:
        self.subjects.append(subject)
        return Evaluation(self.verdict, "checked the shop")


def test_final_answer_without_evaluator_is_unverified(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {"tool_calls": [call("lookup_order", {"order_id": "4821"})]},
            {"text": "Your order 4821 is on its way."},
        ],
    )
    assert result.stop_reason is StopReason.DONE
    assert result.status is RunStatus.UNVERIFIED
    assert result.final_text == "Your order 4821 is on its way."
    assert shop.names() == ["lookup_order"]
    assert result.state.usage.steps == 2
    assert result.state.usage.tool_calls == 1


def test_evaluator_decides_succeeded_or_failed(registry: ToolRegistry) -> None:
    script = [{"text": "Done."}]
    passing = FixedEvaluator(Verdict.PASSED)
    assert run(registry, script, evaluator=passing).status is RunStatus.SUCCEEDED
    assert passing.subjects[0].final_text == "Done."
    assert passing.subjects[0].input == "Order 4821 arrived broken"
    assert (
        run(registry, script, evaluator=FixedEvaluator(Verdict.FAILED)).status
        is RunStatus.FAILED
    )


def test_evaluator_that_raises_fails_the_run(registry: ToolRegistry) -> None:
    class Broken:
        def evaluate(self, subject: EvaluationSubject) -> Evaluation:
            raise RuntimeError

    result = run(registry, [{"text": "Done."}], evaluator=Broken())
    assert result.status is RunStatus.FAILED
    assert result.evaluation == Evaluation(
        Verdict.FAILED, "evaluator_error: RuntimeError"
    )


def test_several_calls_in_one_reply_run_serially_with_one_result_each(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {
                "tool_calls": [
                    call("lookup_order", {"order_id": "1111"}, "a"),
                    call("lookup_order", {"order_id": "2222"}, "b"),
                    call("lookup_order", {"order_id": "3333"}, "c"),
                ]
            },
            {"text": "All three checked."},
        ],
    )
    assert [args["order_id"] for _, args, _ in shop.invocations] == [
        "1111",
        "2222",
        "3333",
    ]
    roles = [m["role"] for m in result.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [r["id"] for r in tool_results(result)] == ["a", "b", "c"]
    assert all(r["ok"] for r in tool_results(result))
    assert_every_call_has_exactly_one_result(result)


def test_unparseable_arguments_become_einval_and_nothing_runs(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {"tool_calls": [call("lookup_order", '{"order_id": "48', "x")]},
            {"text": "Sorry."},
        ],
    )
    [observation] = tool_results(result)
    assert observation["error"]["code"] == "EINVAL"
    assert "not valid JSON" in observation["error"]["message"]
    assert shop.invocations == []
    assert result.status is RunStatus.UNVERIFIED  # the run went on after the error


def test_truncated_tool_call_is_not_executed(
    registry: ToolRegistry, shop: Shop
) -> None:
    ran: list[dict[str, Any]] = []
    registry.register(
        Tool(
            ToolContract(
                name="bash",
                description="Run a command.",
                input_schema={
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                },
            ),
            lambda args, ctx: ran.append(args) or {},
        )
    )
    result = run(
        registry,
        [
            {
                "tool_calls": [call("bash", '{"command": "rm -rf', "t1")],
                "finish_reason": "length",
            },
            {"text": "done"},
        ],
        approver=lambda *a: ApprovalResolution(True),
    )
    assert ran == []
    second_to_last = result.messages[-2]
    assert second_to_last["role"] == "tool"
    error = json.loads(second_to_last["content"])["error"]
    assert error["code"] == "EINVAL"
    assert "finish_reason=length" in error["message"]


def test_unknown_tool_is_an_enotool_observation(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {"tool_calls": [call("delete_everything", {})]},
            {"text": "ok"},
        ],
    )
    [observation] = tool_results(result)
    assert observation["error"]["code"] == "ENOTOOL"
    assert "lookup_order, create_replacement" in observation["error"]["message"]
    assert shop.invocations == []


def test_invalid_arguments_give_a_path_addressed_einval(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {"tool_calls": [call("lookup_order", {"order_id": "#4821"})]},
            {"tool_calls": [call("lookup_order", {"order_id": "4821"})]},
            {"text": "Found it."},
        ],
    )
    first = tool_results(result)[0]
    assert first["error"] == {
        "code": "EINVAL",
        "message": "$.order_id: '#4821' does not match '^[0-9]{4}$'",
        "retryable": True,
        "suggested_action": "fix_arguments_and_retry_once",
    }
    assert [args for _, args, _ in shop.invocations] == [{"order_id": "4821"}]


def test_write_with_nobody_to_approve_is_policy_blocked_and_never_runs(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {
                "tool_calls": [
                    call("create_replacement", {"order_id": "4821"}, "w"),
                    call("lookup_order", {"order_id": "4821"}, "r"),
                ]
            },
            {"text": "never reached"},
        ],
    )
    assert result.status is RunStatus.POLICY_BLOCKED
    assert result.stop_reason is StopReason.POLICY_DENIED
    assert shop.invocations == []
    assert shop.replacements == {}
    codes = [(r["id"], r["error"]["code"]) for r in tool_results(result)]
    assert codes == [("w", "EPERM"), ("r", "ECANCELED")]
    assert_every_call_has_exactly_one_result(result)


def test_approved_write_runs_once_with_the_derived_idempotency_key(
    registry: ToolRegistry, shop: Shop
) -> None:
    asked: list[tuple[str, str]] = []

    def approve(call: Any, tool: Any, decision: PolicyDecision) -> ApprovalResolution:
        asked.append((call.name, decision.rule))
        return ApprovalResolution(True)

    result = run(
        registry,
        [
            {"tool_calls": [call("create_replacement", {"order_id": "4821"}, "w1")]},
            {"text": "Replacement R-1 is on its way."},
        ],
        approver=approve,
        run_id="run-42",
    )
    assert asked == [("create_replacement", "default.side_effect")]
    assert shop.names() == ["create_replacement"]
    assert shop.invocations[0][2].idempotency_key == idempotency_key_for("run-42", "w1")
    assert tool_results(result)[0]["data"] == {"replacement_id": "R-1"}


def test_denied_write_is_an_error_observation_and_the_run_continues(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {"tool_calls": [call("create_replacement", {"order_id": "4821"})]},
            {"text": "Could you send a photo of the damage?"},
        ],
        approver=lambda *a: ApprovalResolution(
            False, "ask the customer for a photo first"
        ),
    )
    assert shop.invocations == []
    [observation] = tool_results(result)
    assert observation["error"]["code"] == "EPERM"
    assert observation["error"]["message"] == (
        "create_replacement was denied by a reviewer: "
        "ask the customer for a photo first"
    )
    assert result.status is RunStatus.UNVERIFIED
    assert result.final_text == "Could you send a photo of the damage?"


def test_policy_hook_that_raises_blocks_the_call(
    registry: ToolRegistry, shop: Shop
) -> None:
    def hook(
        contract: ToolContract, args: Mapping[str, Any], ctx: PolicyContext
    ) -> PolicyDecision:
        raise RuntimeError("policy service down")

    result = run(
        registry,
        [{"tool_calls": [call("lookup_order", {"order_id": "4821"})]}],
        policy=hook,
    )
    assert result.status is RunStatus.POLICY_BLOCKED
    assert shop.invocations == []


def lookups(n: int) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [call("lookup_order", {"order_id": f"{i:04d}"})]}
        for i in range(n)
    ]


def test_max_steps_stops_before_the_extra_model_call(registry: ToolRegistry) -> None:
    model = ScriptedModel(lookups(20))
    result = run_in_process(
        CONFIG, model, registry, user_input="loop", limits=BudgetLimits(max_steps=10)
    )
    assert result.stop_reason is StopReason.MAX_STEPS
    assert result.status is RunStatus.BUDGET_EXHAUSTED
    assert model.calls == 10
    assert result.state.usage.steps == 10


def test_max_tool_calls_refuses_the_extra_call_with_ebudget(
    registry: ToolRegistry, shop: Shop
) -> None:
    result = run(
        registry,
        [
            {
                "tool_calls": [
                    call("lookup_order", {"order_id": "0001"}),
                    call("lookup_order", {"order_id": "0002"}),
                    call("lookup_order", {"order_id": "0003"}),
                ]
            }
        ],
        limits=BudgetLimits(max_tool_calls=2),
    )
    assert result.stop_reason is StopReason.MAX_TOOL_CALLS
    assert len(shop.invocations) == 2
    assert [r["ok"] for r in tool_results(result)] == [True, True, False]
    assert tool_results(result)[2]["error"]["code"] == "EBUDGET"


def test_max_tokens_uses_reported_usage_and_the_output_reservation(
    registry: ToolRegistry,
) -> None:
    script = [
        {**s, "usage": {"input_tokens": 50, "output_tokens": 60}} for s in lookups(5)
    ]
    model = ScriptedModel(script)
    result = run_in_process(
        CONFIG,
        model,
        registry,
        user_input="x",
        limits=BudgetLimits(max_output_tokens=250),
    )
    # 60 + 60 + reservation 100 = 220 fits; a third call would need 120 + 60 + 100.
    assert result.stop_reason is StopReason.MAX_TOKENS
    assert model.calls == 3
    assert model.max_output_tokens_seen == [100, 100, 100]


def test_max_cost_stops_before_the_call_that_could_exceed_it(
    registry: ToolRegistry,
) -> None:
    config = AgentConfig(
        name="a",
        reserve_output_tokens=1000,
        price=ModelPrice(Decimal(0), Decimal("1000")),
    )  # $1 per 1000 out
    script = [{**s, "usage": {"output_tokens": 1000}} for s in lookups(5)]
    model = ScriptedModel(script)
    result = run_in_process(
        config,
        model,
        registry,
        user_input="x",
        limits=BudgetLimits(max_cost=Decimal("2.5")),
    )
    assert result.stop_reason is StopReason.MAX_COST
    assert model.calls == 2
    assert result.state.usage.cost == Decimal(2)


def test_deadline_stops_the_run(registry: ToolRegistry) -> None:
    model = ScriptedModel(lookups(20))  # each model call takes 10 seconds
    result = run_in_process(
        CONFIG,
        model,
        registry,
        user_input="x",
        limits=BudgetLimits(max_wall_seconds=25),
        clock=lambda: 10.0 * model.calls,
    )
    assert result.stop_reason is StopReason.DEADLINE
    assert result.status is RunStatus.BUDGET_EXHAUSTED
    assert model.calls == 3  # calls start at 0, 10 and 20 s; at 30 s it is over


def test_repeating_the_same_call_and_observation_is_no_progress(
    registry: ToolRegistry, shop: Shop
) -> None:
    same = {"tool_calls": [call("lookup_order", {"order_id": "4821"})]}
    result = run(registry, [same] * 10)
    assert result.stop_reason is StopReason.NO_PROGRESS
    assert result.status is RunStatus.FAILED
    assert len(shop.invocations) == CONFIG.max_retries + 1


def test_a_changing_world_version_is_progress(registry: ToolRegistry) -> None:
    versions = iter(range(100))
    same = {"tool_calls": [call("lookup_order", {"order_id": "4821"})]}
    result = run(registry, [same] * 6, world_version=lambda: next(versions))
    assert result.stop_reason is StopReason.MODEL_ERROR  # ran out of script instead


def test_cancellation_is_checked_before_each_model_call(registry: ToolRegistry) -> None:
    model = ScriptedModel(lookups(5))
    result = run_in_process(
        CONFIG, model, registry, user_input="x", cancelled=lambda: model.calls >= 2
    )
    assert result.status is RunStatus.CANCELLED
    assert model.calls == 2


def test_exhausted_script_is_a_model_error(registry: ToolRegistry) -> None:
    result = run(registry, [])
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.status is RunStatus.FAILED
    assert result.model_error is not None
    assert result.model_error.kind == "script_exhausted"


def test_a_host_bug_is_an_internal_error_not_an_exception(
    registry: ToolRegistry,
) -> None:
    class Broken:
        provider = "broken"

        def complete(self, messages: Any, tools: Any, max_output_tokens: int) -> Any:
            return "not a reply"

    result = run_in_process(CONFIG, Broken(), registry, user_input="x")
    assert result.stop_reason is StopReason.INTERNAL_ERROR
    assert result.status is RunStatus.FAILED


def test_empty_reply_gets_an_einval_note_and_the_run_goes_on(
    registry: ToolRegistry,
) -> None:
    result = run(registry, [{"text": ""}, {"text": "Here you go."}])
    assert result.messages[3]["role"] == "user"
    assert result.messages[3]["content"].startswith("EINVAL")
    assert result.final_text == "Here you go."


def test_large_tool_output_is_bounded_and_kept_as_an_artifact(
    registry: ToolRegistry,
) -> None:
    registry.register(
        Tool(read_only_contract("dump"), lambda a, c: {"blob": "x" * 50_000})
    )
    config = AgentConfig(name="a", observation_chars=1000)
    result = run_in_process(
        config,
        ScriptedModel(
            [
                {"tool_calls": [call("dump", {"order_id": "1234"})]},
                {"text": "ok"},
            ]
        ),
        registry,
        user_input="x",
    )
    [observation] = tool_results(result)
    assert observation["truncated"] is True
    assert len(result.messages[3]["content"]) <= 1000
    assert len(result.artifacts) == 1
    assert result.artifacts[0].size_bytes > 50_000


def test_a_reply_without_usage_is_charged_the_estimate(registry: ToolRegistry) -> None:
    model = ScriptedModel([{"text": "done"}])
    result = run_in_process(CONFIG, model, registry, user_input="x")
    assert result.state.usage.output_tokens == CONFIG.reserve_output_tokens
    assert result.state.usage.input_tokens > 0


def test_cancellation_between_calls_stops_the_rest_of_the_batch(
    registry: ToolRegistry, shop: Shop
) -> None:
    script = [
        {
            "tool_calls": [
                call("lookup_order", {"order_id": "0001"}, "a"),
                call("lookup_order", {"order_id": "0002"}, "b"),
            ]
        }
    ]
    result = run(registry, script, cancelled=lambda: len(shop.invocations) >= 1)
    assert result.status is RunStatus.CANCELLED
    assert shop.names() == ["lookup_order"]
    codes = [(r["id"], r["ok"]) for r in tool_results(result)]
    assert codes == [("a", True), ("b", False)]
    assert tool_results(result)[1]["error"]["code"] == "ECANCELED"
