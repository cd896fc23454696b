"""Questions API reads: list and read the tenant's questions to a person.

Answering resumes the run, so it lives in `runs` (runs/questions_api.py), at
the same prefix.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals import selectors
from approvals.models import Question
from controlplane.api_input import BoundedPagination, query_params
from controlplane.api_schema import ErrorDetailSerializer
from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedCharField
from controlplane.tenancy import tenant_of


class QuestionSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    run = serializers.UUIDField(source="run_id")
    run_status = serializers.CharField(source="run.status")
    agent = serializers.CharField(source="run.agent.slug")
    tool_call_id = serializers.CharField(source="tool_call.call_id")
    tool = serializers.CharField(source="tool_call.tool_name")
    question = RedactedCharField()
    choices = serializers.ListField(child=serializers.CharField())
    schema = serializers.JSONField(allow_null=True)
    status = serializers.CharField()
    answer = RedactedCharField()
    answered_by = serializers.CharField(
        source="answered_by.username", allow_null=True, default=None
    )
    answered_at = serializers.DateTimeField(allow_null=True)
    asked_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()


class QuestionConflictDetailSerializer(ErrorDetailSerializer):
    question = QuestionSerializer()


class QuestionConflictSerializer(serializers.Serializer[Any]):
    """409 (answered or cancelled already) or 410 (expired): `question` is as it
    is now."""

    error = QuestionConflictDetailSerializer()


class QuestionListApi(APIView):
    gate: Gate = {"GET": Action.APPROVAL_READ}
    pagination_class = BoundedPagination

    class QuestionListQuerySerializer(serializers.Serializer[Any]):
        state = serializers.ChoiceField(
            choices=Question.Status.values, required=False, allow_blank=True
        )
        run = serializers.UUIDField(required=False, help_text="a run's id")

    @extend_schema(
        parameters=[QuestionListQuerySerializer],
        responses=QuestionSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        wanted = query_params(request, self.QuestionListQuerySerializer)
        questions = selectors.question_list_for(
            tenant=context.tenant, status=wanted.get("state"), run_id=wanted.get("run")
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(questions, request, view=self)
        return paginator.get_paginated_response(
            QuestionSerializer(page, many=True).data
        )


class QuestionDetailApi(APIView):
    gate: Gate = {"GET": Action.APPROVAL_READ}

    @extend_schema(responses=QuestionSerializer)
    def get(self, request: Request, question_id: str) -> Response:
        context = tenant_of(request)
        question = get_object_or_404(
            selectors.question_list_for(tenant=context.tenant), id=question_id
        )
        return Response(QuestionSerializer(question).data)
