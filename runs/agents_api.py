"""Agents API: the tenant's agents, their versions and model endpoints.

Everyone in the tenant reads them (operators start runs from them); admins
create, edit (each edit is a new version), disable, delete and restore them
(docs/agents.md). An invalid definition is a 400 naming the field; nothing is
written.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api_input import query_params, reject_unknown_fields, remote_addr
from controlplane.api_schema import ErrorSerializer
from controlplane.permissions import Action, Gate
from controlplane.tenancy import tenant_of
from runs import selectors
from runs.engine.disclosure import (
    MAX_SKILL_NAME_CHARS,
    MAX_SKILL_SUMMARY_CHARS,
    MAX_SKILLS,
)
from runs.engine.guardrails import MAX_GUARDRAILS
from runs.engine.hooks import MAX_HOOKS
from runs.models import Agent, AgentVersion, ModelEndpoint
from runs.services import agents as services
from runs.services.agent_validation import (
    APPROVAL_CHOICES,
    EXPOSURE_CHOICES,
    MAX_MODELS,
    MAX_PROMPT_CHARS,
    MAX_SCRIPT_REPLIES,
    MAX_TOOLS,
)
from runs.services.subagent_config import MAX_SUBAGENTS

CONFIG_FIELDS = set(AgentVersion.CONFIG_FIELDS)
MAX_VERSION_NUMBER = 2**31 - 1


class SkillSerializer(serializers.Serializer[Any]):
    """One skill: the prompt lists its name and summary; load_skill returns its
    body (at most MAX_SKILL_BODY_BYTES of Markdown)."""

    name = serializers.SlugField(max_length=MAX_SKILL_NAME_CHARS)
    summary = serializers.CharField(max_length=MAX_SKILL_SUMMARY_CHARS)
    body = serializers.CharField()


class AgentVersionSerializer(serializers.Serializer[Any]):
    number = serializers.IntegerField()
    name = serializers.CharField()
    endpoint = serializers.CharField(source="endpoint.slug")
    model = serializers.CharField()
    fallback_endpoint = serializers.CharField(
        source="fallback_endpoint.slug", allow_null=True
    )
    fallback_model = serializers.CharField()
    evaluated_models = serializers.ListField(child=serializers.CharField())
    system_prompt = serializers.CharField()
    skills = SkillSerializer(many=True)
    tools = serializers.ListField(child=serializers.CharField())
    tool_settings = serializers.DictField(child=serializers.DictField())
    default_limits = serializers.DictField()
    evaluator = serializers.CharField()
    script = serializers.ListField(child=serializers.DictField())
    guardrails = serializers.ListField(child=serializers.DictField())
    hooks = serializers.ListField(child=serializers.DictField())
    compaction_threshold = serializers.FloatField()
    subagents = serializers.ListField(child=serializers.DictField())
    created_by = serializers.CharField(source="created_by.username", allow_null=True)
    created_at = serializers.DateTimeField()


class AgentSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    name = serializers.CharField()
    disabled = serializers.BooleanField()
    # The current version's number, endpoint and model (null: an agent that
    # only names runs sent over OTLP).
    version = serializers.IntegerField(source="current_version.number", allow_null=True)
    endpoint = serializers.CharField(
        source="current_version.endpoint.slug", allow_null=True
    )
    model = serializers.CharField(source="current_version.model", allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class AgentDetailSerializer(AgentSerializer):
    current_version = AgentVersionSerializer(allow_null=True)


class ToolSettingsSerializer(serializers.Serializer[Any]):
    """The settings of one of the agent's tools (all optional)."""

    approval = serializers.ChoiceField(choices=APPROVAL_CHOICES, required=False)
    exposure = serializers.ChoiceField(choices=EXPOSURE_CHOICES, required=False)
    network = serializers.ListField(
        child=serializers.CharField(max_length=300), required=False, max_length=100
    )
    credentials = serializers.DictField(child=serializers.DictField(), required=False)


