"""Questions to a person (issue 28 item 4), through a real Celery worker on the
scripted model: `ask_human` parks the run in `waiting_input` holding no worker;
the answer (POST /api/v1/questions/<id>/answer/) becomes the call's observation
and the run resumes; every refused answer changes nothing; an expired question
tells the model no answer came."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import Question
from controlplane.models import AuditEvent
from runs.models import Run, ToolCall
from runs.services import run_cancel, run_start
from runs.services.questions import questions_expire
from tests.conftest import WorkerProcess, start_worker, wait_for
from tracing.models import RunEvent, Span
from tracing.selectors import run_spans_with_payloads

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

ASK = {
    "text": "I need to know which colour the customer wants.",
    "tool_calls": [
        {
            "id": "call_ask",
            "name": "ask_human",
            "arguments": {
                "question": "Which colour should the replacement kettle be?",
                "choices": ["red", "steel"],
            },
        }
    ],
}
ASK_FREE = {
    "tool_calls": [
        {
            "id": "call_ask",
            "name": "ask_human",
            "arguments": {"question": "What is the customer's new address?"},
        }
    ]
}
ANSWER = {
    "text": "The person chose {{call_ask.answer}}: a {{call_ask.answer}} kettle "
    "is on its way.",
    "on_error": {"call_ask": {"text": "Nobody answered; I will ask the customer."}},
}


@pytest.fixture
def worker(tmp_path: Path, transactional_db: Any) -> Iterator[WorkerProcess]:
    """The only worker: one process."""
    started = start_worker(tmp_path, concurrency=1)
    yield started
    started.stop()


def settled(run: Run, timeout: float = 60) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.id} still {run.status}")


def waiting(run: Run) -> Question:
    wait_for(
        lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING_INPUT,
        what="the run waiting for an answer",
    )
    run.refresh_from_db()
    return Question.objects.get(run=run)


def start(agent: Any, user: Any, text: str = "Order 4821 is damaged") -> Run:
    return run_start(
        tenant=agent.tenant, agent_slug=agent.slug, input=text, started_by=user
    )


def model_inputs(run: Run) -> list[list[dict[str, Any]]]:
    """What the model received on each call (the chat spans' input messages)."""
    wait_for(
        lambda: not Span.objects.filter(run=run, ended_at__isnull=True).exists(),
        what="every span of the run ended",
    )
    key = "gen_ai.input.messages"
    return [
        json.loads(payloads.get(key) or span.attributes[key])
        for span, payloads in run_spans_with_payloads(tenant=run.tenant, run_id=run.id)
        if span.name.startswith("chat ")
    ]


def answer_url(question: Question) -> str:
    return f"/api/v1/questions/{question.id}/answer/"


def test_ask_waits_holding_no_worker_and_the_answer_is_the_observation(
    scripted_agent, operator_user, api_client_for, worker
):
    agent = scripted_agent([ASK, ANSWER], ["ask_human"])
    run = start(agent, operator_user)
    question = waiting(run)
    assert question.question == "Which colour should the replacement kettle be?"
    assert question.choices == ["red", "steel"]
    assert question.status == Question.Status.PENDING
    assert question.tool_call.call_id == "call_ask"
    assert question.tool_call.status == ToolCall.Status.WAITING_INPUT
    assert run.lease_owner == "" and run.step_token is None
    # The only worker is free: another run goes from start to end meanwhile.
    other = scripted_agent([{"text": "Done."}], [], slug="other")
    assert settled(start(other, operator_user)).status == Run.Status.UNVERIFIED
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_INPUT
    # Pending, it is listed; the trace shows the question on the call's span.
    client = api_client_for(operator_user, run.tenant)
    listed = client.get("/api/v1/questions/?state=pending").json()["results"]
    assert [q["id"] for q in listed] == [str(question.id)]
    assert listed[0]["question"] == question.question
    span = wait_for(
        lambda: Span.objects.filter(run=run, name="execute_tool ask_human").first(),
        what="the question's span",
    )
    assert span.attributes["cp.question.text"] == question.question
    assert span.attributes["cp.question.status"] == "pending"
    assert span.ended_at is None

    response = client.post(answer_url(question), {"answer": "steel"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["answered_by"] == operator_user.username
    run = settled(run)
    assert run.status == Run.Status.UNVERIFIED, run.stop_detail
    assert run.final_answer == "The person chose steel: a steel kettle is on its way."
    _, second = model_inputs(run)
    result = next(m for m in second if m["role"] == "tool")
    assert result["tool_call_id"] == "call_ask"
    assert json.loads(result["content"])["data"]["answer"] == "steel"
    span.refresh_from_db()
    assert span.ended_at is not None
    assert span.attributes["cp.question.answer"] == "steel"
    assert span.attributes["cp.question.answered_by"] == operator_user.username
    types = list(
        RunEvent.objects.filter(run_id=run.id, type__startswith="question.")
        .order_by("seq")
        .values_list("type", flat=True)
    )
    assert types == ["question.asked", "question.answered"]


def _unchanged(question: Question, run: Run, *, run_status: bool = True) -> Any:
    before = Question.objects.get(id=question.id)
    status = Run.objects.get(id=run.id).status
    audits = AuditEvent.objects.filter(object_type="question").count()

    def check() -> None:
        after = Question.objects.get(id=question.id)
        assert (after.status, after.answer, after.answered_by_id) == (
            before.status,
            before.answer,
            before.answered_by_id,
        )
        if run_status:  # an answered run goes on meanwhile
            assert Run.objects.get(id=run.id).status == status
        assert AuditEvent.objects.filter(object_type="question").count() == audits

    return check


def test_refused_answers_change_nothing(
    scripted_agent,
    operator_user,
    viewer_user,
    other_tenant,
    make_member,
    api_client_for,
    worker,
):
    agent = scripted_agent([ASK, ANSWER], ["ask_human"])
    run = start(agent, operator_user)
    question = waiting(run)
    operator = api_client_for(operator_user, run.tenant)
    unchanged = _unchanged(question, run)
    url = answer_url(question)

    viewer = api_client_for(viewer_user, run.tenant)
    assert viewer.post(url, {"answer": "red"}, format="json").status_code == 403
    unchanged()
    stranger = make_member(other_tenant, "olga-other", "operator")
    elsewhere = api_client_for(stranger, other_tenant)
    assert elsewhere.post(url, {"answer": "red"}, format="json").status_code == 404
    assert elsewhere.get("/api/v1/questions/").json()["results"] == []
    unchanged()
    for body in ({"answer": "blue"}, {"answer": "r" * 10_001}, {"answer": ""}, {}):
        response = operator.post(url, body, format="json")
        assert response.status_code == 400, body
        assert "answer" in json.dumps(response.json()), response.json()
        unchanged()
    response = operator.post(url, {"answer": "red", "who": "me"}, format="json")
    assert response.status_code == 400
    unchanged()

    assert operator.post(url, {"answer": "red"}, format="json").status_code == 200
    answered = _unchanged(question, run, run_status=False)
    admin = make_member(run.tenant, "ada-admin", "admin")
    second = api_client_for(admin, run.tenant).post(
        url, {"answer": "steel"}, format="json"
    )
    assert second.status_code == 409
    assert operator_user.username in second.json()["error"]["message"]
    assert second.json()["error"]["question"]["answer"] == "red"
    answered()
    run = settled(run)
    assert run.final_answer.startswith("The person chose red")


def test_an_expired_question_tells_the_model_no_answer_came(
    scripted_agent, operator_user, api_client_for, worker
):
    agent = scripted_agent([ASK_FREE, ANSWER], ["ask_human"])
    run = start(agent, operator_user)
    question = waiting(run)
    assert questions_expire() == 0  # not due yet
    later = timezone.now() + dt.timedelta(days=2)
    assert questions_expire(now=later) == 1
    run = settled(run)
    assert run.final_answer == "Nobody answered; I will ask the customer."
    question.refresh_from_db()
    assert question.status == Question.Status.EXPIRED and question.answer == ""
    call = ToolCall.objects.get(run=run, call_id="call_ask")
    assert call.status == ToolCall.Status.FAILED
    assert call.result["error"]["code"] == "ETIMEDOUT"
    assert "No answer came" in call.result["error"]["message"]
    # An answer after the expiry is refused and changes nothing.
    unchanged = _unchanged(question, run)
    response = api_client_for(operator_user, run.tenant).post(
        answer_url(question), {"answer": "12 Elm Street"}, format="json"
    )
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "expired"
    assert "expired" in response.json()["error"]["message"]
    unchanged()


def test_an_answer_after_the_time_to_live_expires_it_and_is_refused(
    scripted_agent, operator_user, api_client_for, worker
):
    agent = scripted_agent([ASK_FREE, ANSWER], ["ask_human"])
    run = start(agent, operator_user)
    question = waiting(run)
    Question.objects.filter(id=question.id).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    response = api_client_for(operator_user, run.tenant).post(
        answer_url(question), {"answer": "12 Elm Street"}, format="json"
    )
    assert response.status_code == 410
    question.refresh_from_db()
    assert question.status == Question.Status.EXPIRED and question.answer == ""
    # As the sweep would have: the run resumes without an answer.
    assert settled(run).final_answer == "Nobody answered; I will ask the customer."


def test_cancelling_a_waiting_run_cancels_its_question(
    scripted_agent, operator_user, api_client_for, worker
):
    agent = scripted_agent([ASK, ANSWER], ["ask_human"])
    run = start(agent, operator_user)
    question = waiting(run)
    run_cancel(run=run, actor=operator_user)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    question.refresh_from_db()
    assert question.status == Question.Status.CANCELLED
    call = ToolCall.objects.get(run=run, call_id="call_ask")
    assert call.status == ToolCall.Status.CANCELLED
    unchanged = _unchanged(question, run)
    response = api_client_for(operator_user, run.tenant).post(
        answer_url(question), {"answer": "red"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "cancelled"
    unchanged()
