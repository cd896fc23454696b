"""Tracing APIs of runs: a run's event log and span tree (paged), one span with
its payloads, the run of a trace id, and the OTLP/HTTP trace ingest endpoint.
They live with runs because each asks which run (of the caller's tenant) it is
about; tracing reads and stores the rows."""

from __future__ import annotations

import json
import re
from decimal import Decimal

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.utils import OpenApiParameter, extend_schema
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate, declares
from controlplane.redaction import redact
from controlplane.tenancy import tenant_of
from runs.api import TRACE_ID_PATTERN, RunDetailSerializer
from runs.models import Run
from runs.otlp.http import otlp_error, otlp_http_request
from runs.selectors import (
    run_for_tenant,
    run_get_for,
    run_id_for_trace,
    run_steps_cost,
)
from runs.services.external import ingest_spans
from tracing import selectors
from tracing.ingest import IngestError, LimitExceeded, parse_request
from tracing.models import Span
from tracing.services import event_message
from tracing.store import span_event_payload
from tracing.tree import (
    MAX_CANDIDATES,
    MAX_MATCHES,
    span_search,
    span_subtree_totals,
)

MAX_PAGE = 1000


def _bounded_int(request: Request, name: str, default: int, *, maximum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: [f"{name} must be an integer"]}) from None
    if value < 0 or value > maximum:
        raise ValidationError({name: [f"{name} must be between 0 and {maximum}"]})
    return value


def _run_of(request: Request, run_id: str) -> Run:
    run = run_for_tenant(tenant=tenant_of(request).tenant, run_id=run_id)
    if run is None:
        raise NotFound("No such run.")
    return run


class RunEventListApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("after_seq", int, description="events after this seq"),
            OpenApiParameter("limit", int, description=f"at most {MAX_PAGE}"),
        ],
        responses={200: dict},
    )
    def get(self, request: Request, run_id: str) -> Response:
        """The run's events after `after_seq`, in seq order."""
        run = _run_of(request, run_id)
        after = _bounded_int(request, "after_seq", 0, maximum=2**62)
        if "after_seq" not in request.query_params and "after" in request.query_params:
            after = _bounded_int(request, "after", 0, maximum=2**62)
        limit = _bounded_int(request, "limit", 200, maximum=MAX_PAGE) or 1
        events = [
            event_message(event)
            for event in selectors.run_events_after(run_id=run.id, after_seq=after)[
                :limit
            ]
        ]
        return Response(
            {
                "events": events,
                "next_after_seq": events[-1]["seq"] if len(events) == limit else None,
            }
        )


class RunSpanListApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("parent", str, description="span_id; empty: the roots"),
            OpenApiParameter("limit", int),
            OpenApiParameter("offset", int),
        ],
        responses={200: dict},
    )
    def get(self, request: Request, run_id: str) -> Response:
        """Children of one span (or the roots), paged, oldest first; each says
        whether it has children of its own."""
        run = _run_of(request, run_id)
        parent = request.query_params.get("parent", "")
        if parent and (len(parent) != 16 or not _is_hex(parent)):
            raise ValidationError({"parent": ["a span_id is 16 hex digits"]})
        limit = _bounded_int(request, "limit", 100, maximum=MAX_PAGE) or 1
        offset = _bounded_int(request, "offset", 0, maximum=2**31)
        query = selectors.span_children(run_id=run.id, parent_span_id=parent)
        count = query.count()
        # Stored redacted; redacted again on the way out, for rows stored before
        # the rule caught what they hold.
        spans = [
            {**redact(span_event_payload(span)), "has_children": span.has_children}
            for span in query[offset : offset + limit]
        ]
        return Response(
            {
                "count": count,
                "results": spans,
                "next_offset": offset + limit if offset + limit < count else None,
            }
        )


class SpanDetailApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(responses={200: dict})
    def get(self, request: Request, span_pk: int) -> Response:
        """One span with its payloads (model input/output, tool args/result)."""
        tenant = tenant_of(request).tenant
        span = selectors.span_for_tenant(tenant=tenant, span_pk=span_pk)
        if span is None:
            raise NotFound("No such span.")
        payloads = selectors.span_payloads(tenant=tenant, span=span)
        body = span_event_payload(span)
        body["run_id"] = str(span.run_id)
        body["payload_bodies"] = {
            name: json.loads(text) for name, text in payloads.items()
        }
        return Response(redact(body))


SEARCH_STATUSES = {choice.value for choice in Span.Status}


class RunSpanSearchApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("q", str, description="text in a span's name, status "
                             "or an attribute value (case-insensitive)"),
            OpenApiParameter("status", str, description="only spans with this "
                             "status (error: also abandoned)"),
            OpenApiParameter("span_id", str, description="one span (deep link)"),
            OpenApiParameter("limit", int, description=f"at most {MAX_MATCHES}"),
            OpenApiParameter("offset", int, description="matches to skip, in row "
                             "order (count is always all of them)"),
        ],
        responses={200: dict},
    )  # fmt: skip
    def get(self, request: Request, run_id: str) -> Response:
        """Spans of the run matching a search, in the tree's row order, each
        with its path from the root; `spans` holds every match sent and its
        ancestors. `limit` matches from `offset`; `count` counts them all."""
        run = _run_of(request, run_id)
        text = request.query_params.get("q", "")
        status = request.query_params.get("status", "")
        span_id = request.query_params.get("span_id", "")
        if len(text) > 200:
            raise ValidationError({"q": ["at most 200 characters"]})
        if status and status not in SEARCH_STATUSES:
            raise ValidationError(
                {"status": [f"one of {', '.join(sorted(SEARCH_STATUSES))}"]}
            )
        if span_id and (len(span_id) != 16 or not _is_hex(span_id)):
            raise ValidationError({"span_id": ["a span_id is 16 hex digits"]})
        if not (text.strip() or status or span_id):
            raise ValidationError({"q": ["give q, status or span_id"]})
        limit = _bounded_int(request, "limit", MAX_MATCHES, maximum=MAX_MATCHES) or 1
        offset = _bounded_int(request, "offset", 0, maximum=MAX_CANDIDATES)
        result = span_search(
            run_id=run.id, text=text, status=status, span_id=span_id.lower(),
            limit=limit, offset=offset,
        )  # fmt: skip
        spans = [*result.ancestors, *result.matches]
        return Response(
            {
                "count": result.count,
                "truncated": result.truncated,
                "matches": [
                    {"span_id": s.span_id, "path": result.paths[s.span_id]}
                    for s in result.matches
                ],
                "spans": [redact(span_event_payload(s)) for s in spans],
            }
        )


class SpanSubtreeApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(responses={200: dict})
    def get(self, request: Request, span_pk: int) -> Response:
        """Totals of a span and everything under it: spans, errors, tokens,
        cost, time in model calls, in tools and waiting for a person."""
        tenant = tenant_of(request).tenant
        span = selectors.span_for_tenant(tenant=tenant, span_pk=span_pk)
        if span is None:
            raise NotFound("No such span.")
        totals = span_subtree_totals(run_id=span.run_id, span=span, now=timezone.now())
        cost = run_steps_cost(run=span.run, indexes=totals.step_indexes)
        body = totals.as_dict()
        total = cost + Decimal(str(totals.cost_attributes))
        body["cost"] = str(total.quantize(Decimal("0.000001")))
        body["span_id"] = span.span_id
        return Response(body)


class TraceRunApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(responses={200: RunDetailSerializer, 400: ErrorSerializer})
    def get(self, request: Request, trace_id: str) -> Response:
        """The run a trace id names: an agent run of this control plane, or the
        external run an instrumented agent's spans made (POST /v1/traces)."""
        if not re.fullmatch(TRACE_ID_PATTERN, trace_id):
            raise ValidationError({"trace_id": ["a trace_id is 32 hex digits"]})
        tenant = tenant_of(request).tenant
        run_id = run_id_for_trace(tenant=tenant, trace_id=trace_id)
        run = run_get_for(tenant=tenant, run_id=run_id) if run_id else None
        if run is None:
            raise NotFound("No run of this trace in this tenant.")
        return Response(RunDetailSerializer(run).data)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


@csrf_exempt
@require_POST
@declares(Action.TRACE_INGEST)
def otlp_traces(request: HttpRequest) -> HttpResponse:
    """OTLP/HTTP `POST /v1/traces`: protobuf or JSON, gzip allowed, tenant token."""
    checked = otlp_http_request(request)
    if isinstance(checked, HttpResponse):
        return checked
    try:
        spans = parse_request(checked.body, content_type=checked.content_type)
    except LimitExceeded as exc:
        return otlp_error(413, "too_large", str(exc))
    except IngestError as exc:
        return otlp_error(400, "invalid", str(exc))
    context = checked.caller.context
    result = ingest_spans(
        tenant=context.tenant, user=checked.caller.token.user, spans=spans
    )
    # OTLP/HTTP: an ExportTraceServiceResponse; the empty one means all accepted,
    # a partial success counts and explains the spans refused.
    message = "; ".join(result.errors)
    if checked.json:
        if not result.rejected:
            return JsonResponse({})
        return JsonResponse(
            {
                "partialSuccess": {
                    # int64 is a string in proto JSON
                    "rejectedSpans": str(result.rejected),
                    "errorMessage": message,
                }
            }
        )
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = message
    return HttpResponse(
        response.SerializeToString(), content_type="application/x-protobuf"
    )
