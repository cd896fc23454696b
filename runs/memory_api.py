"""End users' memory for the tenant's members: list, read, and delete (admins).

GET /api/v1/end-users/ lists the end users with memory; GET and DELETE
/api/v1/end-users/<end_user>/memory/ read and delete one end user's (DELETE
with `?path=` deletes one file). Another tenant's end user is simply not there.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import remote_addr
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs.memory import (
    ENTRY_SEPARATOR,
    MemoryRefused,
    memory_delete,
    memory_end_users_for,
    memory_files_for,
)
from runs.services.lifecycle import END_USER_PATTERN


class EndUserSerializer(serializers.Serializer[Any]):
    end_user = serializers.CharField()
    files = serializers.IntegerField()
    chars = serializers.IntegerField()
    updated_at = serializers.DateTimeField()


class MemoryEntrySerializer(serializers.Serializer[Any]):
    date = serializers.CharField()
    text = serializers.CharField()
    line = serializers.SerializerMethodField()

    def get_line(self, entry: dict[str, Any]) -> str:
        return f"{entry['date']}{ENTRY_SEPARATOR}{entry['text']}"


class MemoryFileSerializer(serializers.Serializer[Any]):
    path = serializers.CharField()
    entries = MemoryEntrySerializer(many=True)
    size_chars = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class EndUserMemorySerializer(serializers.Serializer[Any]):
    end_user = serializers.CharField()
    files = MemoryFileSerializer(many=True)


class MemoryDeletedSerializer(serializers.Serializer[Any]):
    end_user = serializers.CharField()
    deleted = serializers.IntegerField(help_text="memory files deleted")


def _end_user(raw: str) -> str:
    if not END_USER_PATTERN.fullmatch(raw):
        raise NotFound("No such end user in this tenant.")
    return raw


class EndUserListApi(APIView):
    gate: Gate = {"GET": Action.MEMORY_READ}

    @extend_schema(responses=EndUserSerializer(many=True))
    def get(self, request: Request) -> Response:
        rows = memory_end_users_for(tenant=tenant_of(request).tenant)[:500]
        return Response(EndUserSerializer(rows, many=True).data)


class EndUserMemoryApi(APIView):
    gate: Gate = {"GET": Action.MEMORY_READ, "DELETE": Action.MEMORY_DELETE}

    @extend_schema(responses=EndUserMemorySerializer)
    def get(self, request: Request, end_user: str) -> Response:
        end_user = _end_user(end_user)
        files = memory_files_for(tenant=tenant_of(request).tenant, end_user=end_user)
        if not files.exists():
            raise NotFound(f"No memory is kept for end user {end_user!r}.")
        body = {"end_user": end_user, "files": list(files)}
        return Response(EndUserMemorySerializer(body).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "path", OpenApiTypes.STR, description="delete only this file"
            )
        ],
        responses=MemoryDeletedSerializer,
    )
    def delete(self, request: Request, end_user: str) -> Response:
        context = tenant_of(request)
        end_user = _end_user(end_user)
        try:
            deleted = memory_delete(
                tenant=context.tenant,
                end_user=end_user,
                actor=context.user,
                path=request.query_params.get("path", ""),
                remote_addr=remote_addr(request),
            )
        except MemoryRefused as refused:
            raise ValidationError({"path": [str(refused)]}) from refused
        if not deleted:
            raise NotFound(f"No memory is kept for end user {end_user!r}.")
        return Response({"end_user": end_user, "deleted": deleted})
