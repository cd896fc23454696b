"""Evaluation suites API: a tenant's suites and their cases, and suites as YAML
files (import and export). Every member reads them; operators and admins write
them (docs/evals.md). A bad definition is a 400 naming its path
(`cases[2].graders[0].tol`) and nothing is written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ParseError, ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import BoundedJSONParser, reject_unknown_fields, remote_addr
from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.evals import selectors
from runs.evals.definitions import CASE_KEYS
from runs.evals.suite_files import MAX_YAML_BYTES, suite_file_render
from runs.models import EvalCase, EvalSuite
from runs.services import evals as services

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


class YamlTextParser(BaseParser):
    """A YAML body, handed over as text (runs.evals.suite_files parses it)."""

    media_type = "application/yaml"

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = stream.read(MAX_YAML_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_YAML_BYTES:
            raise ParseError(f"the YAML file is larger than {MAX_YAML_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("the YAML file is not UTF-8") from None
        return text


class _YamlAlias(YamlTextParser):
    media_type = "text/yaml"


class _XYamlAlias(YamlTextParser):
    media_type = "application/x-yaml"


class GraderField(serializers.DictField):
    """A grader: {"kind": ..., kind-specific keys} (docs/evals.md)."""


class EvalCaseSerializer(serializers.Serializer[Any]):
    slug = serializers.CharField()
    position = serializers.IntegerField()
    input = serializers.CharField()
    world = serializers.DictField()
    approvals = serializers.ListField(child=serializers.DictField())
    graders = serializers.ListField(child=serializers.DictField())


class EvalCaseInputSerializer(serializers.Serializer[Any]):
    """A case's definition; each grader and approval is checked key by key."""

    slug = serializers.SlugField(max_length=64)
    input = serializers.CharField(trim_whitespace=False)
    world = serializers.DictField(required=False)
    approvals = serializers.ListField(child=serializers.DictField(), required=False)
    graders = serializers.ListField(child=serializers.DictField(), min_length=1)


class EvalSuiteSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    agent = serializers.CharField(source="default_agent")
    case_count = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EvalSuiteDetailSerializer(EvalSuiteSerializer):
    cases = EvalCaseSerializer(many=True)


class EvalSuiteInputSerializer(serializers.Serializer[Any]):
    """A whole suite, as its YAML file holds it."""

    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True)
    agent = serializers.CharField(required=False, allow_blank=True)
    cases = EvalCaseInputSerializer(many=True)


class EvalSuitePatchSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    agent = serializers.CharField(required=False, allow_blank=True)


class EvalSuiteImportJsonSerializer(serializers.Serializer[Any]):
    yaml = serializers.CharField(help_text="The suite file's text.")


class EvalSuiteImportedSerializer(EvalSuiteDetailSerializer):
    created = serializers.BooleanField()


def _invalid(problem: services.DefinitionError) -> ValidationError:
    return ValidationError(problem.fields)


def _suite_or_404(request: Request, slug: str) -> EvalSuite:
    suite = selectors.eval_suite_get_for(tenant=tenant_of(request).tenant, slug=slug)
    if suite is None:
        raise NotFound("No such eval suite in this tenant.")
    return suite


def _case_or_404(suite: EvalSuite, slug: str) -> EvalCase:
    case = selectors.eval_case_get(suite=suite, slug=slug)
    if case is None:
        raise NotFound(f"Suite {suite.slug} has no case {slug}.")
    return case


def _detail(request: Request, slug: str) -> dict[str, Any]:
    suite = _suite_or_404(request, slug)
    data = dict(EvalSuiteSerializer(suite).data)
    data["cases"] = EvalCaseSerializer(
        selectors.eval_cases_of(suite=suite), many=True
    ).data
    return data


def _conflict(message: str) -> Response:
    return Response(
        {"error": {"code": "conflict", "message": message}},
        status=status.HTTP_409_CONFLICT,
    )


class EvalSuiteListApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ, "POST": Action.EVAL_WRITE}

    @extend_schema(responses=EvalSuiteSerializer(many=True))
    def get(self, request: Request) -> Response:
        suites = selectors.eval_suite_list_for(tenant=tenant_of(request).tenant)
        return Response(EvalSuiteSerializer(suites, many=True).data)

    @extend_schema(
        request=EvalSuiteInputSerializer,
        responses={201: EvalSuiteDetailSerializer},
        description="A new suite with its cases (at least one).",
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        try:
            suite = services.eval_suite_create(
                tenant=context.tenant,
                actor=context.user,
                document=request.data,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise _invalid(invalid) from None
        return Response(_detail(request, suite.slug), status=status.HTTP_201_CREATED)


class EvalSuiteImportApi(APIView):
    gate: Gate = {"POST": Action.EVAL_WRITE}
    parser_classes = [BoundedJSONParser, YamlTextParser, _YamlAlias, _XYamlAlias]

    @extend_schema(
        request={
            "application/yaml": OpenApiTypes.STR,
            "application/json": EvalSuiteImportJsonSerializer,
        },
        responses={200: EvalSuiteImportedSerializer, 201: EvalSuiteImportedSerializer},
        description='Import a suite file (the YAML body, or JSON {"yaml": text}): '
        "a new suite (201), or the suite of its slug made exactly what the file "
        "says (200). Unknown keys are refused, naming their path.",
    )
    def post(self, request: Request) -> Response:
        if isinstance(request.data, str):
            text = request.data
        else:
            reject_unknown_fields(request, {"yaml"})
            body = EvalSuiteImportJsonSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            text = body.validated_data["yaml"]
        context = tenant_of(request)
        try:
            suite, created = services.eval_suite_import(
                tenant=context.tenant,
                actor=context.user,
                text=text,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise _invalid(invalid) from None
        data = _detail(request, suite.slug)
        data["created"] = created
        return Response(
            data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class EvalSuiteDetailApi(APIView):
    gate: Gate = {
        "GET": Action.EVAL_READ,
        "PATCH": Action.EVAL_WRITE,
        "DELETE": Action.EVAL_WRITE,
    }

    @extend_schema(responses=EvalSuiteDetailSerializer)
    def get(self, request: Request, slug: str) -> Response:
        return Response(_detail(request, slug))

    @extend_schema(
        request=EvalSuitePatchSerializer,
        responses=EvalSuiteDetailSerializer,
        description="Change the suite's name, description or agent.",
    )
    def patch(self, request: Request, slug: str) -> Response:
        suite = _suite_or_404(request, slug)
        reject_unknown_fields(request, set(services.SUITE_FIELDS))
        try:
            services.eval_suite_update(
                suite=suite,
                actor=tenant_of(request).user,
                fields=request.data,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise _invalid(invalid) from None
        return Response(_detail(request, slug))

    @extend_schema(
        request=None,
        responses={204: None, 409: ErrorSerializer},
        description="Delete the suite and its cases (409 while eval runs refer to it).",
    )
    def delete(self, request: Request, slug: str) -> Response:
        suite = _suite_or_404(request, slug)
        try:
            services.eval_suite_delete(
                suite=suite,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except services.EvalSuiteInUse as in_use:
            return _conflict(str(in_use))
        return Response(status=status.HTTP_204_NO_CONTENT)


class EvalSuiteExportApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ}

    @extend_schema(
        responses={
            (200, "application/yaml"): OpenApiResponse(
                OpenApiTypes.STR, description="The suite file."
            )
        },
        description="The suite as one YAML file; importing it gives the same suite.",
    )
    def get(self, request: Request, slug: str) -> HttpResponse:
        suite = _suite_or_404(request, slug)
        text = suite_file_render(selectors.eval_suite_document(suite=suite))
        response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{suite.slug}.yaml"'
        return response


def _case_input(request: Request) -> Any:
    reject_unknown_fields(request, set(CASE_KEYS))
    return request.data


class EvalCaseListApi(APIView):
    gate: Gate = {"GET": Action.EVAL_READ, "POST": Action.EVAL_WRITE}

    @extend_schema(responses=EvalCaseSerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        cases = selectors.eval_cases_of(suite=_suite_or_404(request, slug))
        return Response(EvalCaseSerializer(cases, many=True).data)

    @extend_schema(
        request=EvalCaseInputSerializer,
        responses={201: EvalCaseSerializer},
        description="Add a case at the end of the suite.",
    )
    def post(self, request: Request, slug: str) -> Response:
        suite = _suite_or_404(request, slug)
        try:
            case = services.eval_case_create(
                suite=suite,
                actor=tenant_of(request).user,
                definition=_case_input(request),
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise _invalid(invalid) from None
        return Response(EvalCaseSerializer(case).data, status=status.HTTP_201_CREATED)


class EvalCaseDetailApi(APIView):
    gate: Gate = {
        "GET": Action.EVAL_READ,
        "PUT": Action.EVAL_WRITE,
        "PATCH": Action.EVAL_WRITE,
        "DELETE": Action.EVAL_WRITE,
    }

    @extend_schema(responses=EvalCaseSerializer)
    def get(self, request: Request, slug: str, case_slug: str) -> Response:
        case = _case_or_404(_suite_or_404(request, slug), case_slug)
        return Response(EvalCaseSerializer(case).data)

    def _update(
        self, request: Request, slug: str, case_slug: str, *, partial: bool
    ) -> Response:
        case = _case_or_404(_suite_or_404(request, slug), case_slug)
        try:
            case = services.eval_case_update(
                case=case,
                actor=tenant_of(request).user,
                definition=_case_input(request),
                partial=partial,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise _invalid(invalid) from None
        return Response(EvalCaseSerializer(case).data)

    @extend_schema(request=EvalCaseInputSerializer, responses=EvalCaseSerializer)
    def put(self, request: Request, slug: str, case_slug: str) -> Response:
        return self._update(request, slug, case_slug, partial=False)

    @extend_schema(
        request=EvalCaseInputSerializer(partial=True), responses=EvalCaseSerializer
    )
    def patch(self, request: Request, slug: str, case_slug: str) -> Response:
        return self._update(request, slug, case_slug, partial=True)

    @extend_schema(
        request=None,
        responses={204: None, 409: ErrorSerializer},
        description="Delete the case (409 for a suite's only case).",
    )
    def delete(self, request: Request, slug: str, case_slug: str) -> Response:
        case = _case_or_404(_suite_or_404(request, slug), case_slug)
        try:
            services.eval_case_delete(
                case=case,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except services.LastCase as last:
            return _conflict(str(last))
        return Response(status=status.HTTP_204_NO_CONTENT)
