"""Hooks of an agent version, through a real Celery worker on the scripted
model: `before_agent` adds context (the model receives it) or refuses the run;
`tool_result` redacts before the model sees a result, annotates, or stops the
run; lifecycle hooks annotate. Each is a span; a hook that raises or outlasts
its timeout blocks (spec §1.5: fail-safe), never allows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from budgets.models import ModelPriceEntry
from runs.models import Run, Step, ToolCall
from runs.services import run_cancel, run_start
from tests.conftest import WorkerProcess, start_worker, wait_for
from tests.runs import hook_types
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

CUSTOMER = "Ada Whitfield"  # the demo order's customer, in lookup_order's result
LOOKUP = {
    "text": "Let me look up the order.",
    "tool_calls": [
        {"id": "call_lookup", "name": "lookup_order", "arguments": {"order_id": "4821"}}
    ],
}
ANSWER = {"text": "I found your order; a replacement is on its way."}


@pytest.fixture
def hook_worker(
    tmp_path: Path, transactional_db: Any, settings: Any
) -> Iterator[WorkerProcess]:
    """A worker of a deployment that installed the failing test hook types."""
    settings.RUN_EXTRA_HOOK_TYPES = [hook_types.PATH]
    worker = start_worker(tmp_path, extra_env={"RUN_EXTRA_HOOK_TYPES": hook_types.PATH})
    yield worker
    worker.stop()


def settled(run: Run, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def run_of(
    scripted_agent: Any,
    user: Any,
    script: list[Any],
    hooks: list[Any],
    text: str = "Order 4821 is damaged",
) -> Run:
    agent = scripted_agent(script, ["lookup_order"], hooks=hooks)
    run = run_start(tenant=agent.tenant, agent_slug=agent.slug, input=text,
                    started_by=user)  # fmt: skip
    return settled(run)


def spans_of(run: Run) -> list[tuple[Span, dict[str, str]]]:
    wait_for(
        lambda: (
            Span.objects.filter(run=run).exists()
            and not Span.objects.filter(run=run, ended_at__isnull=True).exists()
        ),
        what="every span of the run ended",
    )
    return run_spans_with_payloads(tenant=run.tenant, run_id=run.id)


def model_inputs(run: Run) -> list[str]:
    """What the model received on each call (the chat spans' input messages)."""
    key = "gen_ai.input.messages"
    return [
        payloads.get(key) or span.attributes[key]
        for span, payloads in spans_of(run)
        if span.name.startswith("chat ")
    ]


def hook_span(run: Run, name: str) -> Span:
    found = [span for span, _ in spans_of(run) if span.name == f"hook {name}"]
    assert found, f"no span 'hook {name}'"
    return found[0]


def test_before_agent_context_reaches_the_model(
    shop, scripted_agent, operator_user, hook_worker
):
    context = "The customer is a VIP: offer express shipping."
    run = run_of(scripted_agent, operator_user, [ANSWER],
                 [{"type": "add_context", "params": {"text": context}}])  # fmt: skip
    assert run.stop_reason == "done", run.stop_detail
    (received,) = model_inputs(run)
    messages = json.loads(received)
    assert messages[0]["role"] == "system" and context in messages[0]["content"]
    span = hook_span(run, "add_context")
    assert span.attributes["cp.hook.event"] == "before_agent"
    assert span.attributes["cp.hook.status"] == "ok"
    assert span.attributes["cp.hook.latency_ms"] >= 0


def test_before_agent_context_stays_in_every_later_model_call(
    shop, scripted_agent, operator_user, hook_worker
):
    """Through many turns and the compactions they cause (a small window in the
    price table): the context is in the system message the log's compaction
    checkpoint carries, so the model sees it on every call, not only the first."""
    ModelPriceEntry.objects.create(
        model="scripted", input_per_million=Decimal(0),
        cached_input_per_million=Decimal(0), output_per_million=Decimal(0),
        context_window_tokens=2500,
    )  # fmt: skip
    context = "The customer is a VIP: offer express shipping."
    echoes = [
        {"tool_calls": [{"id": f"echo_{n}", "name": "echo",
                         "arguments": {"text": f"note {n}: " + "order 4821 " * 30}}]}
        for n in range(12)
    ]  # fmt: skip
    agent = scripted_agent(
        [*echoes, ANSWER], ["echo"], compaction_threshold=0.5,
        hooks=[{"type": "add_context", "params": {"text": context}}],
    )  # fmt: skip
    run = run_start(tenant=agent.tenant, agent_slug=agent.slug, input="Order 4821",
                    started_by=operator_user)  # fmt: skip
    run = settled(run)
    assert run.stop_reason == "done", run.stop_detail
    assert run.engine_state.get("compactions", 0) >= 1
    turns = [
        messages
        for messages in map(json.loads, model_inputs(run))
        if not messages[0]["content"].startswith("You are compacting")
    ]
    assert len(turns) == 13
    for messages in turns:
        assert messages[0]["role"] == "system"
        assert messages[0]["content"] == context
    # The hook ran once: a later step (or a resume) does not add it again.
    assert Span.objects.filter(run=run, name="hook add_context").count() == 1


def test_before_agent_refuses_the_run_before_the_model_is_asked(
    shop, scripted_agent, operator_user, hook_worker
):
    hook = {
        "type": "refuse_if_match",
        "params": {"patterns": [r"\bcancel my account\b"],
                   "message": "Account changes go through the account page."},
    }  # fmt: skip
    run = run_of(scripted_agent, operator_user, [ANSWER], [hook],
                 text="Please cancel my account now")  # fmt: skip
    assert run.status == Run.Status.POLICY_BLOCKED
    assert run.stop_reason == "hook_blocked"
    assert "before_agent hook 'refuse_if_match'" in run.stop_detail
    assert run.final_answer == "Account changes go through the account page."
    assert not Step.objects.filter(run=run).exists()
    assert hook_span(run, "refuse_if_match").attributes["cp.hook.status"] == "blocked"


def test_a_tool_result_hook_redacts_before_the_model_sees_it(
    shop, scripted_agent, operator_user, hook_worker
):
    hooks = [
        {
            "type": "redact",
            "params": {"patterns": [CUSTOMER], "tools": ["lookup_order"]},
        },
        {"type": "annotate", "params": {"text": "Customer names are withheld."}},
    ]
    run = run_of(scripted_agent, operator_user, [LOOKUP, ANSWER], hooks)
    assert run.stop_reason == "done", run.stop_detail
    call = ToolCall.objects.get(run=run)
    assert call.status == "succeeded"
    # The name is withheld; the customer's id (not a pattern here) stays.
    assert call.result["data"]["customer"] == "[redacted] (c-8812)"
    assert call.result["data"]["host_note"] == "Customer names are withheld."
    assert CUSTOMER not in json.dumps(call.observation)
    first, second = model_inputs(run)
    assert CUSTOMER not in second and "[redacted]" in second
    assert "Customer names are withheld." in second
    tool_span = next(
        s for s, _ in spans_of(run) if s.name == "execute_tool lookup_order"
    )
    assert CUSTOMER not in json.dumps(tool_span.attributes)
    redact = hook_span(run, "redact")
    assert redact.attributes["cp.hook.event"] == "tool_result"
    assert redact.attributes["cp.hook.detail"] == "redacted 1 match(es)"
    assert redact.parent_span_id == tool_span.span_id


def test_a_tool_result_hook_may_stop_the_run(
    shop, scripted_agent, operator_user, hook_worker
):
    params = {"patterns": ["damaged"], "reason": "damage claims go to a person"}
    hook = {"type": "stop_if_match", "params": params}
    run = run_of(scripted_agent, operator_user, [LOOKUP, ANSWER], [hook])
    assert run.stop_reason == "hook_blocked"
    assert "damage claims go to a person" in run.stop_detail
    assert Step.objects.filter(run=run).count() == 1  # not asked again


@pytest.mark.parametrize(
    ("hook", "why"),
    [
        ({"type": "test_raise"}, "RuntimeError: the hook's backend is down"),
        ({"type": "test_sleep", "params": {"seconds": 5}, "timeout_seconds": 0.3},
         "CheckTimedOut: no answer within 0.3 s"),
    ],
)  # fmt: skip
def test_a_failing_tool_result_hook_blocks_and_withholds_the_result(
    shop, scripted_agent, operator_user, hook_worker, hook, why
):
    run = run_of(scripted_agent, operator_user, [LOOKUP, ANSWER], [hook])
    assert run.status == Run.Status.FAILED
    assert run.stop_reason == "hook_failed"
    assert why in run.stop_detail
    call = ToolCall.objects.get(run=run)
    assert call.status == "failed"
    assert call.result["error"]["code"] == "EPERM"
    assert "withheld" in call.result["error"]["message"]
    assert CUSTOMER not in json.dumps(call.result) + json.dumps(call.observation)
    assert Step.objects.filter(run=run).count() == 1  # the model never saw it
    span = hook_span(run, hook["type"])
    assert span.attributes["cp.hook.blocked_by"] == "hook_error"
    assert span.status == "error"


def test_a_failing_before_agent_hook_blocks_the_run(
    shop, scripted_agent, operator_user, hook_worker
):
    hook = {"type": "test_raise", "event": "before_agent"}
    run = run_of(scripted_agent, operator_user, [ANSWER], [hook])
    assert run.stop_reason == "hook_failed"
    assert not Step.objects.filter(run=run).exists()


def test_lifecycle_hooks_annotate_the_start_and_the_end(
    shop, scripted_agent, operator_user, hook_worker
):
    hooks = [
        {"type": "annotate_run", "name": "opened", "params": {"text": "ticket opened"}},
        {"type": "annotate_run", "name": "closed", "event": "run_finished",
         "params": {"text": "ticket closed"}},
    ]  # fmt: skip
    run = run_of(scripted_agent, operator_user, [ANSWER], hooks)
    assert run.stop_reason == "done"
    opened, closed = hook_span(run, "opened"), hook_span(run, "closed")
    assert opened.attributes["cp.hook.event"] == "run_started"
    assert opened.attributes["cp.hook.detail"] == "ticket opened"
    assert closed.attributes["cp.hook.event"] == "run_finished"
    assert closed.attributes["cp.hook.detail"] == "ticket closed"


def test_a_run_cancelled_while_it_waits_still_runs_its_finished_hooks(
    shop, scripted_agent, operator_user, hook_worker
):
    arguments = {"order_id": "4821", "reason": "dented spout"}
    replace = {
        "tool_calls": [
            {"id": "c1", "name": "create_replacement", "arguments": arguments}
        ]
    }
    hooks = [{"type": "annotate_run", "name": "closed", "event": "run_finished",
              "params": {"text": "ticket closed"}}]  # fmt: skip
    agent = scripted_agent([replace, ANSWER], ["create_replacement"], hooks=hooks)
    run = run_start(tenant=shop, agent_slug=agent.slug, input="Order 4821 is dented",
                    started_by=operator_user)  # fmt: skip
    wait_for(
        lambda: Run.objects.filter(
            id=run.id, status=Run.Status.WAITING_APPROVAL
        ).exists(),
        what="the run waits for the approval",
    )
    assert not Span.objects.filter(run=run, name="hook closed").exists()
    with transaction.atomic():
        run_cancel(run=run, actor=operator_user)  # no step runs: it holds no worker

    closed = wait_for(
        lambda: Span.objects.filter(
            run=run, name="hook closed", ended_at__isnull=False
        ).first(),
        what="the run_finished hook's span",
    )
    assert closed.attributes["cp.hook.event"] == "run_finished"
    assert closed.attributes["cp.hook.detail"] == "ticket closed"
    root = Span.objects.get(run=run, parent_span_id="")
    assert (closed.trace_id, closed.parent_span_id) == (root.trace_id, root.span_id)
    assert Run.objects.get(id=run.id).status == Run.Status.CANCELLED
