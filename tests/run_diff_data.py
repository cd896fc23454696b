"""Recorded runs to diff: Step and ToolCall rows written as the worker writes
them, shaped like the demo's #4821 runs (tests and bench/bench_diff.py)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from runs.models import Agent, Run, Step, ToolCall


@dataclass
class Call:
    tool: str
    args: dict[str, Any]
    status: str = "succeeded"
    observation: str = '{"ok":true}'


@dataclass
class Reply:
    """One model call: tool calls, or the final answer when `calls` is empty."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    input_tokens: int = 400
    output_tokens: int = 40


def demo_replies(*, order_id: str = "4821", replace: bool = True) -> list[Reply]:
    """The demo's run (runs/demo.py DEMO_SCRIPT) with its order id and whether
    it ships a replacement as parameters."""
    replies = [
        Reply(
            "Let me look up the order.",
            [
                Call(
                    "lookup_order",
                    {"order_id": order_id},
                    observation='{"ok":true,"data":{"status":"delivered"}}',
                )
            ],
        ),  # fmt: skip
    ]
    if replace:
        replies.append(
            Reply(
                "The kettle is damaged; I'll ship a replacement.",
                [
                    Call(
                        "create_replacement",
                        {"order_id": order_id, "reason": "arrived with a dented spout"},
                    )
                ],
            )  # fmt: skip
        )
    replies.append(
        Reply(
            "",
            [
                Call(
                    "get_delivery_date",
                    {"order_id": order_id},
                    observation='{"ok":true,"data":{"delivery_date":"2026-03-02"}}',
                )
            ],
        )  # fmt: skip
    )
    replies.append(
        Reply(
            "I'm sorry about the dented spout. A replacement kettle is on its way "
            "and will arrive on 2026-03-02."
            if replace
            else "I'm sorry about the dented spout; it arrives on 2026-03-02."
        )
    )
    return replies


def seed_recorded_run(
    agent: Agent,
    replies: list[Reply],
    *,
    input: str = "Order #4821 arrived with a dented spout.",
    started_by: Any = None,
    step_ms: int = 800,
) -> Run:
    """A finished run of `agent` that made `replies`, one Step each."""
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    price = Decimal("0.000002")
    run = Run.objects.create(
        tenant=agent.tenant, agent=agent, agent_version=agent.current_version,
        started_by=started_by, input=input, status=Run.Status.SUCCEEDED,
        stop_reason="done", started_at=start,
    )  # fmt: skip
    steps: list[Step] = []
    calls: list[ToolCall] = []
    at = start
    for index, reply in enumerate(replies):
        action: dict[str, Any]
        if reply.calls:
            action = {"type": "tool_calls", "text": reply.text, "calls": [
                {"call_id": f"c{index}-{p}", "name": c.tool, "arguments": c.args,
                 "raw_arguments": json.dumps(c.args), "parse_error": None}
                for p, c in enumerate(reply.calls)
            ]}  # fmt: skip
        else:
            action = {"type": "final_answer", "text": reply.text}
        step = Step(
            run=run, index=index, provider="scripted", model="scripted",
            finish_reason="tool_calls" if reply.calls else "stop",
            input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
            cost=price * (reply.input_tokens + reply.output_tokens),
            reply={"text": reply.text}, action=action, started_at=at,
            finished_at=at + dt.timedelta(milliseconds=step_ms),
        )  # fmt: skip
        steps.append(step)
        for position, c in enumerate(reply.calls):
            encoded = json.dumps(c.args, sort_keys=True)
            calls.append(ToolCall(
                run=run, step=step, position=position, call_id=f"c{index}-{position}",
                tool_name=c.tool, args=c.args, raw_args=encoded,
                args_sha256=hashlib.sha256(encoded.encode()).hexdigest(),
                idempotency_key=uuid.uuid4().hex, status=c.status,
                result={"ok": c.status == "succeeded"},
                observation={"content": c.observation, "truncated": False},
                started_at=at, finished_at=at + dt.timedelta(milliseconds=50),
            ))  # fmt: skip
        at += dt.timedelta(milliseconds=step_ms + 100)
    Step.objects.bulk_create(steps, batch_size=500)
    ToolCall.objects.bulk_create(calls, batch_size=500)
    final = replies[-1].text if replies and not replies[-1].calls else ""
    Run.objects.filter(id=run.id).update(
        steps=len(steps), tool_calls=len(calls),
        input_tokens=sum(s.input_tokens for s in steps),
        output_tokens=sum(s.output_tokens for s in steps),
        cost=sum((s.cost for s in steps), Decimal(0)), final_answer=final,
        finished_at=at,
    )  # fmt: skip
    run.refresh_from_db()
    return run
