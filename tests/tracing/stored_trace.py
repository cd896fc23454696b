"""A stored run with a trace shaped like a long native run, written straight to
the span and event tables (as bench_ui does): a root, `steps` steps, each with
a chat span and `tools` tool spans; one tool deep inside step `error_step` fails,
and step 2 waits for a person on an approval. The chat of step 1 carries a
conversation payload (system, user, tool call, tool result with newlines, a long
answer)."""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from approvals.models import ApprovalRequest
from runs.models import Agent, Run, Step, ToolCall
from tracing.models import RunEvent, Span
from tracing.payloads import payload_store
from tracing.store import span_event_payload

LONG_ANSWER = "\n".join(f"Line {i} of the refund policy." for i in range(1, 41))
CONVERSATION_INPUT = [
    {"role": "system", "content": "You are Kettlecraft's support agent."},
    {"role": "user", "content": "My kettle KC-1042 arrived dented.\nCan you help?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_lookup",
                "type": "function",
                "function": {
                    "name": "lookup_order",
                    "arguments": json.dumps({"order_id": "KC-1042"}),
                },
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_lookup",
        "content": json.dumps({"status": "delivered", "items": ["kettle"]}),
    },
]
CONVERSATION_OUTPUT = [{"role": "assistant", "content": LONG_ANSWER}]


@dataclass
class StoredTrace:
    run: Run
    root: Span
    steps: list[Span]
    failed: Span  # the failing tool span, three levels down
    approval: Span
    approval_request: ApprovalRequest
    chat: Span  # step 1's chat, with the conversation payloads
    by_name: dict[str, Span] = field(default_factory=dict)


def _hex(bits: int) -> str:
    return f"{random.getrandbits(bits):0{bits // 4}x}"


def store_trace(
    *, tenant: Any, user: Any, steps: int = 8, tools: int = 3, error_step: int = 6
) -> StoredTrace:
    agent = Agent.objects.filter(tenant=tenant).first()
    if agent is None:
        from tests.agents import make_agent

        agent = make_agent(tenant, "stored-trace", name="Stored", tools=["echo"])
    trace_id = _hex(128)
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=30)
    end = start + dt.timedelta(seconds=steps * 10 + 60)
    run = Run.objects.create(
        tenant=tenant, agent=agent, agent_version=agent.current_version,
        started_by=user, input="stored: a long trace", status=Run.Status.FAILED,
        trace_id=trace_id, started_at=start, finished_at=end,
    )  # fmt: skip

    def span(parent: str, name: str, at: dt.datetime, ms: float, **attrs: Any) -> Span:
        return Span(
            run=run, trace_id=trace_id, span_id=_hex(64), parent_span_id=parent,
            name=name, status=Span.Status.OK, started_at=at,
            ended_at=at + dt.timedelta(milliseconds=ms), attributes=attrs,
        )  # fmt: skip

    whole = (end - start).total_seconds() * 1000
    root = span("", "invoke_agent stored-trace", start, whole,
                **{"gen_ai.operation.name": "invoke_agent",
                   "gen_ai.usage.input_tokens": 999_999})  # fmt: skip
    spans = [root]
    step_spans: list[Span] = []
    failed = approval = chat_one = request = None
    offset = 0.0
    for index in range(steps):
        at = start + dt.timedelta(seconds=offset)
        wait = 60.0 if index == 2 else 0.0  # step 2 waits a minute for a person
        step = span(root.span_id, f"step {index}", at, 9000 + wait * 1000,
                    **{"cp.step.index": index})  # fmt: skip
        step_spans.append(step)
        spans.append(step)
        chat = span(step.span_id, "chat scripted", at, 800, **{
            "gen_ai.operation.name": "chat",
            "gen_ai.usage.input_tokens": 100 + index,
            "gen_ai.usage.output_tokens": 10,
            "gen_ai.response.model": "scripted-kettlecraft",
        })  # fmt: skip
        spans.append(chat)
        if index == 1:
            chat_one = chat
        step_row = Step.objects.create(
            run=run, index=index, input_tokens=100 + index, output_tokens=10,
            cost=Decimal("0.010000"), started_at=at,
        )  # fmt: skip
        tool_at = at + dt.timedelta(milliseconds=900)
        if wait:
            approval = span(step.span_id, "approval create_replacement", tool_at,
                            wait * 1000, **{
                                "gen_ai.tool.name": "create_replacement",
                                "gen_ai.tool.call.id": "call_wait",
                                "cp.approval.status": "approved",
                                "cp.approval.decider": "oscar-operator",
                            })  # fmt: skip
            spans.append(approval)
            call_row = ToolCall.objects.create(
                run=run, step=step_row, position=0, call_id="call_wait",
                tool_name="create_replacement", args={"order_id": "KC-1042"},
                args_sha256="0" * 64, idempotency_key=_hex(64),
                status=ToolCall.Status.SUCCEEDED,
            )  # fmt: skip
            request = ApprovalRequest.objects.create(
                tenant=tenant, run=run, tool_call=call_row,
                tool_name="create_replacement", rule="effect:write",
                args_snapshot={"order_id": "KC-1042"}, args_sha256="0" * 64,
                status=ApprovalRequest.Status.APPROVED, decided_by=user,
                decided_at=tool_at + dt.timedelta(seconds=wait),
                expires_at=tool_at + dt.timedelta(hours=1),
            )  # fmt: skip
            tool_at += dt.timedelta(seconds=wait)
        for tool in range(tools):
            name = f"execute_tool lookup_order #{tool}"
            call_at = tool_at + dt.timedelta(milliseconds=tool * 500)
            order = f"KC-{1000 + index * 10 + tool}"
            call = span(step.span_id, name, call_at, 300,
                        **{"gen_ai.tool.name": "lookup_order",
                           "cp.tool.order_id": order})  # fmt: skip
            spans.append(call)
            if index == error_step and tool == tools - 1:
                inner = span(call.span_id, "http POST warehouse", call.started_at, 200,
                             **{"http.status_code": 503})  # fmt: skip
                inner.status = Span.Status.ERROR
                inner.status_message = "warehouse answered 503 Service Unavailable"
                failed = inner
                spans.append(inner)
        offset += 10 + wait
    assert failed and approval and chat_one and request
    chat_one.payloads = {
        "gen_ai.input.messages": payload_store(
            tenant_id=tenant.id, value=CONVERSATION_INPUT
        ),
        "gen_ai.output.messages": payload_store(
            tenant_id=tenant.id, value=CONVERSATION_OUTPUT
        ),
    }
    Span.objects.bulk_create(spans, batch_size=2000)
    stored_spans = {s.span_id: s for s in Span.objects.filter(run=run)}
    events = []
    seq = 0
    for written in spans:
        payload = span_event_payload(stored_spans[written.span_id])
        for kind in ("span.started", "span.ended"):
            seq += 1
            events.append(RunEvent(run=run, seq=seq, type=kind, payload=payload))
    RunEvent.objects.bulk_create(events, batch_size=2000)
    return StoredTrace(
        run=run,
        root=stored_spans[root.span_id],
        steps=[stored_spans[s.span_id] for s in step_spans],
        failed=stored_spans[failed.span_id],
        approval=stored_spans[approval.span_id],
        approval_request=request,
        chat=stored_spans[chat_one.span_id],
        by_name={s.name: s for s in stored_spans.values()},
    )
