"""`/api/v1/runs/<id>/messages/`: send a steering or follow-up message to a run,
and list the run's messages with their state (docs/api.md, docs/engine.md)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_errors import error_body, too_large_message
from controlplane.api_input import remote_addr
from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedCharField
from controlplane.tenancy import tenant_of
from runs.api import RunConflictSerializer, run_conflict_response
from runs.engine.steering import MAX_STEERING_CHARS
from runs.models import Run, RunMessage
from runs.services.lifecycle import RunConflict, RunInputError
from runs.services.steering import run_message_send
from runs.steering_selectors import run_for_messages, run_messages


class RunMessageSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    text = RedactedCharField()
    author = serializers.CharField(source="author_name")
    state = serializers.SerializerMethodField(
        help_text="queued | delivered | dropped (the run was cancelled first)"
    )
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    delivered_before_step = serializers.IntegerField(
        allow_null=True, help_text="the step whose model call first saw it"
    )
    entry_id = serializers.CharField(help_text="its session log entry, once delivered")

    def get_state(self, message: RunMessage) -> str:
        # A cancelled run never takes another step: what it had not taken
        # yet will never be delivered.
        run_status = self.context.get("run_status")
        if message.state == RunMessage.State.QUEUED and run_status == "cancelled":
            return "dropped"
        return str(message.state)


class RunMessageInputSerializer(serializers.Serializer[Any]):
    text = serializers.CharField(
        trim_whitespace=False,
        max_length=MAX_STEERING_CHARS,
        help_text=f"1 to {MAX_STEERING_CHARS} characters, not blank",
    )


def _run_or_404(request: Request, run_id: str) -> Run:
    run = run_for_messages(tenant=tenant_of(request).tenant, run_id=run_id)
    if run is None:
        raise NotFound("No such run in this tenant.")
    return run


class RunMessagesApi(APIView):
    # Sending continues (or steers) work that spends the tenant's budget:
    # whoever may start runs may send (operators, admins).
    gate: Gate = {"GET": Action.RUN_READ, "POST": Action.RUN_START}

    @extend_schema(responses=RunMessageSerializer(many=True))
    def get(self, request: Request, run_id: str) -> Response:
        run = _run_or_404(request, run_id)
        rows = run_messages(run=run)
        context = {"run_status": run.status}
        return Response(RunMessageSerializer(rows, many=True, context=context).data)

    @extend_schema(
        request=RunMessageInputSerializer,
        responses={202: RunMessageSerializer, 409: RunConflictSerializer},
        description="Queue a message for the run. A queued, running or waiting "
        "run takes it at its next turn boundary (after the results of the "
        "current tool calls); a succeeded, failed or unverified run continues "
        "as a new turn of the same session. A cancelled, budget-exhausted or "
        "policy-blocked run is 409, and nothing is written.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = _run_or_404(request, run_id)
        try:
            data = request.data
        except RequestDataTooBig:
            message = (
                f"{too_large_message()} The text may have at most "
                f"{MAX_STEERING_CHARS} characters."
            )
            body = error_body("too_large", message, fields={"text": [message]})
            return Response(body, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        body_in = RunMessageInputSerializer(data=data)
        body_in.is_valid(raise_exception=True)
        context = tenant_of(request)
        try:
            sent = run_message_send(
                run=run,
                author=context.user,
                text=body_in.validated_data["text"],
                remote_addr=remote_addr(request),
            )
        except RunInputError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        except RunConflict as exc:
            return run_conflict_response(exc)
        return Response(
            RunMessageSerializer(sent).data, status=status.HTTP_202_ACCEPTED
        )
