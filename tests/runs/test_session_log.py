"""The session log and compaction through a real Celery worker on the scripted
model: every model call is the context the log rebuilds, across a worker
restart and an approval; compaction keeps calls under the model's window; a
failed compaction (on an overflow's recovery branch, tests/runs/test_settled.py)
ends the run `failed`; only the lease holder appends; the session API is
tenant-scoped."""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.db.models import F

from approvals.models import ApprovalRequest
from budgets.models import ModelPriceEntry
from runs.engine.budget import estimate_input_tokens
from runs.engine.loop import EngineState
from runs.engine.session import (
    SUMMARY_INSTRUCTIONS,
    SUMMARY_PREFIX,
    build_context,
)
from runs.engine.session import (
    SessionEntry as Entry,
)
from runs.models import Run, SessionBranch, SessionEntry
from runs.services import run_start
from runs.services.advance import StepContext
from runs.services.decide import approval_decide
from runs.services.lifecycle import LeaseLost, lease_acquire
from runs.services.session import SessionWriterConflict, session_entries_append
from tests.conftest import start_worker, wait_for
from tracing.models import Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def lookup(n: int) -> dict[str, Any]:
    """A turn that echoes a note about order 4821 (each different: the same
    action and observation repeated would end the run `no_progress`)."""
    note = f"pass {n}: order 4821 checked, " + "details " * 20
    return {
        "text": f"Noting pass {n} on order 4821.",
        "tool_calls": [
            {"id": f"call_{n}", "name": "echo", "arguments": {"text": note}}
        ],
    }


ANSWER = {"text": "Order 4821: a replacement is on its way."}


def settled(run: Run, timeout: float = 120) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def reread(run: Run) -> Run:
    run.refresh_from_db()
    return run


def log_of(run: Run) -> list[Entry]:
    return [
        Entry(row.seq, row.entry_id, row.parent_id or None, row.type, row.payload)
        for row in SessionEntry.objects.filter(run=run).order_by("seq")
    ]


def chat_calls(run: Run) -> list[tuple[list[dict[str, Any]], str]]:
    """Each model call's input messages and its tool definitions, in order."""
    wait_for(
        lambda: not Span.objects.filter(run=run, ended_at__isnull=True).exists(),
        what="every span of the run ended",
    )
    calls = []
    for span, bodies in run_spans_with_payloads(tenant=run.tenant, run_id=run.id):
        if span.attributes.get("gen_ai.operation.name") != "chat":
            continue
        found = {**span.attributes, **bodies}
        calls.append(
            (
                json.loads(found["gen_ai.input.messages"]),
                found["gen_ai.tool.definitions"],
            )
        )
    return calls


def is_summary_call(messages: list[dict[str, Any]]) -> bool:
    return messages[0].get("content") == SUMMARY_INSTRUCTIONS


def assert_log_is_one_chain_that_rebuilds(run: Run) -> list[Entry]:
    """Seqs 0..n-1, each entry's parent the one before (one branch, nothing
    appended twice), and the leaf rebuilds the checkpoint's context."""
    log = log_of(run)
    assert [e.seq for e in log] == list(range(len(log)))
    assert [e.parent_id for e in log] == [None] + [e.entry_id for e in log[:-1]]
    leaf = run.engine_state["session"]["leaf"]
    assert leaf == log[-1].entry_id
    assert build_context(log, leaf) == run.engine_state["messages"]
    return log


def test_every_model_call_is_the_logs_context_across_a_restart_and_an_approval(
    demo_agent, operator_user, celery_worker_process, tmp_path
):
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug="kettlecraft-support",
        input="order 4821 arrived damaged",
        started_by=operator_user,
    )

    def waiting() -> Run | None:
        run.refresh_from_db()
        return run if run.status == Run.Status.WAITING_APPROVAL else None

    run = wait_for(waiting, timeout=90)
    before = assert_log_is_one_chain_that_rebuilds(run)
    # The worker is gone while the run waits; another resumes it.
    celery_worker_process.stop()
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    approval_decide(request=approval, decided_by=operator_user, approve=True)
    worker = start_worker(tmp_path)
    try:
        run = settled(run)
    finally:
        worker.stop()
    assert run.status == Run.Status.SUCCEEDED, run.stop_detail
    log = assert_log_is_one_chain_that_rebuilds(run)
    # What was logged before the wait is unchanged: append-only.
    assert log[: len(before)] == before
    final = build_context(log, log[-1].entry_id)
    calls = chat_calls(run)
    assert len(calls) == run.steps == 4
    for messages, _tools in calls:
        # Each call's input is the context the log rebuilds at that point.
        assert final[: len(messages)] == messages
    # The assistant turn with the approved call is logged once, and its result
    # after it (persisted before the next model request).
    roles = [e.payload["message"]["role"] for e in log if e.type == "message"]
    assert roles.count("assistant") == 4 and roles.count("tool") == 3


