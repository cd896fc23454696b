"""The tenant's audit log over the API (admins only)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import selectors
from controlplane.api_input import BoundedPagination, query_params
from controlplane.permissions import Action, Gate
from controlplane.redaction import RedactedJSONField
from controlplane.tenancy import tenant_of


class AuditEventSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    actor = serializers.CharField(
        source="actor.username", allow_null=True, default=None
    )
    action = serializers.CharField()
    object_type = serializers.CharField()
    object_id = serializers.CharField()
    before = RedactedJSONField()
    after = RedactedJSONField()
    remote_addr = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class AuditListApi(APIView):
    """The tenant's audit log, newest first (admins only)."""

    gate: Gate = {"GET": Action.AUDIT_READ}
    pagination_class = BoundedPagination

    class AuditListQuerySerializer(serializers.Serializer[Any]):
        # An empty value means no filter, as it always has.
        action = serializers.CharField(required=False, allow_blank=True, max_length=64)
        object_type = serializers.CharField(
            required=False, allow_blank=True, max_length=64
        )
        object_id = serializers.CharField(
            required=False, allow_blank=True, max_length=64
        )

    @extend_schema(
        parameters=[AuditListQuerySerializer],
        responses=AuditEventSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        context = tenant_of(request)
        wanted = query_params(request, self.AuditListQuerySerializer)
        events = selectors.audit_events_for(
            tenant=context.tenant,
            action=wanted.get("action") or None,
            object_type=wanted.get("object_type") or None,
            object_id=wanted.get("object_id") or None,
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(events, request, view=self)
        return paginator.get_paginated_response(
            AuditEventSerializer(page, many=True).data
        )
