"""MCP servers API: admins register, refresh, accept and configure; every member
reads. A server's tools carry their pin status: `changed` tools are disabled
until an admin accepts the definition listed now."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import remote_addr
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs import selectors
from runs.engine.contracts import ContractError, parse_quota
from runs.mcp.endpoint import mcp_model_name
from runs.models import McpServer, McpTool
from runs.services import mcp as services

SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"


class McpToolSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    ref = serializers.SerializerMethodField(help_text="the agent's tool ref")
    model_name = serializers.SerializerMethodField(help_text="the name the model sees")
    status = serializers.ChoiceField(choices=McpTool.Status.choices)
    problem = serializers.CharField()
    description = serializers.CharField(help_text="as the server lists it now")
    input_schema = serializers.JSONField()
    annotations = serializers.JSONField(help_text="the server's hints; not believed")
    definition_sha256 = serializers.CharField()
    accepted_sha256 = serializers.CharField()
    accepted_description = serializers.CharField()
    accepted_input_schema = serializers.JSONField()
    accepted_at = serializers.DateTimeField(allow_null=True)
    effect = serializers.CharField(help_text="set by the tenant; empty: unknown")
    idempotency = serializers.CharField()
    requires_approval = serializers.BooleanField()
    timeout_seconds = serializers.IntegerField()
    quota = serializers.CharField(help_text="cost.quota, e.g. 5/run;100/day")
    last_seen_at = serializers.DateTimeField(allow_null=True)

    def get_ref(self, tool: McpTool) -> str:
        return f"mcp:{tool.server.slug}/{tool.name}"

    def get_model_name(self, tool: McpTool) -> str:
        return mcp_model_name(tool.server.slug, tool.name)


class McpServerSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    name = serializers.CharField()
    transport = serializers.ChoiceField(choices=McpServer.Transport.choices)
    url = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField())
    auth_secret = serializers.CharField(help_text="a secret's name; never its value")
    network = serializers.ListField(child=serializers.CharField())
    credentials = serializers.JSONField(
        help_text="a stdio server's egress credentials by HOST:PORT: secret names"
    )
    enabled = serializers.BooleanField()
    last_refresh_at = serializers.DateTimeField(allow_null=True)
    last_refresh_status = serializers.CharField()
    last_refresh_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    tools = McpToolSerializer(many=True)


class McpServerInputSerializer(serializers.Serializer[Any]):
    slug = serializers.RegexField(SLUG_PATTERN)
    name = serializers.CharField(max_length=200, required=False, default="")
    transport = serializers.ChoiceField(choices=McpServer.Transport.choices)
    url = serializers.URLField(
        max_length=500, required=False, default="", allow_blank=True
    )
    command = serializers.ListField(
        child=serializers.CharField(max_length=1000, trim_whitespace=False),
        max_length=64,
        required=False,
        default=list,
    )
    auth_secret = serializers.RegexField(
        r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", required=False, default="", allow_blank=True
    )
    network = serializers.ListField(
        child=serializers.CharField(max_length=300),
        max_length=32,
        required=False,
        default=list,
    )
    # {"HOST:PORT": {"secret", "header", "prefix", "tls"}}: checked in the service
    # with the agents' egress validator, each problem named by its path.
    credentials = serializers.DictField(
        child=serializers.JSONField(), required=False, default=dict
    )


class McpServerUpdateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, required=False)
    enabled = serializers.BooleanField(required=False)


class McpToolUpdateSerializer(serializers.Serializer[Any]):
    effect = serializers.ChoiceField(
        choices=[("", "unknown"), *McpTool.Effect.choices], required=False
    )
    idempotency = serializers.ChoiceField(
        choices=McpTool.Idempotency.choices, required=False
    )
    requires_approval = serializers.BooleanField(required=False)
    # Below the step's hard time limit, with the session's grace and teardown.
    timeout_seconds = serializers.IntegerField(
        min_value=1, max_value=120, required=False
    )
    quota = serializers.CharField(
        max_length=200,
        allow_blank=True,
        required=False,
        help_text="calls per run or per tenant period: [bucket:]COUNT/PERIOD joined "
        "by ';', PERIOD one of run, minute, hour, day, week (e.g. 5/run;100/day)",
    )

    def validate_quota(self, value: str) -> str:
        try:
            parse_quota(value, tool_name="tool")
        except ContractError as invalid:
            raise ValidationError(str(invalid)) from None
        return value.strip()


class McpToolAcceptSerializer(serializers.Serializer[Any]):
    definition_sha256 = serializers.RegexField(
        r"^[0-9a-f]{64}$", help_text="the definition the admin reviewed"
    )


class McpRefreshSerializer(serializers.Serializer[Any]):
    added = serializers.ListField(child=serializers.CharField())
    changed = serializers.ListField(child=serializers.CharField())
    removed = serializers.ListField(child=serializers.CharField())
    restored = serializers.ListField(child=serializers.CharField())
    invalid = serializers.ListField(child=serializers.CharField())
    server = McpServerSerializer()


def _server(request: Request, server_id: uuid.UUID) -> McpServer:
    found = (
        selectors.mcp_server_list_for(tenant=tenant_of(request).tenant)
        .filter(id=server_id)
        .first()
    )
    if found is None:
        raise NotFound("No such MCP server in this tenant.")
    return found


def _tool(request: Request, server_id: uuid.UUID, name: str) -> McpTool:
    found = selectors.mcp_tool_for(
        tenant=tenant_of(request).tenant, server_id=server_id, name=name
    )
    if found is None:
        raise NotFound("No such tool on this MCP server.")
    return found


def _valid(serializer_class: type[serializers.Serializer[Any]], data: Any) -> Any:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class McpServerListApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ, "POST": Action.MCP_WRITE}

    @extend_schema(responses=McpServerSerializer(many=True))
    def get(self, request: Request) -> Response:
        servers = selectors.mcp_server_list_for(tenant=tenant_of(request).tenant)
        return Response(McpServerSerializer(servers, many=True).data)

    @extend_schema(
        request=McpServerInputSerializer,
        responses={201: McpServerSerializer},
        description=(
            "Register a server: its tools are listed now and pinned. A server that "
            "does not answer, answers something other than MCP or lists too many "
            "tools is a 400 naming the field; nothing is created."
        ),
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        data = _valid(McpServerInputSerializer, request.data)
        try:
            server = services.mcp_server_register(
                tenant=context.tenant,
                actor=context.user,
                data=data,
                remote_addr=remote_addr(request),
            )
        except services.McpInputError as invalid:
            raise ValidationError(invalid.fields) from None
        fresh = _server(request, server.id)
        return Response(McpServerSerializer(fresh).data, status=status.HTTP_201_CREATED)


class McpServerDetailApi(APIView):
    gate: Gate = {
        "GET": Action.AGENT_READ,
        "PATCH": Action.MCP_WRITE,
        "DELETE": Action.MCP_WRITE,
    }

    @extend_schema(responses=McpServerSerializer)
    def get(self, request: Request, server_id: uuid.UUID) -> Response:
        return Response(McpServerSerializer(_server(request, server_id)).data)

    @extend_schema(request=McpServerUpdateSerializer, responses=McpServerSerializer)
    def patch(self, request: Request, server_id: uuid.UUID) -> Response:
        context = tenant_of(request)
        server = _server(request, server_id)
        data = _valid(McpServerUpdateSerializer, request.data)
        services.mcp_server_update(
            server=server, actor=context.user, data=data,
            remote_addr=remote_addr(request),
        )  # fmt: skip
        return Response(McpServerSerializer(_server(request, server_id)).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, server_id: uuid.UUID) -> Response:
        context = tenant_of(request)
        services.mcp_server_delete(
            server=_server(request, server_id),
            actor=context.user,
            remote_addr=remote_addr(request),
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class McpServerRefreshApi(APIView):
    gate: Gate = {"POST": Action.MCP_WRITE}

    @extend_schema(
        request=None,
        responses=McpRefreshSerializer,
        description=(
            "List the server's tools again. A tool whose definition changed is "
            "disabled (`changed`) until an admin accepts it; one no longer listed "
            "is `removed`. A server that fails to answer is a 400 and changes "
            "nothing."
        ),
    )
    def post(self, request: Request, server_id: uuid.UUID) -> Response:
        context = tenant_of(request)
        server = _server(request, server_id)
        try:
            changes = services.mcp_server_refresh(
                server=server, actor=context.user, remote_addr=remote_addr(request)
            )
        except services.McpInputError as invalid:
            raise ValidationError(invalid.fields) from None
        body = {**changes.to_dict(), "server": _server(request, server_id)}
        return Response(McpRefreshSerializer(body).data)


class McpToolDetailApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ, "PATCH": Action.MCP_WRITE}

    @extend_schema(responses=McpToolSerializer)
    def get(self, request: Request, server_id: uuid.UUID, tool_name: str) -> Response:
        return Response(McpToolSerializer(_tool(request, server_id, tool_name)).data)

    @extend_schema(request=McpToolUpdateSerializer, responses=McpToolSerializer)
    def patch(self, request: Request, server_id: uuid.UUID, tool_name: str) -> Response:
        context = tenant_of(request)
        tool = _tool(request, server_id, tool_name)
        data = _valid(McpToolUpdateSerializer, request.data)
        services.mcp_tool_configure(
            tool=tool, actor=context.user, data=data, remote_addr=remote_addr(request)
        )
        return Response(McpToolSerializer(_tool(request, server_id, tool_name)).data)


class McpToolAcceptApi(APIView):
    gate: Gate = {"POST": Action.MCP_WRITE}

    @extend_schema(
        request=McpToolAcceptSerializer,
        responses={200: McpToolSerializer, 409: McpToolSerializer},
        description=(
            "Accept the definition a `changed` tool lists now, naming the "
            "`definition_sha256` reviewed; 409 if it is not changed or moved on."
        ),
    )
    def post(self, request: Request, server_id: uuid.UUID, tool_name: str) -> Response:
        context = tenant_of(request)
        tool = _tool(request, server_id, tool_name)
        data = _valid(McpToolAcceptSerializer, request.data)
        try:
            services.mcp_tool_accept(
                tool=tool,
                actor=context.user,
                definition_sha256=data["definition_sha256"],
                remote_addr=remote_addr(request),
            )
        except services.McpInputError as invalid:
            raise ValidationError(invalid.fields) from None
        except services.McpConflict as conflict:
            current = _tool(request, server_id, tool_name)
            return Response(
                {
                    "error": {"code": "conflict", "message": str(conflict)},
                    "tool": McpToolSerializer(current).data,
                },
                status=status.HTTP_409_CONFLICT,
            )
        return Response(McpToolSerializer(_tool(request, server_id, tool_name)).data)
