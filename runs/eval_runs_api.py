"""Eval runs API: start a suite's eval run against an agent version, and read
its per-case results and summary (docs/evals.md, "Eval runs and the CI command").
Members read; operators and admins start. A refused start is a 400 naming the
field (`k`, `suite`, `cases[0].graders[1].tool`) and writes nothing."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import BoundedJSONParser, reject_unknown_fields
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.evals import selectors
from runs.evals.results import eval_run_get_for, eval_run_progress
from runs.evals.verdict import VerdictRefused, eval_baseline_of, eval_gate_parse
from runs.models import EvalRun, EvalTrial
from runs.services.eval_external import eval_run_start_external
from runs.services.eval_runs import EvalRunRefused, eval_run_start

START_FIELDS = {"suite", "agent", "version", "external_agent", "k", "gate", "baseline"}
# An external agent's name: what its eval runs (and `--baseline LAST`) go by.
EXTERNAL_AGENT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class EvalRunStartSerializer(serializers.Serializer[Any]):
    suite = serializers.SlugField(max_length=64, help_text="The suite's slug.")
    agent = serializers.SlugField(
        max_length=64, required=False,
        help_text="A hosted agent's slug (or give external_agent).",
    )  # fmt: skip
    external_agent = serializers.RegexField(
        EXTERNAL_AGENT, max_length=64, required=False,
        help_text="The name of an agent that runs outside: its client runs and "
        "reports each trial (or give agent).",
    )  # fmt: skip
    version = serializers.IntegerField(
        required=False, allow_null=True, min_value=1,
        help_text="The agent version's number; its current version by default.",
    )  # fmt: skip
    k = serializers.IntegerField(help_text="Trials per case, 1 to 100.")
    gate = serializers.CharField(
        required=False, max_length=500,
        help_text="Checked before anything starts (a CI client's gate); not stored.",
    )  # fmt: skip
    baseline = serializers.CharField(
        required=False, max_length=64,
        help_text="LAST or a finished eval run id of the suite; checked, not stored.",
    )  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        hosted, external = "agent" in attrs, "external_agent" in attrs
        if hosted == external:
            raise ValidationError(
                {"agent": ["give either agent (hosted) or external_agent, not both"
                           if hosted else "give agent or external_agent"]}
            )  # fmt: skip
        if external and attrs.get("version") is not None:
            raise ValidationError(
                {"version": ["an external agent's eval run has no version"]}
            )
        return attrs


class EvalTrialSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    index = serializers.IntegerField()
    run = serializers.UUIDField(source="run_id", allow_null=True)
    run_status = serializers.SerializerMethodField()
    status = serializers.CharField()
    passed = serializers.BooleanField(allow_null=True)
    grader_results = serializers.ListField(child=serializers.DictField())
    graded_at = serializers.DateTimeField(allow_null=True)

    def get_run_status(self, trial: EvalTrial) -> str | None:
        return trial.run.status if trial.run is not None else None


class EvalRunCaseSerializer(serializers.Serializer[Any]):
    case = serializers.CharField()
    input = serializers.CharField(help_text="The case's input (as it was run).")
    trials = EvalTrialSerializer(many=True)


class EvalRunProgressSerializer(serializers.Serializer[Any]):
    done = serializers.IntegerField()
    total = serializers.IntegerField()
    passed = serializers.IntegerField()


class EvalRunSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    suite = serializers.CharField(source="suite.slug")
    agent = serializers.CharField(
        source="agent_name", help_text="The agent's slug or external name."
    )
    version = serializers.IntegerField(
        source="version_number", allow_null=True,
        help_text="The agent version's number; null for an external agent.",
    )  # fmt: skip
    external = serializers.BooleanField()
    k = serializers.IntegerField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    summary = serializers.DictField(
        help_text="pass@1, pass@k, pass^k, the pass@1 interval, means per trial "
        "and per case (filled when the eval run finishes), and notes."
    )
    progress = EvalRunProgressSerializer()
    cases = EvalRunCaseSerializer(many=True)


def eval_run_document(eval_run: EvalRun) -> dict[str, Any]:
    trials = EvalTrial.objects.filter(eval_run=eval_run).select_related("run")
    by_case: dict[str, list[EvalTrial]] = {}
    inputs: dict[str, str] = {}
    for case in eval_run.suite_snapshot.get("cases", []):
        by_case[str(case["slug"])] = []
        inputs[str(case["slug"])] = str(case["input"])
    for trial in trials:
        by_case.setdefault(trial.case_slug, []).append(trial)
    done, total, passed = eval_run_progress(eval_run)
    return dict(
        EvalRunSerializer(
            {
                "id": eval_run.id,
                "suite": eval_run.suite,
                "agent_name": eval_run.agent_name,
                "version_number": eval_run.version_number,
                "external": eval_run.agent_version_id is None,
                "k": eval_run.k,
                "status": eval_run.status,
                "created_at": eval_run.created_at,
                "started_at": eval_run.started_at,
                "finished_at": eval_run.finished_at,
                "summary": eval_run.summary,
                "progress": {"done": done, "total": total, "passed": passed},
                "cases": [
                    {
                        "case": slug,
                        "input": inputs.get(slug, ""),
                        "trials": sorted(ts, key=lambda t: t.index),
                    }
                    for slug, ts in by_case.items()
                ],
            }
        ).data
    )


class EvalRunListApi(APIView):
    gate: Gate = {"POST": Action.EVAL_WRITE}
    parser_classes = [BoundedJSONParser]

    @extend_schema(
        request=EvalRunStartSerializer,
        responses={201: EvalRunSerializer},
        description="Start an eval run: k real runs of every case of the suite "
        "against the agent version, their approvals decided by each case's "
        "script; or, with external_agent, k pending trials per case for the "
        "external agent's client to run and report. Refused with nothing "
        "written when k is not 1 to 100, the suite has no case, a grader names "
        "a tool the agent lacks, or (external) a case scripts approvals.",
    )
    def post(self, request: Request) -> Response:
        reject_unknown_fields(request, START_FIELDS)
        body = EvalRunStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        context = tenant_of(request)
        suite = selectors.eval_suite_get_for(tenant=context.tenant, slug=data["suite"])
        if suite is None:
            raise ValidationError({"suite": [f"no suite {data['suite']!r}"]})
        try:
            # The CI client's gate and baseline fail here, before any trial.
            eval_gate_parse(data.get("gate"))
            eval_baseline_of(
                tenant=context.tenant, suite=suite, choice=data.get("baseline"),
                external_agent=data.get("external_agent", ""),
            )  # fmt: skip
        except VerdictRefused as bad:
            raise ValidationError({bad.field: [str(bad)]}) from None
        try:
            if "external_agent" in data:
                eval_run = eval_run_start_external(
                    tenant=context.tenant,
                    suite=suite,
                    agent_name=data["external_agent"],
                    k=data["k"],
                    user=context.user,
                )
            else:
                eval_run = eval_run_start(
                    tenant=context.tenant,
                    suite=suite,
                    agent_slug=data["agent"],
                    version=data.get("version"),
                    k=data["k"],
                    user=context.user,
                )
        except EvalRunRefused as refused:
            raise ValidationError(refused.problems) from None
        fresh = eval_run_get_for(tenant=context.tenant, eval_run_id=eval_run.id)
        assert fresh is not None
        return Response(eval_run_document(fresh), status=status.HTTP_201_CREATED)


class EvalRunDetailApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ}

    @extend_schema(responses=EvalRunSerializer)
    def get(self, request: Request, eval_run_id: str) -> Response:
        eval_run = eval_run_get_for(
            tenant=tenant_of(request).tenant, eval_run_id=eval_run_id
        )
        if eval_run is None:
            raise NotFound("No such eval run in this tenant.")
        return Response(eval_run_document(eval_run))