@pytest.fixture
def small_window(settings: Any) -> ModelPriceEntry:
    """The scripted model's row in the price table: free, with a small window."""
    return ModelPriceEntry.objects.create(
        model="scripted",
        input_per_million=Decimal(0),
        cached_input_per_million=Decimal(0),
        output_per_million=Decimal(0),
        context_window_tokens=3000,
    )


def test_compaction_keeps_every_model_call_under_the_window(
    shop, scripted_agent, operator_user, small_window, celery_worker_process
):
    turns = 24
    agent = scripted_agent(
        [lookup(n) for n in range(turns)] + [ANSWER], ["echo"], compaction_threshold=0.6
    )
    run = run_start(
        tenant=agent.tenant,
        agent_slug=agent.slug,
        input="Order 4821 is damaged",
        started_by=operator_user,
    )
    run = settled(run)
    assert run.stop_reason == "done", run.stop_detail
    assert run.steps == turns + 1  # compactions are not steps
    calls = chat_calls(run)
    turns_seen = [m for m, _ in calls if not is_summary_call(m)]
    assert len(turns_seen) == turns + 1
    for messages, tools in calls:
        sent = estimate_input_tokens(json.dumps(messages), json.loads(tools))
        assert sent <= small_window.context_window_tokens
    log = assert_log_is_one_chain_that_rebuilds(run)
    compactions = [e for e in log if e.type == "compaction"]
    assert compactions, "the context never reached the threshold"
    assert run.engine_state["compactions"] == len(compactions)
    ids = {e.entry_id for e in log}
    for entry in compactions:
        assert entry.payload["firstKeptEntryId"] in ids
        assert entry.payload["tokensBefore"] > 0.6 * 3000
    # Old outputs were dropped first, by edits; the raw results stay in full.
    assert any(e.type == "context_edit" for e in log)
    results = [
        e for e in log if e.type == "message" and e.payload["message"]["role"] == "tool"
    ]
    assert len(results) == turns
    assert all("details" in e.payload["message"]["content"] for e in results)
    # The summary request carried the ids; the summary is in the context.
    summaries = [m for m, _ in calls if is_summary_call(m)]
    assert "4821" in summaries[0][1]["content"]
    assert "call_0" in summaries[0][1]["content"]
    last_turn = turns_seen[-1]  # the agent has no system prompt: summary first
    assert last_turn[0]["content"].startswith(SUMMARY_PREFIX)
    assert "4821" in last_turn[0]["content"]
    # The last messages stayed verbatim.
    assert last_turn[-1]["role"] == "tool" and last_turn[-1]["tool_call_id"] == (
        f"call_{turns - 1}"
    )
    spans = Span.objects.filter(run=run, name="compaction")
    assert spans.count() == len(compactions) + len(
        [s for s in spans if not s.attributes["cp.compaction.summarised"]]
    )
    assert all(s.attributes["cp.compaction.tokens_before"] > 0 for s in spans)


