"""The step phases composed as a host does: JSON state saved between every phase."""

from __future__ import annotations

import json
from typing import Any

from runs.engine.actions import ModelReply, ToolCallsAction
from runs.engine.adapters.scripted import ScriptedModel
from runs.engine.budget import BudgetLimits, charge_model_call
from runs.engine.loop import AgentConfig, EngineState
from runs.engine.policy import PolicyContext, default_policy
from runs.engine.step import (
    GateVerdict,
    ModelCallPlan,
    approval_denied_result,
    call_model,
    check_progress,
    execute_call,
    gate_tool_call,
    pending_tool_calls,
    plan_model_call,
    record_reply,
    record_result,
)
from runs.engine.stop import StopReason
from runs.engine.tools import ToolRegistry
from tests.engine.fakes import Shop, call

CONFIG = AgentConfig(
    name="kettlecraft-support", system_prompt="Help.", reserve_output_tokens=64
)
SCRIPT = [
    {
        "tool_calls": [
            call("lookup_order", {"order_id": "4821"}, "r1"),
            call("create_replacement", {"order_id": "4821"}, "w1"),
        ]
    },
    {"text": "A replacement is on its way."},
]


def saved(state: EngineState) -> dict[str, Any]:
    """What the host writes to its database (and reads back in the next task)."""
    return json.loads(json.dumps(state.to_dict()))


def model_phase(
    db: dict[str, Any], registry: ToolRegistry, position: int
) -> dict[str, Any]:
    state = EngineState.from_dict(db)
    tools = registry.model_tools()
    plan = plan_model_call(
        state.usage,
        BudgetLimits(max_steps=5),
        state.transcript,
        tools,
        reserve_output_tokens=CONFIG.reserve_output_tokens,
    )
    assert isinstance(plan, ModelCallPlan)
    reply = call_model(
        ScriptedModel.with_position(SCRIPT, position),
        state.transcript.messages,
        tools,
        plan,
    )
    assert isinstance(reply, ModelReply)
    state.usage = charge_model_call(
        state.usage, reply.usage.input_tokens, reply.usage.output_tokens, CONFIG.price
    )
    action = record_reply(state.transcript, reply)
    assert isinstance(action, ToolCallsAction) or position == 1
    return saved(state)  # the assistant turn is persisted before any tool runs


def test_a_step_split_over_tasks_with_an_approval_wait(
    registry: ToolRegistry, shop: Shop
) -> None:
    db = saved(EngineState.start(CONFIG, "Order 4821 arrived damaged"))
    db = model_phase(db, registry, position=0)

    # Task 1, tool phase: the read runs, the write stops for approval.
    state = EngineState.from_dict(db)
    context = PolicyContext(run_id="run-1", tenant_id="t1")
    waiting = None
    for pending in pending_tool_calls(state.transcript):
        gate = gate_tool_call(pending, registry, default_policy, context)
        if gate.verdict is GateVerdict.NEEDS_APPROVAL:
            waiting = gate
            break
        assert gate.verdict is GateVerdict.EXECUTE and gate.tool is not None
        outcome = execute_call(
            gate.tool, pending, state.usage, BudgetLimits(), run_id="run-1"
        )
        state.usage = outcome.usage
        record_result(state.transcript, pending, outcome.result)
        db = saved(state)  # each result persisted before going on
    assert waiting is not None and waiting.call.call_id == "w1"
    assert shop.names() == ["lookup_order"]

    # Task 2, after the approval: rebuilt from the database alone.
    state = EngineState.from_dict(db)
    [pending] = pending_tool_calls(state.transcript)
    assert pending.call_id == "w1"
    gate = gate_tool_call(pending, registry, default_policy, context)
    assert gate.verdict is GateVerdict.NEEDS_APPROVAL and gate.tool is not None
    outcome = execute_call(
        gate.tool, pending, state.usage, BudgetLimits(), run_id="run-1"
    )
    record_result(state.transcript, pending, outcome.result)
    state.usage = outcome.usage
    assert (
        check_progress(state.progress, ToolCallsAction((pending,)), [outcome.result])
        is None
    )
    db = saved(state)
    assert shop.names() == ["lookup_order", "create_replacement"]
    assert pending_tool_calls(EngineState.from_dict(db).transcript) == []

    db = model_phase(db, registry, position=1)
    final = EngineState.from_dict(db)
    assert final.transcript.messages[-1] == {
        "role": "assistant",
        "content": "A replacement is on its way.",
    }
    assert final.usage.steps == 2 and final.usage.tool_calls == 2


def test_a_denied_approval_is_recorded_and_the_handler_never_runs(
    registry: ToolRegistry, shop: Shop
) -> None:
    db = model_phase(saved(EngineState.start(CONFIG, "4821")), registry, position=0)
    state = EngineState.from_dict(db)
    for pending in pending_tool_calls(state.transcript):
        if pending.name == "create_replacement":
            record_result(
                state.transcript,
                pending,
                approval_denied_result(pending.name, "ask for a photo first"),
            )
        else:
            gate = gate_tool_call(
                pending, registry, default_policy, PolicyContext(run_id="run-1")
            )
            assert gate.tool is not None
            record_result(
                state.transcript,
                pending,
                execute_call(
                    gate.tool, pending, state.usage, BudgetLimits(), run_id="run-1"
                ).result,
            )
    assert shop.names() == ["lookup_order"]
    assert (
        json.loads(state.transcript.messages[-1]["content"])["error"]["code"] == "EPERM"
    )


def test_engine_state_round_trips_through_json() -> None:
    state = EngineState.start(CONFIG, "hello")
    state.stop_reason = StopReason.MAX_STEPS
    state.progress.record("abc")
    restored = EngineState.from_dict(saved(state))
    assert restored.to_dict() == state.to_dict()
