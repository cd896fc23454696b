"""What an external agent's eval client needs beyond starting and reading an
eval run (docs/evals.md, "Agents that run outside"): report a trial it ran, and
the CI verdict of a finished eval run (case lines, gate, regression check,
JUnit XML) as the server computes it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_errors import error_body
from controlplane.api_input import BoundedJSONParser, reject_unknown_fields
from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.eval_runs_api import EvalTrialSerializer
from runs.evals.results import eval_run_get_for, eval_run_progress
from runs.evals.verdict import VerdictRefused, eval_run_verdict
from runs.models import EvalRun
from runs.services.eval_external import EvalTrialConflict, eval_trial_report

REPORT_FIELDS = {"trace_id", "final_answer", "error"}
TRACE_ID = r"^[0-9a-f]{32}$"  # W3C trace id, as OTLP ingest stores it


class TrialReportSerializer(serializers.Serializer[Any]):
    trace_id = serializers.RegexField(
        TRACE_ID, required=False,
        help_text="The trace the agent ran the trial under (32 lowercase hex).",
    )  # fmt: skip
    final_answer = serializers.CharField(
        required=False, allow_blank=True, max_length=100_000, trim_whitespace=False,
        help_text="The agent's answer, used when its spans carry none.",
    )  # fmt: skip
    error = serializers.CharField(
        required=False, max_length=10_000,
        help_text="Instead of trace_id: why the agent produced no trace.",
    )  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("trace_id" in attrs) == ("error" in attrs):
            raise ValidationError(
                {"trace_id": ["give trace_id (the trial ran) or error (it did not)"]}
            )
        return attrs


class VerdictGateSerializer(serializers.Serializer[Any]):
    expression = serializers.CharField()
    passed = serializers.BooleanField()
    clauses = serializers.ListField(
        child=serializers.CharField(),
        help_text="Each clause with its actual value "
        '("pass^k>=0.8: pass^k is 1 (ok)").',
    )


class VerdictRegressionSerializer(serializers.Serializer[Any]):
    baseline = serializers.UUIDField(allow_null=True)
    passed = serializers.BooleanField()
    reasons = serializers.ListField(child=serializers.CharField())
    message = serializers.CharField()


class EvalVerdictSerializer(serializers.Serializer[Any]):
    eval_run = serializers.UUIDField()
    lines = serializers.ListField(
        child=serializers.CharField(),
        help_text="One line per case, then the suite's figures.",
    )
    notes = serializers.ListField(child=serializers.CharField())
    gate = VerdictGateSerializer(allow_null=True)
    regression = VerdictRegressionSerializer(allow_null=True)
    junit = serializers.CharField(help_text="JUnit XML of the eval run.")
    passed = serializers.BooleanField(
        help_text="The gate and the regression check (those asked for) passed."
    )


def _eval_run(request: Request, eval_run_id: Any) -> EvalRun:
    eval_run = eval_run_get_for(
        tenant=tenant_of(request).tenant, eval_run_id=eval_run_id
    )
    if eval_run is None:
        raise NotFound("No such eval run in this tenant.")
    return eval_run


class EvalTrialReportApi(APIView):
    gate: Gate = {"POST": Action.EVAL_WRITE}
    parser_classes = [BoundedJSONParser]

    @extend_schema(
        request=TrialReportSerializer,
        responses={
            200: EvalTrialSerializer,
            400: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="Report an external agent's trial: bind it to the external "
        "run of its trace and grade it (the answer is the graded trial). 409 "
        "with nothing written for a trial already reported or a trace that is "
        "another tenant's, a native run's, another trial's or not arrived yet.",
    )
    def post(self, request: Request, eval_run_id: str, trial_id: str) -> Response:
        reject_unknown_fields(request, REPORT_FIELDS)
        body = TrialReportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        eval_run = _eval_run(request, eval_run_id)
        try:
            trial = eval_trial_report(
                tenant=tenant_of(request).tenant,
                eval_run=eval_run,
                trial_id=trial_id,
                trace_id=data.get("trace_id"),
                final_answer=data.get("final_answer"),
                error=data.get("error"),
            )
        except EvalTrialConflict as conflict:
            answer: int = status.HTTP_409_CONFLICT
            if conflict.code == "no_such_trial":
                answer = status.HTTP_404_NOT_FOUND
            return Response(error_body(conflict.code, str(conflict)), status=answer)
        return Response(EvalTrialSerializer(trial).data)


class EvalRunVerdictApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("gate", str, description='e.g. "pass^k>=0.8"'),
            OpenApiParameter("baseline", str, description="LAST or an eval run id"),
        ],
        responses={
            200: EvalVerdictSerializer,
            400: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
        },
        description="The CI verdict of a finished eval run: one line per case "
        "and the suite's figures, each gate clause with its actual value, the "
        "regression check against the baseline, JUnit XML, and `passed`. 409 "
        "`not_finished` while trials are open.",
    )
    def get(self, request: Request, eval_run_id: str) -> Response:
        eval_run = _eval_run(request, eval_run_id)
        if eval_run.status != EvalRun.Status.FINISHED:
            done, total, _ = eval_run_progress(eval_run)
            return Response(
                error_body(
                    "not_finished",
                    f"The eval run is {eval_run.status}, {done} of {total} trials "
                    "done: ask for its verdict once it has finished.",
                    status=eval_run.status,
                ),
                status=status.HTTP_409_CONFLICT,
            )
        try:
            document = eval_run_verdict(
                eval_run=eval_run,
                gate=request.query_params.get("gate"),
                baseline=request.query_params.get("baseline"),
            )
        except VerdictRefused as bad:
            raise ValidationError({bad.field: [str(bad)]}) from None
        return Response(EvalVerdictSerializer(document).data)
