"""Flagged runs API: the runs a guardrail stopped (it tripped, or could not
run and failed closed), for a person to look at; listed in the approvals inbox
until someone marks them reviewed (docs/api.md, Reviews)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import (
    BoundedPagination,
    query_params,
    reject_unknown_fields,
    remote_addr,
)
from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedCharField
from controlplane.tenancy import tenant_of
from runs import selectors
from runs.models import RunReview
from runs.services.reviews import ReviewAlreadyDone, run_review_mark_reviewed


class RunReviewSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    run = serializers.UUIDField(source="run_id")
    agent = serializers.CharField(source="run.agent.slug")
    input = RedactedCharField(source="run.input")
    final_answer = RedactedCharField(source="run.final_answer")
    stop_reason = serializers.CharField(source="run.stop_reason")
    guardrail = serializers.CharField()
    stage = serializers.CharField()
    verdict = serializers.CharField()
    reason = RedactedCharField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    reviewed_by = serializers.CharField(source="reviewed_by.username", allow_null=True)
    reviewed_at = serializers.DateTimeField(allow_null=True)


class RunReviewListApi(APIView):
    gate: Gate = {"GET": Action.APPROVAL_READ}
    pagination_class = BoundedPagination

    class QuerySerializer(serializers.Serializer[Any]):
        status = serializers.ChoiceField(
            choices=RunReview.Status.values, required=False, allow_blank=True
        )

    @extend_schema(
        parameters=[QuerySerializer], responses=RunReviewSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        wanted = query_params(request, self.QuerySerializer)
        reviews = selectors.run_review_list_for(
            tenant=context.tenant, status=wanted.get("status") or None
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(reviews, request, view=self)
        return paginator.get_paginated_response(
            RunReviewSerializer(page, many=True).data
        )


class RunReviewDoneApi(APIView):
    gate: Gate = {"POST": Action.APPROVAL_DECIDE}

    @extend_schema(
        request=None,
        responses={200: RunReviewSerializer, 409: ErrorSerializer},
        description="Mark the flagged run reviewed; 409 if someone already did.",
    )
    def post(self, request: Request, review_id: str) -> Response:
        reject_unknown_fields(request, set())
        context = tenant_of(request)
        review = get_object_or_404(
            selectors.run_review_list_for(tenant=context.tenant), id=review_id
        )
        try:
            review = run_review_mark_reviewed(
                review=review, actor=context.user, remote_addr=remote_addr(request)
            )
        except ReviewAlreadyDone as done:
            return Response(
                {
                    "detail": str(done),
                    "review": RunReviewSerializer(done.review).data,
                },
                status=status.HTTP_409_CONFLICT,
            )
        return Response(RunReviewSerializer(review).data)
