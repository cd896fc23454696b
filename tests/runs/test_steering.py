"""Steering and follow-up messages (issue 28 item 3; spec §1.3 single writer
with a steering queue, scenario 10), with a real Celery worker and the
scripted model, whose `if_message` makes a reply depend on the steering text."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.engine.loop import EngineState
from runs.models import Run, RunMessage, SessionEntry
from runs.services import recover_stalled_runs, run_start
from runs.services.decide import approval_decide
from shop.models import Replacement
from tests.conftest import start_worker, wait_for
from tests.runs.conftest import drive
from tracing.models import RunEvent, Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

GIFT = "Please add gift wrap to the replacement"
REPLACE_THEN_ANSWER = [
    {"tool_calls": [{"id": "c1", "name": "create_replacement",
                     "arguments": {"order_id": "4821", "reason": "dented spout"}}]},
    {"text": "Replacement on its way.",
     "if_message": {"gift wrap": {"text": "Replacement on its way, gift wrap added "
                                          "as you asked."}}},
]  # fmt: skip
HELLO_THEN_FOLLOW_UP = [
    {"text": "Your order 4821 shipped on Monday."},
    {"text": "I do not follow.",
     "if_message": {"refund": {"text": "About your refund: it went out today."}}},
]  # fmt: skip


def settled(run: Run, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.is_settled:  # ended, and its last step's spans are stored
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}, not settled")


def transcript(run: Run) -> list[dict[str, Any]]:
    run.refresh_from_db()
    return EngineState.from_dict(run.engine_state).transcript.messages


def model_inputs(run: Run) -> list[list[dict[str, Any]]]:
    """The messages the model received on each call, from the chat spans."""
    wait_for(
        lambda: not Span.objects.filter(run=run, ended_at__isnull=True).exists(),
        what="every span of the run ended",
    )
    key = "gen_ai.input.messages"
    found = []
    for span, payloads in run_spans_with_payloads(tenant=run.tenant, run_id=run.id):
        if span.name.startswith("chat "):
            found.append((span.started_at, payloads.get(key) or span.attributes[key]))
    return [json.loads(raw) for _, raw in sorted(found, key=lambda pair: pair[0])]


def shape(messages: list[dict[str, Any]]) -> list[str]:
    """Each message as role (and the call id a tool result answers)."""
    out = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            out.append(f"tool:{message['tool_call_id']}")
        elif role == "assistant" and message.get("tool_calls"):
            ids = ",".join(c["id"] for c in message["tool_calls"])
            out.append(f"assistant:{ids}")
        else:
            out.append(role)
    return out


def send(client: Any, run: Run, text: str) -> Any:
    return client.post(f"/api/v1/runs/{run.id}/messages/", {"text": text},
                       format="json")  # fmt: skip


def test_scenario_10_a_message_sent_during_an_approval_lands_after_the_tool_result(
    shop, scripted_agent, operator_user, api_client_for, celery_worker_process
):
    scripted_agent(REPLACE_THEN_ANSWER, ["create_replacement"])
    run = run_start(tenant=shop, agent_slug="scripted", input="My kettle is dented",
                    started_by=operator_user)  # fmt: skip
    approval = wait_for(lambda: ApprovalRequest.objects.filter(run=run).first())
    wait_for(lambda: Run.objects.get(id=run.id).status == "waiting_approval")
    client = api_client_for(operator_user, shop)

    response = send(client, run, GIFT)

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["text"] == GIFT and body["state"] == "queued"
    assert body["author"] == operator_user.username and body["delivered_at"] is None
    # Queued, not delivered: no second loop, and nothing between the call and
    # its (missing) result.
    run.refresh_from_db()
    assert run.status == "waiting_approval"
    assert shape(transcript(run))[-1] == "assistant:c1"
    listed = client.get(f"/api/v1/runs/{run.id}/messages/").json()
    assert [(m["id"], m["state"]) for m in listed] == [(body["id"], "queued")]

    approval_decide(request=approval, decided_by=operator_user, approve=True)
    run = settled(run)

    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert run.final_answer == "Replacement on its way, gift wrap added as you asked."
    assert Replacement.objects.count() == 1
    calls = model_inputs(run)
    assert len(calls) == 2
    assert shape(calls[0]) == ["user"]
    # The exact order of the second call: the tool's result, then the message.
    assert shape(calls[1]) == ["user", "assistant:c1", "tool:c1", "user"]
    assert calls[1][-1]["content"] == GIFT
    message = RunMessage.objects.get(run=run)
    assert message.state == "delivered" and message.delivered_before_step == 1
    entry = SessionEntry.objects.get(run=run, entry_id=message.entry_id)
    assert entry.type == "message"
    assert entry.payload["message"] == {"role": "user", "content": GIFT}
    assert entry.payload["steering"] == {
        "message_id": str(message.id), "author": operator_user.username,
    }  # fmt: skip
    # The trace shows the message in the step that delivered it.
    span = Span.objects.get(run=run, name="steering message")
    assert span.attributes["cp.message.id"] == str(message.id)
    assert span.attributes["cp.message.author"] == operator_user.username
    parent = Span.objects.get(run=run, span_id=span.parent_span_id)
    assert parent.name.startswith("step") or "step" in parent.name, parent.name
    types = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
    assert types.count("message.queued") == 1
    assert types.count("message.delivered") == 1
    listed = client.get(f"/api/v1/runs/{run.id}/messages/").json()
    assert listed[0]["state"] == "delivered"
    assert listed[0]["delivered_before_step"] == 1


def test_a_message_continues_a_succeeded_run_as_a_new_turn(
    tenant, scripted_agent, operator_user, api_client_for, celery_worker_process
):
    scripted_agent(HELLO_THEN_FOLLOW_UP, [])
    run = run_start(tenant=tenant, agent_slug="scripted", input="Where is 4821?",
                    started_by=operator_user)  # fmt: skip
    run = settled(run)
    assert run.status == "unverified" and run.steps == 1
    first_end = run.finished_at
    client = api_client_for(operator_user, tenant)

    response = send(client, run, "And my refund?")

    assert response.status_code == 202, response.content
    run.refresh_from_db()
    assert run.status in ("queued", "running", "unverified")
    run = wait_for(lambda: settled(run) if Run.objects.get(id=run.id).steps == 2
                   else None)  # fmt: skip
    assert run.status == "unverified", (run.stop_reason, run.stop_detail)
    assert run.final_answer == "About your refund: it went out today."
    assert run.finished_at > first_end and run.stop_reason == "done"
    # The model saw the whole earlier conversation plus the new message.
    calls = model_inputs(run)
    assert [m["content"] for m in calls[1]] == [
        "Where is 4821?", "Your order 4821 shipped on Monday.", "And my refund?",
    ]  # fmt: skip
    assert RunMessage.objects.get(run=run).state == "delivered"
    assert RunEvent.objects.filter(run=run, type="run.continued").count() == 1


def test_a_message_is_delivered_once_when_the_worker_dies_before_the_step_writes(
    tenant, scripted_agent, operator_user, api_client_for, tmp_path, settings
):
    """The worker is SIGKILLed after the message went into the step's
    transcript, before the step's write: nothing was committed, so the message
    stays queued; the step taken over delivers it once."""
    settings.RUN_LEASE_SECONDS = 2.0
    lease = {"RUN_LEASE_SECONDS": "2"}
    scripted_agent(HELLO_THEN_FOLLOW_UP, [])
    first = start_worker(
        tmp_path,
        pool="solo",
        extra_env={**lease, "RUN_FAILPOINTS": "after_steering_taken",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    second = None
    try:
        run = run_start(tenant=tenant, agent_slug="scripted", input="Where is 4821?",
                        started_by=operator_user)  # fmt: skip
        run = settled(run)
        response = send(api_client_for(operator_user, tenant), run, "And my refund?")
        assert response.status_code == 202
        wait_for(lambda: first.process.poll() is not None, what="the failpoint")
        assert RunMessage.objects.get(run=run).state == "queued"  # not lost
        second = start_worker(tmp_path, extra_env=lease)
        wait_for(lambda: time.sleep(2.1) or recover_stalled_runs())
        run = wait_for(lambda: settled(run) if Run.objects.get(id=run.id).steps == 2
                       else None)  # fmt: skip
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert run.final_answer == "About your refund: it went out today."
    contents = [m["content"] for m in transcript(run)]
    assert contents.count("And my refund?") == 1
    message = RunMessage.objects.get(run=run)
    assert message.state == "delivered"
    steering = [e for e in SessionEntry.objects.filter(run=run)
                if "steering" in e.payload]  # fmt: skip
    assert [e.entry_id for e in steering] == [message.entry_id]
    delivered = RunEvent.objects.filter(run=run, type="message.delivered")
    assert delivered.count() == 1


def test_a_message_is_not_delivered_again_when_the_step_runs_again(
    tenant, scripted_agent, operator_user, api_client_for, tmp_path, settings
):
    """Killed after the step's write committed (the delivery with it): the step
    taken over finds the message delivered and does not add it again."""
    settings.RUN_LEASE_SECONDS = 2.0
    lease = {"RUN_LEASE_SECONDS": "2"}
    scripted_agent(HELLO_THEN_FOLLOW_UP, [])
    run = run_start(tenant=tenant, agent_slug="scripted", input="Where is 4821?",
                    started_by=operator_user)  # fmt: skip
    run = drive(run)
    assert run.status == "unverified"
    first = start_worker(
        tmp_path,
        pool="solo",
        extra_env={**lease, "RUN_FAILPOINTS": "after_action_persisted",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    second = None
    try:
        response = send(api_client_for(operator_user, tenant), run, "And my refund?")
        assert response.status_code == 202
        wait_for(lambda: first.process.poll() is not None, what="the failpoint")
        assert RunMessage.objects.get(run=run).state == "delivered"
        second = start_worker(tmp_path, extra_env=lease)
        wait_for(lambda: time.sleep(2.1) or recover_stalled_runs())
        run = settled(run)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert run.status == "unverified" and run.steps == 2
    assert run.final_answer == "About your refund: it went out today."
    contents = [m["content"] for m in transcript(run)]
    assert contents.count("And my refund?") == 1
    assert RunEvent.objects.filter(run=run, type="message.delivered").count() == 1


def test_a_message_sent_during_the_final_step_is_answered_before_the_run_ends(
    tenant, scripted_agent, operator_user, api_client_for, tmp_path
):
    """Sent while the step that gives the final answer runs (held after its
    action was written): the message is queued, not lost, and the step goes on
    to a next turn that answers it instead of ending the run."""
    scripted_agent(HELLO_THEN_FOLLOW_UP, [])
    where = "after_action_persisted"
    worker = start_worker(
        tmp_path,
        extra_env={"RUN_FAILPOINTS": where, "RUN_FAILPOINT_ACTION": "pause",
                   "RUN_FAILPOINT_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        run = run_start(tenant=tenant, agent_slug="scripted", input="Where is 4821?",
                        started_by=operator_user)  # fmt: skip
        wait_for((tmp_path / f"failpoint-{where}").exists, what="the failpoint")
        run.refresh_from_db()
        assert run.status == "running"
        response = send(api_client_for(operator_user, tenant), run, "And my refund?")
        assert response.status_code == 202
        assert response.json()["state"] == "queued"
        (tmp_path / f"failpoint-{where}.resume").touch()
        run = wait_for(lambda: settled(run) if Run.objects.get(id=run.id).steps == 2
                       else None)  # fmt: skip
    finally:
        worker.stop()
    assert run.status == "unverified" and run.steps == 2
    assert run.final_answer == "About your refund: it went out today."
    assert [m["role"] for m in transcript(run)][-3:] == [
        "assistant",
        "user",
        "assistant",
    ]
    assert RunMessage.objects.get(run=run).delivered_before_step == 1
    # It never ended in between: no continuation was needed.
    assert not RunEvent.objects.filter(run=run, type="run.continued").exists()
