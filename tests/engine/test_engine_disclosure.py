"""Progressive disclosure in the engine: the skill index, load_skill, tool
search's scoring, and deferred tools in the in-process loop."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from runs.engine.actions import ModelReply
from runs.engine.adapters.scripted import ScriptedModel
from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.disclosure import (
    MAX_SKILL_BODY_BYTES,
    Skill,
    load_skill_tool,
    search_tools,
    skill_problems,
    system_prompt_with_skills,
    tool_search_tool,
)
from runs.engine.loop import AgentConfig, EngineState, run_in_process
from runs.engine.tools import Tool, ToolContext, ToolRegistry

SCHEMA = {"type": "object", "properties": {}}
SKILL = Skill("replacement-procedure", "How to replace a damaged item.", "1. Look.")


class Recording:
    """The scripted model, remembering the tool names each call was sent."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.model = ScriptedModel(script)
        self.tools: list[list[str]] = []
        self.messages: list[list[dict[str, Any]]] = []

    @property
    def provider(self) -> str:
        return "scripted"

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        **kw: Any,
    ) -> ModelReply:
        self.tools.append([t["function"]["name"] for t in tools])
        self.messages.append([dict(m) for m in messages])
        return self.model.complete(messages, tools, max_output_tokens)


def contract(name: str, description: str) -> ToolContract:
    return ToolContract(
        name=name,
        description=description,
        input_schema=SCHEMA,
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    )


def test_the_prompt_carries_the_skill_index_and_not_the_bodies() -> None:
    prompt = system_prompt_with_skills("Be kind.", [SKILL])
    assert prompt.startswith("Be kind.\n\nSkills")
    assert "- replacement-procedure — How to replace a damaged item." in prompt
    assert "1. Look." not in prompt and "load_skill" in prompt
    assert system_prompt_with_skills("Be kind.", []) == "Be kind."


def test_load_skill_returns_the_body_and_names_the_skills_for_an_unknown_one() -> None:
    tool = load_skill_tool([SKILL, Skill("refunds", "Refunds.", "Never refund.")])
    ctx = ToolContext.for_call("r", "c")
    found = tool.handler({"name": "refunds"}, ctx)
    assert getattr(found, "data", None) == {"name": "refunds", "body": "Never refund."}
    missing = tool.handler({"name": "returns"}, ctx)
    assert missing.error is not None  # type: ignore[union-attr]
    assert missing.error.message == (  # type: ignore[union-attr]
        "there is no skill named 'returns'; skills: replacement-procedure, refunds"
    )


def test_skill_problems_name_the_path() -> None:
    too_big = "x" * (MAX_SKILL_BODY_BYTES + 1)
    problems = skill_problems(
        [
            {"name": "a", "summary": "A.", "body": too_big},
            {"name": "a", "summary": "two\nlines", "body": "b"},
            {"name": "Bad Name", "summary": "", "body": "b", "extra": 1},
        ]
    )
    assert f"skills[0].body has {MAX_SKILL_BODY_BYTES + 1} bytes" in problems[0]
    assert any("skills[1].name 'a' is taken by skills[0]" in p for p in problems)
    assert "skills[1].summary must be one line" in problems
    assert "skills[2].summary must be a non-blank string" in problems
    assert any(p.startswith("skills[2].name must be a slug") for p in problems)
    assert any("skills[2]: unknown key 'extra'" in p for p in problems)
    assert skill_problems([{"name": "ok", "summary": "Fine.", "body": "b"}]) == []
    assert skill_problems("x") != []


def test_tool_search_ranks_by_bm25_over_names_and_descriptions() -> None:
    contracts = [contract(f"bin_{i}", f"Stock level of bin {i}.") for i in range(50)]
    contracts += [
        contract("warranty_claim", "File a warranty claim for a damaged order."),
        contract("warranty_status", "Say where a warranty claim stands."),
        contract("refund_order", "Refund an order's payment."),
    ]
    found = search_tools("file warranty claims", contracts)
    assert [c.name for c, _ in found] == ["warranty_claim", "warranty_status"]
    assert found[0][1] > found[1][1] > 0
    assert search_tools("stock", contracts, limit=5)[4][0].name == "bin_12"
    assert search_tools("nothing like it", contracts) == []


def test_a_deferred_tool_is_sent_only_once_found_and_refused_before() -> None:
    ran: list[str] = []

    def handler(name: str) -> Any:
        return lambda args, ctx: ran.append(name) or {"ok": name}

    deferred = [
        Tool(contract(f"bin_{i}", f"Stock of bin {i}."), handler(f"bin_{i}"))
        for i in range(200)
    ]
    deferred = [Tool(t.contract, t.handler, deferred=True) for t in deferred]
    refund = Tool(contract("refund_order", "Refund an order."), handler("refund"))
    refund = Tool(refund.contract, refund.handler, deferred=True)
    core = Tool(contract("lookup", "Look an order up."), handler("lookup"))
    search = tool_search_tool([t.contract for t in [*deferred, refund]])
    registry = ToolRegistry([core, *deferred, refund, search])
    model = Recording(
        [
            {
                "tool_calls": [
                    {
                        "id": "s",
                        "name": "tool_search",
                        "arguments": {"query": "refund"},
                    },
                    {"id": "b3", "name": "bin_3", "arguments": {}},
                ]
            },
            {"tool_calls": [{"id": "r1", "name": "refund_order", "arguments": {}}]},
            {"text": "done"},
        ]
    )
    result = run_in_process(
        AgentConfig(name="a", reserve_output_tokens=50),
        model,
        registry,
        user_input="go",
    )
    assert model.tools[0] == ["lookup", "tool_search"]
    assert model.tools[1] == ["lookup", "refund_order", "tool_search"]
    observations = [
        json.loads(m["content"]) for m in result.messages if m["role"] == "tool"
    ]
    assert observations[0]["data"]["loaded"] == ["refund_order"]
    refused = observations[1]["error"]
    assert refused["code"] == "ENOTOOL" and "tool_search" in refused["message"]
    assert ran == ["refund"]  # bin_3 was never found, so never ran
    state = EngineState.from_dict(result.state.to_dict())
    assert state.loaded_tools == ["refund_order"]
