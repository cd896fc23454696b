"""Eval run reads across runs: a suite's eval runs (to choose one to compare
with) and the comparison of two eval runs of a suite (docs/evals.md "Comparing
two eval runs"; docs/api.md). Every member reads them (`eval.read`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_errors import error_body
from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.evals import selectors
from runs.evals.comparison import EvalComparisonRefused, eval_run_comparison
from runs.evals.history import eval_run_headline, eval_runs_of_suite

SUITE_RUNS_LIMIT = 50


class EvalRunIdentitySerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    agent = serializers.CharField(help_text="The agent's slug or external name.")
    version = serializers.IntegerField(
        allow_null=True, help_text="Null for an agent that runs outside."
    )
    external = serializers.BooleanField()
    k = serializers.IntegerField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class EvalRunHeadlineSerializer(EvalRunIdentitySerializer):
    created_by = serializers.CharField(allow_null=True)
    pass_at_1 = serializers.FloatField(allow_null=True)
    pass_at_1_low = serializers.FloatField(allow_null=True)
    pass_at_1_high = serializers.FloatField(allow_null=True)
    pass_at_k = serializers.FloatField(allow_null=True)
    pass_hat_k = serializers.FloatField(allow_null=True)
    trials = serializers.IntegerField(allow_null=True)
    mean_cost = serializers.CharField(allow_null=True)


class EvalSuiteRunListApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ}

    @extend_schema(
        responses={200: EvalRunHeadlineSerializer(many=True), 404: ErrorSerializer},
        description=f"The suite's {SUITE_RUNS_LIMIT} newest eval runs, with "
        "their figures once finished.",
    )
    def get(self, request: Request, slug: str) -> Response:
        tenant = tenant_of(request).tenant
        suite = selectors.eval_suite_get_for(tenant=tenant, slug=slug)
        if suite is None:
            raise NotFound("No such eval suite in this tenant.")
        runs = eval_runs_of_suite(tenant=tenant, suite=suite)[:SUITE_RUNS_LIMIT]
        return Response(
            EvalRunHeadlineSerializer(
                [eval_run_headline(r) for r in runs], many=True
            ).data
        )


class IntervalSerializer(serializers.Serializer[Any]):
    low = serializers.FloatField()
    high = serializers.FloatField()
    confidence = serializers.FloatField()


class MetricDeltaSerializer(serializers.Serializer[Any]):
    before = serializers.FloatField(help_text="mean over the compared cases")
    after = serializers.FloatField()
    delta = serializers.FloatField(help_text="after − before")
    interval = IntervalSerializer(
        allow_null=True,
        help_text="paired interval of the delta; null when one case cannot show it",
    )


class MetricDeltasSerializer(serializers.Serializer[Any]):
    pass_at_1 = MetricDeltaSerializer()
    pass_at_k = MetricDeltaSerializer()
    pass_hat_k = MetricDeltaSerializer()
    cost = MetricDeltaSerializer(help_text="mean cost per trial")
    latency_ms = MetricDeltaSerializer(help_text="mean latency per trial")
    tokens = MetricDeltaSerializer()
    steps = MetricDeltaSerializer()


class ComparedRunSerializer(EvalRunIdentitySerializer):
    trials = serializers.IntegerField()
    passed = serializers.IntegerField()


class DiffPairSerializer(serializers.Serializer[Any]):
    before_run = serializers.UUIDField()
    after_run = serializers.UUIDField()


class FlipSerializer(serializers.Serializer[Any]):
    case = serializers.CharField()
    direction = serializers.ChoiceField(choices=["regressed", "fixed"])
    before_pass_at_1 = serializers.FloatField()
    after_pass_at_1 = serializers.FloatField()
    diff = DiffPairSerializer(
        allow_null=True,
        help_text="the two trial runs to diff (/runs/<before_run>/diff/<after_run>/):"
        " a passing and a failing one; null when a trial's run was deleted",
    )


class CaseTrialSerializer(serializers.Serializer[Any]):
    index = serializers.IntegerField()
    run = serializers.UUIDField(allow_null=True)
    passed = serializers.BooleanField()
    status = serializers.CharField()


class CaseSideSerializer(serializers.Serializer[Any]):
    passed = serializers.IntegerField()
    trials = serializers.IntegerField()
    pass_at_1 = serializers.FloatField()
    runs = CaseTrialSerializer(many=True)


class ComparedCaseSerializer(serializers.Serializer[Any]):
    case = serializers.CharField()
    before = CaseSideSerializer()
    after = CaseSideSerializer()
    flip = serializers.ChoiceField(choices=["regressed", "fixed"], allow_null=True)


class EvalComparisonSerializer(serializers.Serializer[Any]):
    suite = serializers.CharField()
    before = ComparedRunSerializer()
    after = ComparedRunSerializer()
    k = serializers.IntegerField(help_text="the smaller k of the two runs")
    confidence = serializers.FloatField()
    power = serializers.FloatField()
    flip_threshold = serializers.FloatField()
    trials_per_case = serializers.IntegerField()
    cases_compared = serializers.IntegerField()
    cases_added = serializers.ListField(child=serializers.CharField())
    cases_removed = serializers.ListField(child=serializers.CharField())
    flips = FlipSerializer(many=True)
    metrics = MetricDeltasSerializer()
    minimum_detectable_difference = serializers.FloatField()
    warning = serializers.CharField(allow_null=True)
    cases = ComparedCaseSerializer(many=True)


class EvalRunCompareApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ}

    @extend_schema(
        responses={
            200: EvalComparisonSerializer,
            400: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="Compare eval run `other_id` (after) with `eval_run_id` "
        "(before), both finished runs of one suite: per-case flips with the two "
        "trial runs to diff, pass@1 / pass@k / pass^k deltas with their paired "
        "intervals, cost, latency, token and step deltas, and the small-sample "
        "warning. 404 names the side that is not the tenant's; runs of two "
        "suites are 400; a run not finished is 409.",
    )
    def get(self, request: Request, eval_run_id: str, other_id: str) -> Response:
        try:
            document = eval_run_comparison(
                tenant=tenant_of(request).tenant,
                before_id=eval_run_id,
                after_id=other_id,
            )
        except EvalComparisonRefused as refused:
            if refused.kind == "not_found":
                raise NotFound(
                    {"detail": refused.message, "eval_run": refused.side}
                ) from None
            if refused.kind == "invalid":
                raise ValidationError({"other_id": [refused.message]}) from None
            return Response(
                error_body(
                    "not_finished",
                    refused.message,
                    eval_run=refused.side,
                    status=refused.status,
                ),
                status=status.HTTP_409_CONFLICT,
            )
        return Response(EvalComparisonSerializer(document).data)
