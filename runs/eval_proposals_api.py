"""A run proposed as an eval case ("Add to suite"): its input, the world it saw,
the decisions taken on it and graders proposed from what went wrong
(runs/evals/proposals.py). Reading a proposal writes nothing; the case is made
through the cases API (runs/evals_api.py) with the graders a person keeps."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.redaction import redact
from controlplane.tenancy import tenant_of
from runs.evals.proposals import run_case_proposal
from runs.selectors import run_for_tenant


class GraderProposalSerializer(serializers.Serializer[Any]):
    grader = serializers.JSONField(help_text="a grader as a case holds it")
    why = serializers.CharField(help_text="what in the run proposes it")
    checked = serializers.BooleanField(help_text="ticked at first")


class CaseProposalSerializer(serializers.Serializer[Any]):
    case = serializers.JSONField(
        help_text="slug, input, world and scripted approvals of the proposed case"
    )
    graders = GraderProposalSerializer(many=True)
    notes = serializers.ListField(child=serializers.CharField())


class RunCaseProposalApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ}

    @extend_schema(responses={200: CaseProposalSerializer, 404: ErrorSerializer})
    def get(self, request: Request, run_id: str) -> Response:
        """The run as a proposed eval case; secrets in it are redacted."""
        run = run_for_tenant(tenant=tenant_of(request).tenant, run_id=run_id)
        if run is None:
            raise NotFound("No such run.")
        return Response(redact(run_case_proposal(run=run).as_dict()))