class AgentConfigInputSerializer(serializers.Serializer[Any]):
    """An agent version's configuration; endpoints are named by their slugs."""

    name = serializers.CharField(max_length=200)
    endpoint = serializers.SlugField(max_length=64)
    model = serializers.CharField(max_length=200)
    fallback_endpoint = serializers.SlugField(
        max_length=64, required=False, allow_null=True
    )
    fallback_model = serializers.CharField(
        max_length=200, required=False, allow_blank=True
    )
    evaluated_models = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        max_length=MAX_MODELS,
    )
    system_prompt = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_PROMPT_CHARS,
    )
    # Each skill's shape and size is checked by the service, which names the
    # path (`skills[0].body`) of what to fix.
    skills = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=MAX_SKILLS
    )
    tools = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        max_length=MAX_TOOLS,
    )
    tool_settings = serializers.DictField(
        child=ToolSettingsSerializer(), required=False
    )
    default_limits = serializers.DictField(required=False)
    evaluator = serializers.CharField(max_length=100, required=False, allow_blank=True)
    script = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=MAX_SCRIPT_REPLIES
    )
    # Each checked by the service (runs.services.guard_config), by position.
    guardrails = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=MAX_GUARDRAILS
    )
    hooks = serializers.ListField(
        child=serializers.DictField(), required=False, max_length=MAX_HOOKS
    )
    # Checked by the service (a share of the model's context window).
    compaction_threshold = serializers.FloatField(required=False)
    # Slugs or {agent, description}: checked by the service (known agents of
    # the tenant, no cycle), which names the field.
    subagents = serializers.ListField(required=False, max_length=MAX_SUBAGENTS)


class AgentCreateInputSerializer(AgentConfigInputSerializer):
    slug = serializers.SlugField(max_length=64)


def _config_of(request: Request, *, partial: bool, create: bool = False) -> Any:
    allowed = CONFIG_FIELDS | ({"slug"} if create else set())
    reject_unknown_fields(request, allowed)
    shape = AgentCreateInputSerializer if create else AgentConfigInputSerializer
    body = shape(data=request.data, partial=partial)
    body.is_valid(raise_exception=True)
    # The service checks the values themselves (it is also what the demo and
    # commands call): what the client sent, not the serializer's coercions.
    return {name: request.data[name] for name in body.validated_data}


def _agent_or_404(request: Request, agent_id: Any) -> Agent:
    agent = selectors.agent_get_for(tenant=tenant_of(request).tenant, agent_id=agent_id)
    if agent is None:
        raise NotFound("No such agent in this tenant.")
    return agent


def _detail(request: Request, agent: Agent) -> dict[str, Any]:
    fresh = _agent_or_404(request, agent.id)
    return dict(AgentDetailSerializer(fresh).data)


class AgentListApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ, "POST": Action.AGENT_WRITE}

    @extend_schema(responses=AgentSerializer(many=True))
    def get(self, request: Request) -> Response:
        agents = selectors.agent_list_for(tenant=tenant_of(request).tenant)
        return Response(AgentSerializer(agents, many=True).data)

    @extend_schema(
        request=AgentCreateInputSerializer, responses={201: AgentDetailSerializer}
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        config = _config_of(request, partial=False, create=True)
        slug = config.pop("slug")
        try:
            agent = services.agent_create(
                tenant=context.tenant,
                actor=context.user,
                slug=slug,
                config=config,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise ValidationError(invalid.fields) from None
        return Response(_detail(request, agent), status=status.HTTP_201_CREATED)


class AgentDetailApi(APIView):
    gate: Gate = {
        "GET": Action.AGENT_READ,
        "PUT": Action.AGENT_WRITE,
        "PATCH": Action.AGENT_WRITE,
        "DELETE": Action.AGENT_WRITE,
    }

    @extend_schema(responses=AgentDetailSerializer)
    def get(self, request: Request, agent_id: str) -> Response:
        return Response(_detail(request, _agent_or_404(request, agent_id)))

    def _update(self, request: Request, agent_id: str, *, partial: bool) -> Response:
        agent = _agent_or_404(request, agent_id)
        config = _config_of(request, partial=partial)
        try:
            services.agent_update(
                agent=agent,
                actor=tenant_of(request).user,
                config=config,
                partial=partial,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise ValidationError(invalid.fields) from None
        except Agent.DoesNotExist:  # deleted meanwhile
            raise NotFound("No such agent in this tenant.") from None
        return Response(_detail(request, agent))

    @extend_schema(
        request=AgentConfigInputSerializer,
        responses=AgentDetailSerializer,
        description="Replace the agent's configuration: a new version (none when "
        "nothing changed). Fields left out take their defaults.",
    )
    def put(self, request: Request, agent_id: str) -> Response:
        return self._update(request, agent_id, partial=False)

    @extend_schema(
        request=AgentConfigInputSerializer(partial=True),
        responses=AgentDetailSerializer,
        description="Change some fields of the agent's configuration: a new "
        "version (none when nothing changed).",
    )
    def patch(self, request: Request, agent_id: str) -> Response:
        return self._update(request, agent_id, partial=True)

    @extend_schema(
        request=None,
        responses={204: None},
        description="Delete the agent (softly: its runs keep their versions; its "
        "slug may be used again).",
    )
    def delete(self, request: Request, agent_id: str) -> Response:
        agent = _agent_or_404(request, agent_id)
        try:
            services.agent_delete(
                agent=agent,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except Agent.DoesNotExist:
            raise NotFound("No such agent in this tenant.") from None
        return Response(status=status.HTTP_204_NO_CONTENT)


class _AgentSwitchApi(APIView):
    gate: Gate = {"POST": Action.AGENT_WRITE}
    disabled: bool

    def post(self, request: Request, agent_id: str) -> Response:
        agent = _agent_or_404(request, agent_id)
        try:
            services.agent_set_disabled(
                agent=agent,
                actor=tenant_of(request).user,
                disabled=self.disabled,
                remote_addr=remote_addr(request),
            )
        except Agent.DoesNotExist:
            raise NotFound("No such agent in this tenant.") from None
        return Response(_detail(request, agent))


class AgentDisableApi(_AgentSwitchApi):
    disabled = True

    @extend_schema(
        request=None,
        responses=AgentDetailSerializer,
        description="No new run starts from the agent; runs going on go on.",
    )
    def post(self, request: Request, agent_id: str) -> Response:
        return super().post(request, agent_id)


class AgentEnableApi(_AgentSwitchApi):
    disabled = False

    @extend_schema(request=None, responses=AgentDetailSerializer)
    def post(self, request: Request, agent_id: str) -> Response:
        return super().post(request, agent_id)


class AgentVersionListApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ}

    @extend_schema(responses=AgentVersionSerializer(many=True))
    def get(self, request: Request, agent_id: str) -> Response:
        versions = selectors.agent_versions_for(agent=_agent_or_404(request, agent_id))
        return Response(AgentVersionSerializer(versions, many=True).data)


def _version_or_404(agent: Agent, number: int) -> AgentVersion:
    # The URL's digits may be more than the column holds (a database error).
    in_range = 1 <= number <= MAX_VERSION_NUMBER
    version = (
        selectors.agent_versions_for(agent=agent).filter(number=number).first()
        if in_range
        else None
    )
    if version is None:
        raise NotFound(f"Agent {agent.slug} has no version {number}.")
    return version


class AgentVersionDetailApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ}

    @extend_schema(responses=AgentVersionSerializer)
    def get(self, request: Request, agent_id: str, number: int) -> Response:
        version = _version_or_404(_agent_or_404(request, agent_id), number)
        return Response(AgentVersionSerializer(version).data)


class AgentVersionRestoreApi(APIView):
    gate: Gate = {"POST": Action.AGENT_WRITE}

    @extend_schema(
        request=None,
        responses={201: AgentDetailSerializer},
        description="A new version equal to this one (it becomes the current).",
    )
    def post(self, request: Request, agent_id: str, number: int) -> Response:
        agent = _agent_or_404(request, agent_id)
        _version_or_404(agent, number)
        try:
            services.agent_version_restore(
                agent=agent,
                number=number,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise ValidationError(invalid.fields) from None
        except Agent.DoesNotExist:
            raise NotFound("No such agent in this tenant.") from None
        return Response(_detail(request, agent), status=status.HTTP_201_CREATED)


class VersionChangeSerializer(serializers.Serializer[Any]):
    field = serializers.CharField()
    a = serializers.JSONField(allow_null=True)
    b = serializers.JSONField(allow_null=True)


class VersionCompareSerializer(serializers.Serializer[Any]):
    a = serializers.IntegerField()
    b = serializers.IntegerField()
    changes = VersionChangeSerializer(many=True)


class AgentVersionCompareApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ}

    class CompareQuerySerializer(serializers.Serializer[Any]):
        a = serializers.IntegerField(min_value=1, max_value=MAX_VERSION_NUMBER)
        b = serializers.IntegerField(min_value=1, max_value=MAX_VERSION_NUMBER)

    @extend_schema(
        parameters=[CompareQuerySerializer],
        responses=VersionCompareSerializer,
        description="Field by field, what differs between versions a and b.",
    )
    def get(self, request: Request, agent_id: str) -> Response:
        agent = _agent_or_404(request, agent_id)
        wanted = query_params(request, self.CompareQuerySerializer)
        versions = {
            v.number: v
            for v in selectors.agent_versions_for(agent=agent).filter(
                number__in=[wanted["a"], wanted["b"]]
            )
        }
        missing = {
            key: [f"no version {wanted[key]}"]
            for key in ("a", "b")
            if wanted[key] not in versions
        }
        if missing:
            raise ValidationError(missing)
        changes = selectors.agent_versions_compare(
            versions[wanted["a"]], versions[wanted["b"]]
        )
        return Response({"a": wanted["a"], "b": wanted["b"], "changes": changes})


class ModelEndpointSerializer(serializers.Serializer[Any]):
    id = serializers.UUIDField()
    slug = serializers.CharField()
    name = serializers.CharField()
    kind = serializers.CharField()
    base_url = serializers.CharField()
    # The name of the tenant secret holding the key; its value is never shown.
    api_key_secret = serializers.CharField()
    options = serializers.DictField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ModelEndpointInputSerializer(serializers.Serializer[Any]):
    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(choices=ModelEndpoint.Kind.values)
    base_url = serializers.CharField(max_length=500, required=False, allow_blank=True)
    api_key_secret = serializers.CharField(
        max_length=64, required=False, allow_blank=True
    )
    options = serializers.DictField(required=False)


ENDPOINT_FIELDS = set(ModelEndpointInputSerializer().fields)


def _endpoint_input(request: Request, *, partial: bool) -> dict[str, Any]:
    reject_unknown_fields(request, ENDPOINT_FIELDS)
    body = ModelEndpointInputSerializer(data=request.data, partial=partial)
    body.is_valid(raise_exception=True)
    return {name: request.data[name] for name in body.validated_data}


def _endpoint_or_404(request: Request, endpoint_id: Any) -> ModelEndpoint:
    endpoint = selectors.model_endpoint_get_for(
        tenant=tenant_of(request).tenant, endpoint_id=endpoint_id
    )
    if endpoint is None:
        raise NotFound("No such model endpoint in this tenant.")
    return endpoint


class ModelEndpointListApi(APIView):
    gate: Gate = {"GET": Action.AGENT_READ, "POST": Action.AGENT_WRITE}

    @extend_schema(responses=ModelEndpointSerializer(many=True))
    def get(self, request: Request) -> Response:
        endpoints = selectors.model_endpoint_list_for(tenant=tenant_of(request).tenant)
        return Response(ModelEndpointSerializer(endpoints, many=True).data)

    @extend_schema(
        request=ModelEndpointInputSerializer, responses={201: ModelEndpointSerializer}
    )
    def post(self, request: Request) -> Response:
        context = tenant_of(request)
        try:
            endpoint = services.model_endpoint_create(
                tenant=context.tenant,
                actor=context.user,
                data=_endpoint_input(request, partial=False),
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise ValidationError(invalid.fields) from None
        return Response(
            ModelEndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED
        )


class ModelEndpointDetailApi(APIView):
    gate: Gate = {
        "GET": Action.AGENT_READ,
        "PUT": Action.AGENT_WRITE,
        "PATCH": Action.AGENT_WRITE,
        "DELETE": Action.AGENT_WRITE,
    }

    @extend_schema(responses=ModelEndpointSerializer)
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint_or_404(request, endpoint_id)
        return Response(ModelEndpointSerializer(endpoint).data)

    def _update(self, request: Request, endpoint_id: str, *, partial: bool) -> Response:
        endpoint = _endpoint_or_404(request, endpoint_id)
        try:
            endpoint = services.model_endpoint_update(
                endpoint=endpoint,
                actor=tenant_of(request).user,
                data=_endpoint_input(request, partial=partial),
                partial=partial,
                remote_addr=remote_addr(request),
            )
        except services.DefinitionError as invalid:
            raise ValidationError(invalid.fields) from None
        except ModelEndpoint.DoesNotExist:
            raise NotFound("No such model endpoint in this tenant.") from None
        return Response(ModelEndpointSerializer(endpoint).data)

    @extend_schema(
        request=ModelEndpointInputSerializer,
        responses=ModelEndpointSerializer,
        description="Replace the endpoint's settings (in place: versions that use "
        "it reach their model the new way from their runs' next step).",
    )
    def put(self, request: Request, endpoint_id: str) -> Response:
        return self._update(request, endpoint_id, partial=False)

    @extend_schema(
        request=ModelEndpointInputSerializer(partial=True),
        responses=ModelEndpointSerializer,
    )
    def patch(self, request: Request, endpoint_id: str) -> Response:
        return self._update(request, endpoint_id, partial=True)

    @extend_schema(
        request=None,
        responses={204: None, 409: ErrorSerializer},
        description="Delete an endpoint no agent version uses (409 names them).",
    )
    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = _endpoint_or_404(request, endpoint_id)
        try:
            services.model_endpoint_delete(
                endpoint=endpoint,
                actor=tenant_of(request).user,
                remote_addr=remote_addr(request),
            )
        except services.EndpointInUse as in_use:
            return Response(
                {"error": {"code": "conflict", "message": str(in_use)}},
                status=status.HTTP_409_CONFLICT,
            )
        except ModelEndpoint.DoesNotExist:
            raise NotFound("No such model endpoint in this tenant.") from None
        return Response(status=status.HTTP_204_NO_CONTENT)
