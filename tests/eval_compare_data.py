"""Two eval runs of one suite that differ: the demo agent's version 1 ships a
replacement and says so; its version 2 (a prompt change, in the scripted model's
terms a script that skips the replacement) only gives the delivery date. The
`replacement-promised` case passes on v1 and fails on v2; `delivery-date`
passes on both. Used by the comparison API and browser tests."""

from __future__ import annotations

from typing import Any

from runs.models import Agent, EvalRun, EvalSuite
from runs.services.agents import agent_update
from runs.services.eval_runs import eval_run_start
from runs.services.evals import eval_suite_create
from tests.conftest import wait_for

INPUT = "Order #4821 arrived with a dented spout."

CASES: list[dict[str, Any]] = [
    {
        "slug": "replacement-promised",
        "input": INPUT,
        "approvals": [{"tool": "create_replacement", "decision": "approve"}],
        "graders": [
            {"kind": "final_answer_regex", "pattern": "replacement kettle is on"},
        ],
    },
    {
        "slug": "delivery-date",
        "input": INPUT,
        "approvals": [{"tool": "create_replacement", "decision": "approve"}],
        "graders": [{"kind": "must_call", "tool": "get_delivery_date"}],
    },
]

# Version 2: looks the order up, gives the date, ships nothing.
NO_REPLACEMENT_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Let me look up the order.",
        "tool_calls": [{"id": "call_lookup", "name": "lookup_order",
                        "arguments": {"order_id": "4821"}}],
        "usage": {"input_tokens": 412, "output_tokens": 31},
    },
    {
        "tool_calls": [{"id": "call_date", "name": "get_delivery_date",
                        "arguments": {"order_id": "4821"}}],
        "usage": {"input_tokens": 500, "output_tokens": 25},
    },
    {
        "text": "I'm sorry about the dented spout. It was delivered on "
        "{{call_date.delivery_date}}; a colleague will be in touch.",
        "usage": {"input_tokens": 560, "output_tokens": 30},
    },
]  # fmt: skip


def suite_with_two_versions(agent: Agent, user: Any, slug: str = "kettle") -> EvalSuite:
    """The suite above, and version 2 of `agent` (version 1 stays as it is)."""
    agent_update(
        agent=agent, actor=None, config={"script": NO_REPLACEMENT_SCRIPT}, partial=True
    )
    return eval_suite_create(
        tenant=agent.tenant,
        actor=user,
        document={"slug": slug, "name": "Kettle support", "cases": CASES},
    )


def start(suite: EvalSuite, agent: Agent, user: Any, version: int, k: int) -> EvalRun:
    return eval_run_start(
        tenant=agent.tenant, suite=suite, agent_slug=agent.slug, version=version,
        k=k, user=user,
    )  # fmt: skip


def finished(eval_run: EvalRun, timeout: float = 120) -> EvalRun:
    def done() -> EvalRun | None:
        fresh = EvalRun.objects.get(id=eval_run.id)
        return fresh if fresh.status == EvalRun.Status.FINISHED else None

    return wait_for(done, timeout=timeout, what=f"eval run {eval_run.id} to finish")
