"""Agents API: the agents of the caller's tenant (for the start-a-run form)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs import selectors


class AgentSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    name = serializers.CharField(default="")
    model = serializers.CharField(default="")


class AgentListApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ}

    @extend_schema(responses=AgentSerializer(many=True))
    def get(self, request: Request) -> Response:
        agents = selectors.agent_list_for(tenant=tenant_of(request).tenant)
        return Response(AgentSerializer(agents, many=True).data)
