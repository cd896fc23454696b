"""Answer a question to a person; the run resumes with the answer as the
call's observation (runs/services/questions.py)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import selectors
from approvals.models import Question
from approvals.questions import QuestionClosed, QuestionInputError
from approvals.questions_api import QuestionConflictSerializer, QuestionSerializer
from controlplane.api_input import reject_unknown_fields
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.services.questions import question_answer

_CLOSED_CODES: dict[str, str] = {
    Question.Status.ANSWERED: "already_answered",
    Question.Status.EXPIRED: "expired",
    Question.Status.CANCELLED: "cancelled",
}


class QuestionAnswerApi(APIView):
    gate: Gate = {"POST": Action.APPROVAL_DECIDE}

    class AnswerInputSerializer(serializers.Serializer[Any]):
        # Its length and the question's choices are checked by the service, so
        # that every refusal names `answer` the same way.
        answer = serializers.JSONField()

    @extend_schema(
        request=AnswerInputSerializer,
        responses={
            200: QuestionSerializer,
            409: QuestionConflictSerializer,
            410: QuestionConflictSerializer,
        },
    )
    def post(self, request: Request, question_id: str) -> Response:
        context = tenant_of(request)
        question = get_object_or_404(
            selectors.question_list_for(tenant=context.tenant), id=question_id
        )
        reject_unknown_fields(request, {"answer"})
        body = self.AnswerInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            answered = question_answer(
                question=question,
                answered_by=context.user,
                answer=body.validated_data["answer"],
            )
        except QuestionInputError as invalid:
            raise ValidationError({invalid.field: [str(invalid)]}) from None
        except QuestionClosed as closed:
            current = selectors.question_list_for(tenant=context.tenant).get(
                id=question.id
            )
            return Response(
                {
                    "error": {
                        "code": _CLOSED_CODES.get(
                            closed.question.status, "already_answered"
                        ),
                        "message": str(closed),
                        "question": QuestionSerializer(current).data,
                    }
                },
                status=status.HTTP_410_GONE
                if closed.expired
                else status.HTTP_409_CONFLICT,
            )
        fresh = selectors.question_list_for(tenant=context.tenant).get(id=answered.id)
        return Response(QuestionSerializer(fresh).data)
