"""OTLP/HTTP `POST /v1/logs`: log records of agents instrumented elsewhere, with
the same door, limits and answers as `POST /v1/traces` (runs/trace_api.py)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceResponse,
)

from controlplane.permissions import Action, declares
from runs.otlp.http import otlp_error, otlp_http_request
from runs.services.external_logs import ingest_logs
from tracing.ingest import IngestError, LimitExceeded, parse_logs_request


@csrf_exempt
@require_POST
@declares(Action.TRACE_INGEST)
def otlp_logs(request: HttpRequest) -> HttpResponse:
    """OTLP/HTTP `POST /v1/logs`: protobuf or JSON, gzip allowed, tenant token.
    GenAI events become their span's model input/output; other records are
    answered as a partial success (rejected, with the reason)."""
    checked = otlp_http_request(request)
    if isinstance(checked, HttpResponse):
        return checked
    try:
        records = parse_logs_request(checked.body, content_type=checked.content_type)
    except LimitExceeded as exc:
        return otlp_error(413, "too_large", str(exc))
    except IngestError as exc:
        return otlp_error(400, "invalid", str(exc))
    caller = checked.caller
    result = ingest_logs(
        tenant=caller.context.tenant, user=caller.token.user, records=records
    )
    message = "; ".join(result.errors)
    if checked.json:
        if not result.rejected:
            return JsonResponse({})
        return JsonResponse(
            {
                "partialSuccess": {
                    # int64 is a string in proto JSON
                    "rejectedLogRecords": str(result.rejected),
                    "errorMessage": message,
                }
            }
        )
    response = ExportLogsServiceResponse()
    if result.rejected:
        response.partial_success.rejected_log_records = result.rejected
        response.partial_success.error_message = message
    return HttpResponse(
        response.SerializeToString(), content_type="application/x-protobuf"
    )
