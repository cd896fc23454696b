"""Questions to a person: the run waits in `waiting_input`, holding no worker.

An `ask_human` call opens a Question (approvals.questions) instead of running a
handler; the step ends and the run waits, as it does for an approval. An answer
(POST /api/v1/questions/<id>/answer/) or the expiry sweep ends the wait: the run
is queued again, and its next step records the answer (or word that none came)
as the call's observation, so the model's next call sees it as the tool result.
An expired question is answered like an expired approval is: the model gets an
error observation (`ETIMEDOUT`, "no answer came") and the run goes on.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals.models import Question
from approvals.questions import (
    QuestionClosed,
    question_answer_record,
    question_expire,
    question_open,
)
from approvals.selectors import questions_due
from runs.engine.actions import ToolCall
from runs.engine.contracts import ToolSource
from runs.engine.envelope import ErrorCode, ToolResult
from runs.engine.tools import Tool
from runs.models import Run
from runs.models import ToolCall as ToolCallRow
from runs.services.dispatch import step_enqueue
from runs.spans import question_span_open, question_span_settle
from runs.tools.ask_human import ASK_HUMAN


def is_question_call(tool: Tool) -> bool:
    """Whether the call is answered by a person rather than executed: the
    built-in `ask_human` (an MCP tool of the same model-visible name is not)."""
    return tool.name == ASK_HUMAN and tool.contract.source is ToolSource.BUILTIN


def question_ask(
    *,
    run: Run,
    row: ToolCallRow,
    call: ToolCall,
    elicited: dict[str, Any] | None = None,
) -> Question:
    """Open the call's question and mark the call waiting (in the caller's
    transaction, which also parks the run in `waiting_input`): an ask_human
    call's, or what an MCP server asked during the call (`elicited`: its
    message and requested schema)."""
    if elicited is not None:
        question = question_open(
            tenant_id=run.tenant_id,
            tool_call=row,
            kind=Question.Kind.ELICITATION,
            question=str(elicited.get("message") or ""),
            schema=elicited.get("schema"),
        )
    else:
        choices = call.arguments.get("choices")
        question = question_open(
            tenant_id=run.tenant_id,
            tool_call=row,
            kind=Question.Kind.ASK_HUMAN,
            question=str(call.arguments.get("question", "")),
            choices=[str(c) for c in choices] if isinstance(choices, list) else [],
        )
    ToolCallRow.objects.filter(id=row.id).update(
        status=ToolCallRow.Status.WAITING_INPUT
    )
    question_span_open(run, tool_call=row, question=question)
    return question


@dataclass(frozen=True)
class QuestionOutcome:
    """What the waiting call does now: wait on (`pending`), record `result` as
    its observation, or run again (`rerun`: an MCP server's question was
    answered, and the re-run call gives it the answer)."""

    pending: bool = False
    result: ToolResult | None = None
    rerun: bool = False


def question_outcome_for(*, run: Run, row: ToolCallRow) -> QuestionOutcome:
    """The call's latest question: still waiting, answered, or not answered."""
    question = (
        Question.objects.filter(tool_call_id=row.id)
        .select_related("answered_by")
        .order_by("-asked_at")
        .first()
    )
    if question is None or question.status == Question.Status.PENDING:
        return QuestionOutcome(pending=True)
    result = _observation(question)
    question_span_settle(run, tool_call=row, question=question, result=result)
    if result.ok and question.kind == Question.Kind.ELICITATION:
        return QuestionOutcome(rerun=True)
    return QuestionOutcome(result=result)


def _observation(question: Question) -> ToolResult:
    if question.status == Question.Status.ANSWERED:
        result = ToolResult.success(
            {"question": question.question, "answer": question.answer}
        )
    else:
        result = ToolResult.failure(
            ErrorCode.ETIMEDOUT,
            f"No answer came: the question {question.status} before anyone "
            "answered it. Go on without the answer, or end and say what is "
            "still open.",
            retryable=False,
        )
    return result


def run_resume_after_question(*, run_id: Any) -> bool:
    """The question is final: queue the run's next step (it held nothing)."""
    updated = Run.objects.filter(id=run_id, status=Run.Status.WAITING_INPUT).update(
        status=Run.Status.QUEUED, version=F("version") + 1
    )
    if updated:
        step_enqueue(Run.objects.get(id=run_id))
    return bool(updated)


def question_answer(*, question: Question, answered_by: User, answer: Any) -> Question:
    """Record a person's answer and resume the run.

    Raises QuestionInputError (a malformed answer) or QuestionClosed (answered,
    expired or cancelled already), writing nothing; a question found past its
    time-to-live is expired now (committed, the run resumes without an answer)
    and QuestionClosed raised.
    """
    with transaction.atomic():
        try:
            answered = question_answer_record(
                question=question, answered_by=answered_by, answer=answer
            )
        except QuestionClosed as closed:
            if closed.question.status != Question.Status.PENDING:
                raise
            expired = question_expire(question=closed.question, now=timezone.now())
            if expired:
                run_resume_after_question(run_id=closed.question.run_id)
            late = QuestionClosed(Question.objects.get(id=question.id))
        else:
            run_resume_after_question(run_id=answered.run_id)
            return answered
    raise late


def questions_expire(*, now: dt.datetime | None = None, limit: int = 500) -> int:
    """Expire pending questions past their time-to-live and resume their runs
    (the model is told no answer came); returns how many."""
    now = now or timezone.now()
    expired = 0
    for question in questions_due(now=now, limit=limit):
        with transaction.atomic():
            if question_expire(question=question, now=now):
                run_resume_after_question(run_id=question.run_id)
                expired += 1
    return expired
