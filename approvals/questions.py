"""Open, answer, expire and cancel questions to a person; every change is CAS.

A question is answered once: the answer's UPDATE is conditional on `pending`
(and on the time-to-live), so two answers, or an answer racing the expiry task,
give one outcome. This app stores and announces; `runs` resumes the waiting run
(runs/services/questions.py), as it does after an approval (STYLE.md 21).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from approvals.models import Question
from controlplane.services import audit_record
from tracing.services import RunIds, run_event_append

ANSWER_MAX_CHARS = 10_000


class QuestionInputError(ValueError):
    """The answer is malformed; nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class QuestionClosed(Exception):
    """The question is no longer pending; carries it as it is now."""

    def __init__(self, question: Question) -> None:
        if question.status == Question.Status.ANSWERED:
            who = question.answered_by.get_username() if question.answered_by else "?"
            message = f"the question was already answered by {who}"
        elif question.status == Question.Status.EXPIRED:
            message = "the question expired before it was answered"
        else:
            message = f"the question is {question.status}"
        super().__init__(message)
        self.question = question

    @property
    def expired(self) -> bool:
        return self.question.status == Question.Status.EXPIRED


def question_event_view(question: Question) -> dict[str, Any]:
    """What the run's event log and the streams say about a question."""
    return {
        "question_id": str(question.id),
        "kind": question.kind,
        "tool_call_id": question.tool_call.call_id,
        "tool": question.tool_call.tool_name,
        "question": question.question,
        "choices": question.choices,
        "status": question.status,
        "answer": question.answer if question.answered_by_id else "",
        "answered_by": question.answered_by.get_username()
        if question.answered_by
        else None,
        "expires_at": question.expires_at.isoformat(),
    }


def _announce(question: Question, action: str, before: str | None) -> None:
    audit_record(
        tenant=question.tenant,
        actor=question.answered_by if action == "question.answer" else None,
        action=action,
        object_type="question",
        object_id=str(question.id),
        before=None if before is None else {"status": before},
        after={"status": question.status, "run": str(question.run_id)},
    )
    event = {
        "question.ask": "question.asked",
        "question.answer": "question.answered",
        "question.expire": "question.expired",
        "question.cancel": "question.cancelled",
    }[action]
    run = RunIds(pk=question.run_id, tenant_id=question.tenant_id)
    run_event_append(run=run, type=event, payload=question_event_view(question))


@transaction.atomic
def question_open(
    *,
    tenant_id: Any,
    tool_call: Any,
    kind: str,
    question: str,
    choices: list[str] | None = None,
    schema: dict[str, Any] | None = None,
) -> Question:
    """Ask `question` about `tool_call` (its pending one if already asked)."""
    asked = Question.objects.filter(
        tool_call_id=tool_call.id, status=Question.Status.PENDING
    ).first()
    if asked is not None:
        return asked
    ttl = int(settings.APPROVAL_DEFAULT_TTL_SECONDS)
    row = Question.objects.create(
        tenant_id=tenant_id,
        run_id=tool_call.run_id,
        tool_call=tool_call,
        kind=kind,
        question=question,
        choices=list(choices or elicitation_choices(schema)),
        schema=schema,
        expires_at=timezone.now() + dt.timedelta(seconds=ttl),
    )
    _announce(row, "question.ask", None)
    return row


