"""`GET /api/v1/runs/<id>/session/`: a run's session log, and as `messages` the
context its leaf (or another entry, `?leaf=`) rebuilds to (docs/engine.md)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedJSONField
from controlplane.tenancy import tenant_of
from runs import selectors
from runs.engine.session import SessionEntry as Entry
from runs.engine.session import SessionLogError, build_context
from runs.models import SessionEntry


class Conflict(APIException):
    status_code = 409
    default_code = "conflict"


ENTRY_ID = serializers.RegexField(r"^[0-9a-f]{8}$", required=False)


class SessionEntrySerializer(serializers.Serializer[Any]):
    seq = serializers.IntegerField()
    # The run (branch) that wrote it: a branched session's tree spans runs.
    run = serializers.UUIDField(source="run_id")
    id = serializers.CharField(source="entry_id")
    parentId = serializers.SerializerMethodField()  # noqa: N815 - the spec's name
    type = serializers.CharField()
    payload = RedactedJSONField()
    created_at = serializers.DateTimeField()

    def get_parentId(self, entry: SessionEntry) -> str | None:  # noqa: N802
        return entry.parent_id or None


class RunSessionSerializer(serializers.Serializer[Any]):
    run = serializers.UUIDField()
    leaf = serializers.CharField(allow_null=True)
    # The branch the context is rebuilt from: `leaf` unless the query names one.
    context_leaf = serializers.CharField(allow_null=True)
    entries = SessionEntrySerializer(many=True)
    messages = RedactedJSONField()


class SessionQuerySerializer(serializers.Serializer[Any]):
    leaf = ENTRY_ID


class RunSessionApi(APIView):
    gate: Gate = {"GET": Action.RUN_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "leaf",
                OpenApiTypes.STR,
                description="rebuild the context from this entry (8 hex digits) "
                "instead of the current leaf",
            )
        ],
        responses=RunSessionSerializer,
    )
    def get(self, request: Request, run_id: str) -> Response:
        query = SessionQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        session = selectors.run_session_for(
            tenant=tenant_of(request).tenant, run_id=run_id
        )
        if session is None:
            raise NotFound("No such run in this tenant.")
        rows = list(session.entries)
        entries = {
            row.entry_id: Entry(
                row.seq, row.entry_id, row.parent_id or None, row.type, row.payload
            )
            for row in rows
        }
        leaf = query.validated_data.get("leaf", session.leaf)
        if leaf is not None and leaf not in entries:
            raise ValidationError({"leaf": [f"no entry {leaf} in this run's log"]})
        try:
            messages = build_context(entries, leaf) if leaf else []
        except SessionLogError as exc:
            # A branch whose source run was deleted (by hand or by retention)
            # lost the start of its path; its own entries are still listed.
            raise Conflict(f"the log cannot be rebuilt: {exc}") from exc
        body = {
            "run": session.run_id,
            "leaf": session.leaf,
            "context_leaf": leaf,
            "entries": rows,
            "messages": messages,
        }
        return Response(RunSessionSerializer(body).data)
