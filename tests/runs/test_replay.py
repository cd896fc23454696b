"""`replay_run`: a recorded run replays from its record, no tool runs again."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from runs.models import Run, Step
from runs.replay import run_replay
from runs.services import run_start
from shop.models import Refund
from tests.approvals.conftest import REFUND_ARGS, call, script_of, shop_agent

__all__ = ["shop_agent"]


def test_a_recorded_run_replays_step_by_step_without_executing_tools(
    shop_agent: Any, drive_run: Any
) -> None:
    agent = shop_agent(
        script_of(call("lookup_order", {"order_id": "4821"}),
                  call("get_delivery_date", {"order_id": "4821"}))
    )  # fmt: skip
    run = drive_run(
        run_start(
            tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
        )
    )
    assert run.is_terminal and run.steps == 3
    from tracing.models import RunEvent, Span

    def world() -> list[int]:
        return [model.objects.count() for model in (Run, Step, Span, RunEvent, Refund)]

    before = world()
    report = run_replay(run=run)
    assert report.matches, report.lines
    assert report.lines[0].startswith("same step 0: ['lookup_order']")
    assert world() == before  # nothing written, nothing executed
    out = StringIO()
    call_command("replay_run", str(run.id), stdout=out)
    assert "the replay matches the record" in out.getvalue()


def test_a_tampered_record_is_reported_as_different(
    shop_agent: Any, drive_run: Any
) -> None:
    agent = shop_agent(script_of(call("refund", REFUND_ARGS)))
    run = run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input="hi", started_by=None
    )
    run = drive_run(run)
    refunds = Refund.objects.count()
    step = Step.objects.get(run=run, index=0)
    reply = dict(step.reply)
    tampered = {"order_id": "9999", "amount": 1}
    reply["tool_calls"] = [
        {
            **reply["tool_calls"][0],
            "arguments": tampered,
            "raw_arguments": json.dumps(tampered),
        }
    ]
    Step.objects.filter(id=step.id).update(reply=reply)
    report = run_replay(run=Run.objects.get(id=run.id))
    assert not report.matches
    assert any(line.startswith("DIFF step 0") for line in report.lines)
    with pytest.raises(CommandError):
        call_command("replay_run", str(run.id), stdout=StringIO())
    assert Refund.objects.count() == refunds  # nothing executed again
