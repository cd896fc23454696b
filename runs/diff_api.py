"""Run diff API: two runs of the caller's tenant, steps aligned by meaning
(runs/run_diff.py), with the first place they diverged."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.models import Run
from runs.run_diff import run_diff, run_replay_diff
from runs.selectors import run_for_tenant


class DiffCallSerializer(serializers.Serializer[Any]):
    tool = serializers.CharField()
    arguments = serializers.JSONField(help_text="the call's arguments, redacted")
    status = serializers.CharField(
        help_text="the tool call's status (a span's ok | failed | unset ingested)"
    )
    observation = serializers.CharField(help_text="what the model read back, short")


class DiffStepSerializer(serializers.Serializer[Any]):
    index = serializers.IntegerField(help_text="the step's index in its run")
    action = serializers.ChoiceField(
        choices=["tool_calls", "final_answer", "invalid", "model_only"]
    )
    text = serializers.CharField(help_text="the model's text; the answer, if final")
    model = serializers.CharField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=6)
    latency_ms = serializers.FloatField(
        allow_null=True, help_text="the model call's time"
    )
    input_delta = serializers.ListField(
        child=serializers.CharField(),
        help_text="the messages the model read for the first time at this step "
        "(the input, the previous step's tool results), each shortened",
    )
    calls = DiffCallSerializer(many=True)


class ArgumentChangeSerializer(serializers.Serializer[Any]):
    path = serializers.CharField(help_text="e.g. items[0].sku")
    op = serializers.ChoiceField(choices=["added", "removed", "changed"])
    left = serializers.JSONField(allow_null=True)
    right = serializers.JSONField(allow_null=True)


class DiffPairSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(
        choices=["same", "changed", "inserted", "skipped"],
        help_text="inserted: only in the right run; skipped: only in the left",
    )
    reasons = serializers.ListField(child=serializers.CharField())
    left = DiffStepSerializer(allow_null=True)
    right = DiffStepSerializer(allow_null=True)
    input_differs = serializers.BooleanField(
        help_text="the two steps' models read different new messages"
    )
    argument_changes = serializers.ListField(
        child=ArgumentChangeSerializer(many=True),
        help_text="per call position, the arguments' JSON differences",
    )


class DiffTotalsSerializer(serializers.Serializer[Any]):
    steps = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=15, decimal_places=6)
    duration_s = serializers.FloatField(allow_null=True)


class DiffRunSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    agent = serializers.CharField()
    agent_version = serializers.IntegerField(allow_null=True)
    status = serializers.CharField()
    external = serializers.BooleanField(help_text="a run sent over OTLP")
    replay = serializers.BooleanField(
        help_text="this side is the run replayed from its record, not a run"
    )
    input = serializers.CharField()
    final_answer = serializers.CharField()
    created_at = serializers.DateTimeField()
    totals = DiffTotalsSerializer()


class DivergenceSerializer(serializers.Serializer[Any]):
    pair = serializers.IntegerField(help_text="position in `pairs`")
    left_index = serializers.IntegerField(allow_null=True)
    right_index = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()


class DiffCountsSerializer(serializers.Serializer[Any]):
    same = serializers.IntegerField()
    changed = serializers.IntegerField()
    inserted = serializers.IntegerField()
    skipped = serializers.IntegerField()


class RunDiffSerializer(serializers.Serializer[Any]):
    left = DiffRunSerializer()
    right = DiffRunSerializer()
    totals_delta = DiffTotalsSerializer(help_text="right minus left")
    counts = DiffCountsSerializer()
    first_divergence = DivergenceSerializer(
        allow_null=True, help_text="null: the runs did the same things"
    )
    pairs = DiffPairSerializer(many=True)


def _run_or_404(request: Request, run_id: str, side: str) -> Run:
    run = run_for_tenant(tenant=tenant_of(request).tenant, run_id=run_id)
    if run is None:
        raise NotFound(
            {"detail": f"No such run in this tenant: the {side} run.", "run": side}
        )
    return run


class RunDiffApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        responses={200: RunDiffSerializer, 400: ErrorSerializer, 404: ErrorSerializer},
        description="Compare two runs of the tenant, native or sent over OTLP: "
        "their steps aligned by what they did (the action and the tools it "
        "called), each pair same, changed (same tool, different arguments, "
        "observation or answer), inserted (only in the right run) or skipped "
        "(only in the left), with the first divergence and the totals' deltas. "
        "404 names the run (`left` or `right`) that is not the tenant's; the "
        "same run twice is 400.",
    )
    def get(self, request: Request, run_id: str, other_id: str) -> Response:
        left = _run_or_404(request, run_id, "left")
        right = _run_or_404(request, other_id, "right")
        if left.id == right.id:
            raise ValidationError({"other_id": ["compare a run with another run"]})
        diff = run_diff(tenant=tenant_of(request).tenant, left=left, right=right)
        return Response(diff.as_dict())


class RunReplayDiffApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        responses={200: RunDiffSerializer, 404: ErrorSerializer},
        description="The run (left) beside its replay (right): the recorded "
        "model replies and tool results played again in memory, under today's "
        "policy and evaluator, nothing executed or written (runs/replay.py). "
        "Same shape as the diff of two runs; `right.replay` is true.",
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = _run_or_404(request, run_id, "left")
        diff = run_replay_diff(tenant=tenant_of(request).tenant, run=run)
        return Response(diff.as_dict())
