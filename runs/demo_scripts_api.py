"""Demo scripts API (docs/demo.md): the eleven scripts, and starting one.

`POST /api/v1/demo-scripts/<slug>/start/` starts the script's run (in a shop
world of its own) or, for the eval script, its eval run, and answers with what
it started (`kind`: run or eval_run, and its `id`). Whoever may start runs may
start a script; a viewer gets 403, an unknown slug 404."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import reject_unknown_fields
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.demo_scripts import DEMO_SCRIPTS, DEMO_SCRIPTS_BY_SLUG
from runs.services.demo_scripts import demo_script_start
from runs.services.eval_runs import EvalRunRefused
from runs.services.lifecycle import RunInputError


class DemoScriptSerializer(serializers.Serializer[Any]):
    number = serializers.CharField()
    slug = serializers.CharField()
    title = serializers.CharField()
    kind = serializers.CharField()
    agent = serializers.CharField()
    input = serializers.CharField()
    steps = serializers.CharField()
    outcome = serializers.CharField()


class DemoStartedSerializer(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=["run", "eval_run"])
    id = serializers.UUIDField(help_text="The run's id, or the eval run's.")


class DemoScriptListApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(responses=DemoScriptSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(DemoScriptSerializer(DEMO_SCRIPTS, many=True).data)


class DemoScriptStartApi(APIView):
    gate: Gate = {"POST": Action.RUN_START}

    @extend_schema(
        request=None,
        responses={201: DemoStartedSerializer},
        description="Start the demo script; 404 for an unknown script.",
    )
    def post(self, request: Request, slug: str) -> Response:
        reject_unknown_fields(request, set())
        script = DEMO_SCRIPTS_BY_SLUG.get(slug)
        if script is None:
            raise NotFound(f"No demo script {slug[:60]!r}.")
        context = tenant_of(request)
        try:
            started = demo_script_start(
                tenant=context.tenant, script=script, user=context.user
            )
        except RunInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        except EvalRunRefused as refused:
            raise ValidationError(refused.problems) from None
        body = {"kind": started.kind, "id": started.id}
        return Response(
            DemoStartedSerializer(body).data, status=status.HTTP_201_CREATED
        )