def _single_field(schema: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    properties = (schema or {}).get("properties")
    if isinstance(properties, dict) and len(properties) == 1:
        ((name, field),) = properties.items()
        return str(name), field if isinstance(field, dict) else {}
    return None


def elicitation_choices(schema: dict[str, Any] | None) -> list[str]:
    """The answers a person picks from, for a one-field form: a boolean's
    `true`/`false`, or the field's `enum`; empty for free text."""
    single = _single_field(schema)
    if single is None:
        return []
    field = single[1]
    if field.get("type") == "boolean":
        return ["true", "false"]
    enum = field.get("enum")
    return [str(v) for v in enum] if isinstance(enum, list) else []


def elicitation_content(schema: dict[str, Any] | None, answer: str) -> dict[str, Any]:
    """The form content a person's answer gives an MCP server: a one-field
    form takes the answer as that field (typed as the schema says); a larger
    one takes a JSON object of its fields. Raises QuestionInputError."""
    single = _single_field(schema)
    if single is not None:
        name, field = single
        kind = field.get("type")
        try:
            if kind == "boolean":
                if answer not in ("true", "false"):
                    raise ValueError("answer true or false")
                return {name: answer == "true"}
            if kind == "integer":
                return {name: int(answer)}
            if kind == "number":
                return {name: float(answer)}
        except ValueError:
            raise QuestionInputError("answer", f"answer must be a {kind}") from None
        return {name: answer}
    try:
        content = json.loads(answer)
    except json.JSONDecodeError:
        content = None
    properties = (schema or {}).get("properties") or {}
    if not isinstance(content, dict) or not set(content) <= set(properties):
        raise QuestionInputError(
            "answer", f"answer must be a JSON object of the fields {sorted(properties)}"
        )
    missing = set((schema or {}).get("required") or []) - set(content)
    if missing:
        raise QuestionInputError("answer", f"answer lacks the fields {sorted(missing)}")
    return content


def _check_answer(question: Question, answer: Any) -> str:
    if not isinstance(answer, str) or not answer.strip():
        raise QuestionInputError("answer", "answer must be a non-empty string")
    if len(answer) > ANSWER_MAX_CHARS:
        raise QuestionInputError(
            "answer", f"answer must be at most {ANSWER_MAX_CHARS} characters"
        )
    if question.choices and answer not in question.choices:
        raise QuestionInputError(
            "answer", f"answer must be one of the choices: {question.choices}"
        )
    if question.kind == Question.Kind.ELICITATION:
        elicitation_content(question.schema, answer)  # the server can take it
    return answer


@transaction.atomic
def question_answer_record(
    *, question: Question, answered_by: User, answer: Any
) -> Question:
    """Record the answer (CAS on `pending`, within the time-to-live).

    Raises QuestionInputError (nothing written) for a malformed answer, and
    QuestionClosed for a question already answered, expired or cancelled. A
    pending question past its time-to-live is expired here (as the sweep would)
    and QuestionClosed raised: the caller ends the run's wait in this
    transaction and re-raises after it commits.
    """
    current = Question.objects.select_related("answered_by").get(id=question.id)
    if current.status != Question.Status.PENDING:
        raise QuestionClosed(current)
    text = _check_answer(current, answer)
    now = timezone.now()
    updated = Question.objects.filter(
        id=question.id, status=Question.Status.PENDING, expires_at__gt=now
    ).update(
        status=Question.Status.ANSWERED,
        answer=text,
        answered_by=answered_by,
        answered_at=now,
    )
    fresh = Question.objects.select_related("answered_by", "tool_call").get(
        id=question.id
    )
    if not updated:
        raise QuestionClosed(fresh)
    _announce(fresh, "question.answer", Question.Status.PENDING)
    return fresh


def question_expire(*, question: Question, now: dt.datetime) -> bool:
    """Pending → expired; False if it is final already. The caller resumes."""
    updated = Question.objects.filter(
        id=question.id, status=Question.Status.PENDING
    ).update(status=Question.Status.EXPIRED, answered_at=now)
    if not updated:
        return False
    question.refresh_from_db()
    _announce(question, "question.expire", Question.Status.PENDING)
    return True


def questions_cancel_for_run(*, run_id: Any) -> int:
    """Cancelling a run cancels its pending questions (no resume)."""
    cancelled = 0
    for question in Question.objects.filter(
        run_id=run_id, status=Question.Status.PENDING
    ).select_related("tool_call", "tenant"):
        updated = Question.objects.filter(
            id=question.id, status=Question.Status.PENDING
        ).update(status=Question.Status.CANCELLED, answered_at=timezone.now())
        if updated:
            question.status = Question.Status.CANCELLED
            _announce(question, "question.cancel", Question.Status.PENDING)
        cancelled += updated
    return cancelled
