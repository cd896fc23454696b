"""Settled semantics (spec §1.4, scenario 16) through a real Celery worker on
the scripted model: a model call that overflows the window ends the run
`failed`, a recovery branch of the same session compacts and asks again, and
the API reports either run complete only once nothing goes on for it. The
failed attempt stays in the first run's trace, log and billing and is hidden
from the branch's context by a `context_edit`."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from runs.engine.session import SUMMARY_INSTRUCTIONS, SUMMARY_PREFIX, build_context
from runs.engine.session import SessionEntry as Entry
from runs.models import Run, SessionBranch, SessionEntry
from runs.services import run_start
from runs.services.decide import approval_decide
from runs.services.recovery import runs_settle_stranded
from runs.services.settle import run_settle
from tests.conftest import wait_for
from tracing.models import RunEvent, Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

OVERFLOW = {
    "error": {
        "kind": "context_overflow",
        "message": "prompt is too long: 210000 tokens > 200000",
    }
}
REPLACE = {
    "text": "Shipping a replacement.",
    "tool_calls": [
        {
            "id": "call_replace",
            "name": "create_replacement",
            "arguments": {"order_id": "4821", "reason": "it arrived damaged"},
        }
    ],
}
SHIPPED = {"text": "A replacement is on its way."}


def lookup(n: int) -> dict[str, Any]:
    note = f"pass {n}: order 4821 checked, " + "details " * 20
    return {
        "text": f"Noting pass {n} on order 4821.",
        "tool_calls": [
            {"id": f"call_{n}", "name": "echo", "arguments": {"text": note}}
        ],
    }


# Enough turns that a compaction has something to summarise (the last few
# messages stay verbatim).
LOOKUPS = [lookup(n) for n in range(4)]


def reread(run: Run) -> Run:
    run.refresh_from_db()
    return run


def until(run: Run, predicate: Any, what: str) -> Run:
    return wait_for(lambda: predicate(reread(run)) and run, timeout=90, what=what)


def usage(run: Run) -> tuple[Any, ...]:
    return (run.steps, run.input_tokens, run.output_tokens, run.cost)


def log_of(run: Run) -> list[Entry]:
    return [
        Entry(row.seq, row.entry_id, row.parent_id or None, row.type, row.payload)
        for row in SessionEntry.objects.filter(run=run).order_by("seq")
    ]


def chat_inputs(run: Run) -> list[list[dict[str, Any]]]:
    wait_for(
        lambda: not Span.objects.filter(run=run, ended_at__isnull=True).exists(),
        what="every span of the run ended",
    )
    return [
        json.loads(bodies["gen_ai.input.messages"])
        for span, bodies in run_spans_with_payloads(tenant=run.tenant, run_id=run.id)
        if span.attributes.get("gen_ai.operation.name") == "chat"
    ]


def test_an_overflow_recovers_on_a_branch_and_both_complete_only_when_settled(
    shop, scripted_agent, operator_user, api_client_for, celery_worker_process
):
    agent = scripted_agent(
        [*LOOKUPS, OVERFLOW, REPLACE, SHIPPED], ["echo", "create_replacement"]
    )
    client = api_client_for(operator_user, shop)
    first = run_start(
        tenant=shop, agent_slug=agent.slug, input="Order 4821 is damaged",
        started_by=operator_user,
    )  # fmt: skip
    first = until(first, lambda r: r.is_terminal, "the first run ended")
    assert (first.status, first.stop_reason) == ("failed", "context_overflow")
    assert "prompt is too long" in first.stop_detail
    billed = usage(first)
    branch = SessionBranch.objects.get(branch_of=first, kind="recovery")
    recovery = until(
        branch.run, lambda r: r.status == "waiting_approval", "the recovery waits"
    )

    # Ended, but not complete: its recovery goes on (and waits for a person).
    body = client.get(f"/api/v1/runs/{first.id}/").json()
    assert body["status"] == "failed" and body["settled"] is False
    assert body["settled_at"] is None
    assert body["recovery_run"] == str(recovery.id)
    shown = client.get(f"/api/v1/runs/{recovery.id}/").json()
    assert shown["recovers"] == str(first.id) and shown["settled"] is False

    approval_decide(
        request=ApprovalRequest.objects.get(run=recovery),
        decided_by=operator_user,
        approve=True,
    )
    recovery = until(recovery, lambda r: r.settled_at is not None, "it settled")
    first = reread(first)
    assert recovery.final_answer == SHIPPED["text"]
    assert first.settled_at is not None and first.settled_at >= recovery.settled_at
    for run in (first, recovery):
        body = client.get(f"/api/v1/runs/{run.id}/").json()
        assert body["settled"] is True, body
        assert RunEvent.objects.filter(run=run, type="run.settled").count() == 1
    assert first.status == "failed"  # what happened to it stays

    # The failed attempt is on the first run's log, trace and bill...
    log = log_of(first)
    attempt = log[-1]
    assert attempt.payload["message"]["role"] == "assistant"
    assert "prompt is too long" in attempt.payload["message"]["error"]
    first_calls = chat_inputs(first)
    assert len(first_calls) == 5  # 4 lookups, the call that overflowed
    overflowed = Span.objects.filter(run=first, name__startswith="chat").latest(
        "started_at"
    )
    assert overflowed.status == "error"
    assert usage(first) == billed and first.steps == 4  # the branch bills its own
    assert recovery.input_tokens > 0
    # ...and hidden from the branch's context by an edit on the branch.
    marker, edit = log_of(recovery)[:2]
    assert marker.parent_id == attempt.entry_id
    assert edit.type == "context_edit"
    assert edit.payload == {"target": attempt.entry_id, "action": "remove"}
    recovery_calls = chat_inputs(recovery)
    assert recovery_calls[0][0]["content"] == SUMMARY_INSTRUCTIONS  # compacted
    asked_again = recovery_calls[1]
    assert asked_again[0]["content"].startswith(SUMMARY_PREFIX)
    assert "prompt is too long" not in json.dumps(recovery_calls)
    assert all(not m.get("error") for m in asked_again)
    leaf = recovery.engine_state["session"]["leaf"]
    every = {e.entry_id: e for e in [*log, *log_of(recovery)]}
    rebuilt = build_context(every, leaf)
    assert rebuilt == recovery.engine_state["messages"]
    assert not any(m.get("error") for m in rebuilt)
    compaction = Span.objects.get(run=recovery, name="compaction")
    assert compaction.attributes["cp.compaction.reason"] == "overflow"


def test_a_recovery_that_overflows_again_ends_with_the_models_error(
    shop, scripted_agent, operator_user, celery_worker_process
):
    agent = scripted_agent([*LOOKUPS, OVERFLOW, OVERFLOW, SHIPPED], ["echo"])
    first = run_start(
        tenant=shop, agent_slug=agent.slug, input="Order 4821 is damaged",
        started_by=operator_user,
    )  # fmt: skip
    first = until(first, lambda r: r.settled_at is not None, "the first settled")
    (branch,) = SessionBranch.objects.filter(branch_of=first)
    recovery = reread(branch.run)
    assert (recovery.status, recovery.stop_reason) == ("failed", "model_error")
    assert recovery.settled_at is not None
    # Once: the recovery made no branch of its own.
    assert not SessionBranch.objects.filter(branch_of=recovery).exists()


def test_a_message_to_a_run_that_recovers_names_the_recovery_and_writes_nothing(
    shop, scripted_agent, operator_user, api_client_for, celery_worker_process
):
    agent = scripted_agent(
        [*LOOKUPS, OVERFLOW, REPLACE, SHIPPED], ["echo", "create_replacement"]
    )
    first = run_start(
        tenant=shop, agent_slug=agent.slug, input="Order 4821 is damaged",
        started_by=operator_user,
    )  # fmt: skip
    first = until(first, lambda r: r.is_terminal, "the first run ended")
    recovery = SessionBranch.objects.get(branch_of=first).run
    until(recovery, lambda r: r.status == "waiting_approval", "the recovery waits")
    before = reread(first)
    client = api_client_for(operator_user, shop)
    answer = client.post(
        f"/api/v1/runs/{first.id}/messages/", {"text": "also refund it"}, format="json"
    )
    assert answer.status_code == 409
    assert str(recovery.id) in answer.json()["error"]["message"]
    after = reread(first)
    assert (after.status, after.version, after.settled_at) == (
        before.status,
        before.version,
        None,
    )
    assert not after.messages.exists()


def test_a_run_whose_ending_lost_its_worker_is_settled_by_the_sweep(
    shop, scripted_agent, operator_user, drive_run
):
    agent = scripted_agent([SHIPPED], ["echo"])
    run = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="Order 4821",
            started_by=operator_user,
        )  # fmt: skip
    )
    assert run.settled_at is not None  # ended by a step: settled after its hooks
    # As if its worker died between the end's commit and the settle.
    Run.objects.filter(id=run.id).update(settled_at=None)
    assert runs_settle_stranded() == 0  # within the grace: a step may still end it
    later = timezone.now() + timedelta(seconds=600)
    assert runs_settle_stranded(now=later) == 1
    assert reread(run).settled_at is not None
    assert runs_settle_stranded(now=later) == 0


def test_a_run_cancelled_while_waiting_reads_settled_at_once(
    shop, scripted_agent, operator_user, drive_run, api_client_for
):
    agent = scripted_agent([REPLACE, SHIPPED], ["create_replacement"])
    run = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="Order 4821",
            started_by=operator_user,
        )  # fmt: skip
    )
    client = api_client_for(operator_user, shop)
    body = client.get(f"/api/v1/runs/{run.id}/").json()
    assert body["status"] == "waiting_approval" and body["settled"] is False
    assert client.post(f"/api/v1/runs/{run.id}/cancel/").status_code == 200
    body = client.get(f"/api/v1/runs/{run.id}/").json()
    assert body["status"] == "cancelled" and body["settled"] is True


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="holds a row lock SQLite does not have"
)
def test_no_reader_sees_a_recovery_settled_before_the_run_it_recovers(
    shop, scripted_agent, operator_user, drive_run
):
    agent = scripted_agent(
        [*LOOKUPS, OVERFLOW, REPLACE, SHIPPED], ["echo", "create_replacement"]
    )
    first = drive_run(
        run_start(
            tenant=shop,
            agent_slug=agent.slug,
            input="Order 4821 is damaged",
            started_by=operator_user,
        )  # fmt: skip
    )
    recovery = drive_run(SessionBranch.objects.get(branch_of=first).run)
    approval_decide(
        request=ApprovalRequest.objects.get(run=recovery),
        decided_by=operator_user,
        approve=True,
    )
    recovery = drive_run(recovery)
    assert recovery.is_terminal
    # Both ended and not yet settled, the recovery's settle about to run while
    # another transaction holds the first run's row.
    Run.objects.filter(id__in=[first.id, recovery.id]).update(settled_at=None)
    holding, release = threading.Event(), threading.Event()

    def hold_the_first_run() -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(id=first.id)
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    def settle_the_recovery() -> None:
        try:
            run_settle(run_id=recovery.id)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_first_run)
    holder.start()
    assert holding.wait(30)
    settler = threading.Thread(target=settle_the_recovery)
    settler.start()
    wait_for(lambda: lock_waiters() > 0, timeout=30, what="the settle waits")
    # What the API reads meanwhile: the pair is settled together or not at all.
    seen = {reread(first).settled_at is None, reread(recovery).settled_at is None}
    release.set()
    holder.join(30)
    settler.join(30)
    assert seen == {True}
    first, recovery = reread(first), reread(recovery)
    assert first.settled_at is not None and recovery.settled_at is not None
    assert first.settled_at >= recovery.settled_at


def lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(cursor.fetchone()[0])
