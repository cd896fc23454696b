"""Gates API: an agent running outside the control plane asks the tenant's
policy about a tool call (POST /api/v1/gates/) and waits for the answer by
long-poll (GET /api/v1/gates/<id>/?wait=N) or webhook (docs/external-agents.md).

The long-poll is an async view in front of the DRF one: the DRF view
authenticates, asks the permission gate and reads the gate; while it is pending
the async view waits on the gate's channel-layer group (a coroutine on Daphne's
loop, no thread) for at most `wait` seconds, then asks the DRF view again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_errors import error_body
from controlplane.api_input import query_params, reject_unknown_fields, remote_addr
from controlplane.api_schema import ErrorSerializer
from controlplane.idempotency import IDEMPOTENCY_KEY_PARAMETER, idempotent
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.engine.contracts import TOOL_NAME_PATTERN, Effect
from runs.selectors import gate_is_final, gate_list_for
from runs.services.gates import (
    GateAsk,
    GateConflict,
    GateInputError,
    GateKeyReused,
    gate_request,
    gate_view,
    group_of,
)

logger = logging.getLogger(__name__)

MAX_TTL_SECONDS = 30 * 24 * 3600
INPUT_FIELDS = {
    "tool",
    "arguments",
    "trace_id",
    "span_id",
    "input_schema",
    "effect",
    "agent",
    "idempotency_key",
    "webhook_url",
    "ttl_seconds",
}


class GateSerializer(serializers.Serializer[Any]):
    """A gate as answered, long-polled and posted to the webhook."""

    id = serializers.UUIDField()
    run_id = serializers.UUIDField(help_text="the external run of the trace")
    trace_id = serializers.CharField()
    tool = serializers.CharField()
    arguments = serializers.JSONField(
        help_text="the arguments to execute with: an approver's edit if there was "
        "one; values that look like secrets are shown redacted and stand for the "
        "ones the caller sent"
    )
    decision = serializers.ChoiceField(
        choices=["allow", "deny", "require_approval"], help_text="the policy's answer"
    )
    status = serializers.ChoiceField(
        choices=["allowed", "denied", "pending", "approved", "expired", "cancelled"]
    )
    final = serializers.BooleanField(help_text="false only while pending")
    rule = serializers.CharField(help_text="the policy rule that decided")
    reason = serializers.CharField(help_text="the policy's or the decider's reason")
    approval_id = serializers.UUIDField(allow_null=True)
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)


class _HexIdField(serializers.RegexField):
    def __init__(self, digits: int, **kwargs: Any) -> None:
        super().__init__(
            rf"^[0-9a-fA-F]{{{digits}}}$",
            error_messages={"invalid": f"{digits} hexadecimal digits, not all zero"},
            **kwargs,
        )

    def run_validation(self, data: Any = serializers.empty) -> Any:
        value = super().run_validation(data)  # the pattern is checked here
        if isinstance(value, str) and value:
            value = value.lower()
            if int(value, 16) == 0:
                self.fail("invalid")
        return value


class GateInputSerializer(serializers.Serializer[Any]):
    tool = serializers.RegexField(
        TOOL_NAME_PATTERN.pattern, max_length=64, help_text="the tool's name"
    )
    arguments = serializers.JSONField(help_text="a JSON object: the call's arguments")
    trace_id = _HexIdField(32, help_text="the agent's trace (its external run)")
    span_id = _HexIdField(
        16,
        required=False,
        default="",
        allow_blank=True,
        help_text="the caller's current span: the approval is drawn under it",
    )
    input_schema = serializers.JSONField(
        required=False,
        default=None,
        help_text="JSON Schema the arguments are checked against (strictly); a tool "
        "the tenant knows (built-in, MCP) is checked against its own contract",
    )
    effect = serializers.ChoiceField(
        choices=[str(e) for e in Effect],
        required=False,
        default=None,
        allow_null=True,
        help_text="what the call does (default write); the policy reads it",
    )
    agent = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=100,
        help_text="the agent's service name, shown in the UI",
    )  # fmt: skip
    idempotency_key = serializers.CharField(
        required=False, default=None, allow_null=True, min_length=1, max_length=255,
        help_text="the same key and request give the same gate (200)",
    )  # fmt: skip
    webhook_url = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=2000,
        help_text="POSTed the final gate, signed with the tenant secret gate_webhook",
    )  # fmt: skip
    ttl_seconds = serializers.IntegerField(
        required=False, default=None, allow_null=True, min_value=1,
        max_value=MAX_TTL_SECONDS,
        help_text="wait at most this long for a decision (the rule's may be shorter)",
    )  # fmt: skip

    def validate_arguments(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value

    def validate_input_schema(self, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON Schema object")
        return value


class GateListApi(APIView):
    gate: Gate = {"POST": Action.GATE_REQUEST}

    @extend_schema(
        request=GateInputSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            201: GateSerializer,
            200: OpenApiResponse(
                GateSerializer, description="the gate of an earlier request with "
                "this idempotency_key",
            ),
            400: ErrorSerializer,
            409: OpenApiResponse(
                ErrorSerializer, description="`trace_unavailable`: the trace is not "
                "this tenant's; `trace_of_native_run`: it is a native run's",
            ),
            413: ErrorSerializer,
            422: OpenApiResponse(
                ErrorSerializer, description="`idempotency_key_reused`",
            ),
        },
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        """Ask the tenant's policy about an external agent's tool call."""
        too_large = _too_large(request)
        if too_large is not None:
            return too_large
        context = tenant_of(request)
        return idempotent(
            request,
            tenant=context.tenant,
            operation="gate.request",
            respond=lambda: self._ask(request),
        )

    def _ask(self, request: Request) -> Response:
        context = tenant_of(request)
        reject_unknown_fields(request, INPUT_FIELDS)
        body = GateInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        ask = GateAsk(**body.validated_data)
        try:
            gate, created = gate_request(
                tenant=context.tenant,
                user=context.user,
                ask=ask,
                remote_addr=remote_addr(request),
            )
        except GateInputError as invalid:
            raise ValidationError({invalid.field: [str(invalid)]}) from None
        except GateConflict as conflict:
            return Response(
                error_body(conflict.code, str(conflict)),
                status=status.HTTP_409_CONFLICT,
            )
        except GateKeyReused as reused:
            return Response(
                error_body("idempotency_key_reused", str(reused)),
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        fresh = gate_list_for(tenant=context.tenant).get(id=gate.id)
        return Response(
            gate_view(fresh),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


def _too_large(request: Request) -> Response | None:
    """A body over GATE_MAX_BODY_BYTES is refused before it is parsed (413)."""
    limit = int(settings.GATE_MAX_BODY_BYTES)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    size = declared or len(request.body)
    if size <= limit:
        return None
    return Response(
        error_body(
            "too_large",
            f"the gate request is {size} bytes; at most {limit} are accepted "
            "(GATE_MAX_BODY_BYTES): send the arguments a person must see, not bulk "
            "data",
        ),
        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    )


class GateDetailApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    class WaitQuerySerializer(serializers.Serializer[Any]):
        wait = serializers.IntegerField(
            required=False,
            default=0,
            min_value=0,
            max_value=settings.GATE_WAIT_MAX_SECONDS,
            help_text="seconds to wait for a pending gate's decision (long-poll); "
            "the answer comes at once when the gate is final or decided",
        )

    @extend_schema(parameters=[WaitQuerySerializer], responses=GateSerializer)
    def get(self, request: Request, gate_id: uuid.UUID) -> Response:
        """The gate; with `wait`, held until it is final or `wait` seconds pass."""
        query_params(request, self.WaitQuerySerializer)
        context = tenant_of(request)
        gate = get_object_or_404(gate_list_for(tenant=context.tenant), id=gate_id)
        return Response(gate_view(gate))


_gate_detail_sync = GateDetailApi.as_view()
_waiting = 0  # long-polls this process holds now


async def gate_detail(request: HttpRequest, gate_id: uuid.UUID) -> HttpResponse:
    """GET /api/v1/gates/<id>/: the DRF view's answer; for a pending gate asked
    to `wait`, the answer once it is final or the wait is over."""
    global _waiting
    first: Any = await sync_to_async(_gate_detail_sync)(request, gate_id=gate_id)
    wait = _wait_of(request)
    if (
        request.method != "GET"
        or first.status_code != 200
        or wait <= 0
        or first.data["final"]
        or _waiting >= settings.GATE_WAITERS_MAX
    ):
        return first  # type: ignore[no-any-return]
    _waiting += 1
    try:
        await sync_to_async(connections.close_all)()  # see _is_final
        await _until_final(gate_id, wait)
    finally:
        _waiting -= 1
    again: HttpResponse = await sync_to_async(_gate_detail_sync)(
        request, gate_id=gate_id
    )
    return again


# Read by drf-spectacular and the permission-gate walk (tests/test_gate_coverage.py)
# as the DRF view it fronts.
gate_detail.cls = GateDetailApi  # type: ignore[attr-defined]
gate_detail.initkwargs = {}  # type: ignore[attr-defined]
gate_detail.csrf_exempt = True  # type: ignore[attr-defined]


def _wait_of(request: HttpRequest) -> float:
    raw = request.GET.get("wait", "0")
    return float(raw) if raw.isdigit() else 0.0  # the DRF view refused bad ones


async def _until_final(gate_id: uuid.UUID, seconds: float) -> None:
    """Return when the gate is final (told through its group, or re-read) or
    after `seconds`. Subscribed before the re-read, so a decision that lands
    between the two is seen either way."""
    layer = get_channel_layer()
    group = group_of(gate_id)
    try:
        channel = await layer.new_channel(prefix="gate-wait")
        await layer.group_add(group, channel)
    except Exception:  # noqa: BLE001 - without the layer, re-read each second
        logger.warning("gate long-poll: channel layer unavailable", exc_info=True)
        await _poll(gate_id, seconds)
        return
    try:
        if await sync_to_async(_is_final)(gate_id):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(layer.receive(channel), seconds)
    finally:
        with contextlib.suppress(Exception):
            await layer.group_discard(group, channel)


def _is_final(gate_id: uuid.UUID) -> bool:
    """Whether the gate is final, read with a connection given back to the pool
    at once: a long-poll holds none while it waits, or a few waiters would
    take every pooled connection the process has."""
    try:
        return gate_is_final(gate_id=gate_id)
    finally:
        connections.close_all()


async def _poll(gate_id: uuid.UUID, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if await sync_to_async(_is_final)(gate_id):
            return
        await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))