def test_a_failed_compaction_ends_the_run_failed_and_is_not_tried_again(
    shop, scripted_agent, operator_user, celery_worker_process
):
    overflow = {"error": {"kind": "context_overflow", "message": "too long"}}
    down = {"error": {"kind": "server_error", "message": "the summariser is down"}}
    script = [
        lookup(0),
        lookup(1),
        lookup(2),
        overflow,
        {**ANSWER, "on_compaction": down},
    ]
    agent = scripted_agent(script, ["echo"])
    run = run_start(
        tenant=agent.tenant,
        agent_slug=agent.slug,
        input="Order 4821 is damaged",
        started_by=operator_user,
    )
    first = settled(run)
    assert first.stop_reason == "context_overflow", first.stop_detail
    # Its recovery branch compacts first; the summary fails, and is not retried.
    run = settled(SessionBranch.objects.get(branch_of=first, kind="recovery").run)
    assert run.status == Run.Status.FAILED
    assert run.stop_reason == "compaction_failed", run.stop_detail
    assert "the summariser is down" in run.stop_detail
    assert len(chat_calls(first)) == 4  # 3 lookups, the overflow
    calls = chat_calls(run)
    assert len(calls) == 1 and is_summary_call(calls[0][0])  # the one summary call
    assert not [e for e in log_of(run) if e.type == "compaction"]
    span = Span.objects.get(run=run, name="compaction")
    assert span.status == "error" and "the summariser is down" in span.status_message
    assert wait_for(lambda: reread(first).settled_at, what="the first run settled")


def test_only_the_lease_holder_appends_to_the_log(shop, scripted_agent, operator_user):
    agent = scripted_agent([ANSWER], ["echo"])
    run = run_start(
        tenant=agent.tenant,
        agent_slug=agent.slug,
        input="Order 4821",
        started_by=operator_user,
    )
    run.refresh_from_db()
    lease = lease_acquire(
        run_id=str(run.id), step_token=str(run.step_token), owner="worker-a"
    )
    assert lease is not None
    state = EngineState.from_dict(lease.run.engine_state)
    stale = StepContext(
        run=lease.run,
        state=state,
        build_runtime=lambda: None,  # type: ignore[arg-type,return-value]
        started=time.monotonic(),
        base_wall_seconds=0.0,
    )
    # Worker B took the run over (worker A's lease ran out meanwhile).
    Run.objects.filter(id=run.id).update(
        lease_owner="worker-b", version=F("version") + 1
    )
    state.transcript.append_user_note("written by a worker that lost the run")
    with pytest.raises(LeaseLost), transaction.atomic():
        stale.checkpoint()
    assert not SessionEntry.objects.filter(run=run).exists()
    # Two writers at the same sequence number: the second insert loses.
    entry = Entry(0, "00000000", None, "label", {"name": "first"})
    session_entries_append(run_id=run.id, entries=[entry])
    with pytest.raises(SessionWriterConflict), transaction.atomic():
        session_entries_append(
            run_id=run.id,
            entries=[
                Entry(1, "00000001", "00000000", "label", {}),
                Entry(0, "00000000", None, "label", {"name": "second"}),
            ],
        )
    assert list(SessionEntry.objects.filter(run=run).values_list("payload")) == [
        ({"name": "first"},)
    ]


def test_the_session_api_shows_entries_and_rebuilds_any_leaf(
    demo_agent, operator_user, drive_run, api_client_for, other_tenant, make_member
):
    run = run_start(
        tenant=demo_agent.tenant,
        agent_slug="kettlecraft-support",
        input="order 4821 arrived damaged",
        started_by=operator_user,
    )
    run = drive_run(run)
    client = api_client_for(operator_user, demo_agent.tenant)
    body = client.get(f"/api/v1/runs/{run.id}/session/").json()
    assert body["leaf"] == run.engine_state["session"]["leaf"]
    assert body["messages"] == run.engine_state["messages"]
    assert [e["seq"] for e in body["entries"]] == list(range(len(body["entries"])))
    assert body["entries"][0]["parentId"] is None
    assert body["entries"][0]["type"] == "message"
    earlier = body["entries"][1]["id"]
    at_two = client.get(f"/api/v1/runs/{run.id}/session/?leaf={earlier}").json()
    assert at_two["context_leaf"] == earlier
    assert at_two["messages"] == run.engine_state["messages"][:2]
    bad = client.get(f"/api/v1/runs/{run.id}/session/?leaf=ffffffff")
    assert bad.status_code == 400 and "leaf" in bad.json()["error"]["fields"]
    malformed = client.get(f"/api/v1/runs/{run.id}/session/?leaf=x")
    assert malformed.status_code == 400
    stranger = api_client_for(make_member(other_tenant, "sam", "admin"), other_tenant)
    assert stranger.get(f"/api/v1/runs/{run.id}/session/").status_code == 404
    assert stranger.get(f"/api/v1/runs/{uuid.uuid4()}/session/").status_code == 404
    assert client.get("/api/v1/runs/not-a-uuid/session/").status_code == 404
