from __future__ import annotations

import json

import pytest

from runs.engine.adapters import ModelError
from runs.engine.adapters.scripted import ScriptedModel
from runs.engine.loop import AgentConfig, run_in_process
from runs.engine.tools import ToolRegistry
from tests.engine.fakes import Shop, call

SCRIPT = [
    {
        "tool_calls": [call("lookup_order", {"order_id": "4821"})],
        "usage": {"input_tokens": 30, "output_tokens": 8},
    },
    {"text": "Order 4821 was delivered damaged; a replacement can be arranged."},
]


def test_scripted_model_returns_its_replies_in_order() -> None:
    model = ScriptedModel(SCRIPT)
    first = model.complete([], [], 100)
    second = model.complete([], [], 100)
    assert [c.name for c in first.tool_calls] == ["lookup_order"]
    assert first.tool_calls[0].call_id == "call_0_0"
    assert first.finish_reason == "tool_calls"
    assert first.usage.input_tokens == 30
    assert second.text is not None and second.text.startswith("Order 4821")
    assert second.finish_reason == "stop"
    assert model.remaining == 0


def test_exhausting_the_script_is_a_clear_model_error() -> None:
    model = ScriptedModel([{"text": "only one"}])
    model.complete([], [], 10)
    with pytest.raises(ModelError) as caught:
        model.complete([], [], 10)
    assert caught.value.kind == "script_exhausted"
    assert "no reply left after 1" in caught.value.message


def test_same_script_gives_the_same_run(registry: ToolRegistry) -> None:
    first = run_in_process(
        AgentConfig(name="a"), ScriptedModel(SCRIPT), registry, user_input="4821 broke"
    )
    second = run_in_process(
        AgentConfig(name="a"), ScriptedModel(SCRIPT), registry, user_input="4821 broke"
    )
    strip = [
        {**m, "content": None} if m["role"] == "tool" else m for m in first.messages
    ]
    strip2 = [
        {**m, "content": None} if m["role"] == "tool" else m for m in second.messages
    ]
    assert strip == strip2
    assert first.status == second.status


def test_recorded_run_replays_to_the_same_actions(
    registry: ToolRegistry, shop: Shop
) -> None:
    original = run_in_process(
        AgentConfig(name="a"), ScriptedModel(SCRIPT), registry, user_input="4821 broke"
    )
    recorded = json.loads(json.dumps([s.reply.to_dict() for s in original.steps]))
    replay = run_in_process(
        AgentConfig(name="a"),
        ScriptedModel.from_recorded(recorded),
        registry,
        user_input="4821 broke",
    )
    assert [s.reply.tool_calls for s in replay.steps] == [
        s.reply.tool_calls for s in original.steps
    ]
    assert replay.final_text == original.final_text
    assert shop.names() == ["lookup_order", "lookup_order"]


def test_a_resumed_run_continues_the_script_where_it_stopped() -> None:
    model = ScriptedModel.with_position(SCRIPT, 1)
    assert model.complete([], [], 10).text == SCRIPT[1]["text"]


def test_build_model_adapter_knows_scripted_and_openai() -> None:
    from runs.engine.adapters import build_model_adapter
    from runs.engine.adapters.openai_compatible import OpenAIModel

    scripted = build_model_adapter(
        "scripted", model="demo", script=SCRIPT, script_position=1
    )
    assert scripted.complete([], [], 10).text == SCRIPT[1]["text"]
    remote = build_model_adapter(
        "openai", model="m", api_key="k", base_url="http://127.0.0.1:1/v1"
    )
    assert isinstance(remote, OpenAIModel)
    with pytest.raises(ValueError, match="unknown model adapter 'claude'"):
        build_model_adapter("claude", model="m")
