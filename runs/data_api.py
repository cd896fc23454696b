"""Data lifecycle API: export one run (JSON or OTLP JSON) and the tenant's
retention (docs/data.md). Deleting a run is `DELETE /api/v1/runs/<id>/`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.api import ApprovalSerializer
from approvals.selectors import approval_list_for
from controlplane.api_input import remote_addr
from controlplane.permissions import Action, Gate
from controlplane.redaction import redact
from controlplane.tenancy import tenant_of
from runs import selectors
from runs.api import RunDetailSerializer
from runs.models import Run
from runs.services.retention import tenant_retention_days, tenant_retention_set
from tracing import selectors as tracing_selectors
from tracing.export import otlp_trace_request
from tracing.services import event_message
from tracing.store import span_event_payload

EXPORT_FORMATS = ("json", "otlp")


class _FormatIsTheExportsOwn(DefaultContentNegotiation):
    """`?format=` picks the export's encoding here, not one of DRF's renderers
    (whose URL override would answer an unknown renderer with 404)."""

    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


def _export_json(run: Run) -> dict[str, Any]:
    """The run as a reader of the runs API sees it, with everything recorded."""
    tenant = run.tenant
    approvals = (
        approval_list_for(tenant=tenant, run_id=str(run.id))
        .prefetch_related("decisions__user")
        .order_by("requested_at")
    )
    spans = []
    for span, payloads in tracing_selectors.run_spans_with_payloads(
        tenant=tenant, run_id=run.id
    ):
        body = span_event_payload(span)
        body["payload_bodies"] = {
            name: json.loads(text) for name, text in payloads.items()
        }
        spans.append(body)
    return {
        "format": "agent-control-plane.run-export",
        "version": 1,
        "exported_at": timezone.now().isoformat(),
        "run": RunDetailSerializer(run).data,
        "approvals": ApprovalSerializer(approvals, many=True).data,
        # Stored redacted; redacted again on the way out (rows stored before
        # the rule caught what they hold), as the spans and events APIs do.
        "spans": redact(spans),
        "events": [
            event_message(event)
            for event in tracing_selectors.run_events_after(run_id=run.id, after_seq=0)
        ],
    }


def _export_otlp(run: Run) -> dict[str, Any]:
    rows = []
    for span, payloads in tracing_selectors.run_spans_with_payloads(
        tenant=run.tenant, run_id=run.id
    ):
        attributes = dict(span.attributes)
        attributes.update({name: json.loads(text) for name, text in payloads.items()})
        rows.append((span, redact(attributes)))
    return otlp_trace_request(spans=rows, service_name=settings.OTEL_SERVICE_NAME)


class RunExportApi(APIView):
    """One run, whole: viewers may export (it is a read of the run)."""

    gate: Gate = {"GET": Action.RUN_READ}
    content_negotiation_class = _FormatIsTheExportsOwn
    renderer_classes = [JSONRenderer]
    fixed_format: str | None = None  # set by the `/export.otlp.json` view

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "format",
                str,
                enum=list(EXPORT_FORMATS),
                description="json (default): the run, steps, tool calls, approvals "
                "with decisions, spans with attributes and payloads, events; otlp: "
                "the spans as an OTLP ExportTraceServiceRequest (JSON encoding), "
                "which POST /v1/traces accepts",
            )
        ],
        responses={200: OpenApiTypes.OBJECT},
        description="Export one run of the caller's tenant, with the same "
        "redaction as the runs API.",
    )
    def get(self, request: Request, run_id: str) -> Response:
        wanted = self.fixed_format or request.query_params.get("format") or "json"
        if wanted not in EXPORT_FORMATS:
            raise ValidationError(
                {
                    "format": [
                        f"unknown export format; one of {', '.join(EXPORT_FORMATS)}"
                    ]
                }
            )
        run = selectors.run_get_for(tenant=tenant_of(request).tenant, run_id=run_id)
        if run is None:
            raise NotFound("No such run in this tenant.")
        body = _export_otlp(run) if wanted == "otlp" else _export_json(run)
        suffix = "otlp.json" if wanted == "otlp" else "json"
        return Response(
            body,
            headers={
                "Content-Disposition": f'attachment; filename="run-{run.id}.{suffix}"'
            },
        )


class RetentionSerializer(serializers.Serializer[Any]):
    # null: the deployment's default (DATA_RETENTION_DAYS; 0 there keeps forever).
    retention_days = serializers.IntegerField(
        min_value=1, max_value=365_000, allow_null=True
    )


class RetentionOutputSerializer(RetentionSerializer):
    default_days = serializers.IntegerField(allow_null=True)
    # What the retention pass applies: the tenant's days, else the default;
    # null keeps runs forever.
    effective_days = serializers.IntegerField(allow_null=True)


def _retention_body(context: Any) -> dict[str, Any]:
    tenant = context.tenant
    return {
        "retention_days": tenant.retention_days,
        "default_days": settings.DATA_RETENTION_DAYS or None,
        "effective_days": tenant_retention_days(tenant),
    }


class RetentionApi(APIView):
    """How long the tenant's terminal runs are kept; admins set it."""

    gate: Gate = {"GET": Action.RUN_READ, "PUT": Action.RETENTION_WRITE}

    @extend_schema(responses=RetentionOutputSerializer)
    def get(self, request: Request) -> Response:
        return Response(_retention_body(tenant_of(request)))

    @extend_schema(request=RetentionSerializer, responses=RetentionOutputSerializer)
    def put(self, request: Request) -> Response:
        context = tenant_of(request)
        if not isinstance(request.data, dict):
            raise ValidationError(
                {"non_field_errors": ["the body must be a JSON object"]}
            )
        unknown = sorted(set(request.data) - {"retention_days"})
        if unknown:
            raise ValidationError({name: ["unknown field"] for name in unknown})
        body = RetentionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tenant_retention_set(
            tenant=context.tenant,
            retention_days=body.validated_data["retention_days"],
            actor=context.user,
            remote_addr=remote_addr(request),
        )
        return Response(_retention_body(context))


class RunExportOtlpApi(RunExportApi):
    """`/export.otlp.json`: the OTLP export, for clients that cannot add a query."""

    fixed_format = "otlp"

    @extend_schema(
        operation_id="v1_runs_export_otlp_retrieve",
        responses={200: OpenApiTypes.OBJECT},
        description="The run's spans as an OTLP ExportTraceServiceRequest in its "
        "JSON encoding (the same as `export/?format=otlp`).",
    )
    def get(self, request: Request, run_id: str) -> Response:
        return super().get(request, run_id)
