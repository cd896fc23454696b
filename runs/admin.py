"""Agents, their versions and model endpoints in the Django admin (superusers).

Changes go through the same services as the API, so they are validated,
versioned and audited: an agent's configuration is edited through the API or
the Agents page (each edit a new version), here it is only disabled or enabled;
a version never changes; an endpoint is edited in place.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from runs.models import Agent, AgentVersion, ModelEndpoint
from runs.services.agent_validation import endpoint_validate
from runs.services.agents import (
    DefinitionError,
    EndpointInUse,
    agent_set_disabled,
    model_endpoint_delete,
    model_endpoint_update,
)

VERSION_SUMMARY = ["number", "name", "endpoint", "model", "created_by", "created_at"]
ENDPOINT_FIELDS = ["slug", "name", "kind", "base_url", "api_key_secret", "options"]


class AgentVersionInline(admin.TabularInline[AgentVersion, Agent]):
    model = AgentVersion
    fk_name = "agent"
    fields = tuple(VERSION_SUMMARY)
    readonly_fields = VERSION_SUMMARY
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin[Agent]):
    list_display = [
        "slug",
        "name",
        "tenant",
        "current_version",
        "disabled",
        "deleted_at",
    ]
    list_filter = ["disabled", "tenant"]
    search_fields = ["slug", "name"]
    readonly_fields = [
        "tenant",
        "slug",
        "name",
        "disabled",
        "deleted_at",
        "current_version",
        "created_at",
        "updated_at",
    ]
    inlines = [AgentVersionInline]
    actions = ["disable", "enable"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # through the API or the Agents page: version 1, audited

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting is soft, through the API: runs keep their versions

    @admin.action(description="Disable the selected agents (no new runs)")
    def disable(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            agent_set_disabled(agent=agent, actor=request.user, disabled=True)  # type: ignore[arg-type]

    @admin.action(description="Enable the selected agents")
    def enable(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            agent_set_disabled(agent=agent, actor=request.user, disabled=False)  # type: ignore[arg-type]


@admin.register(AgentVersion)
class AgentVersionAdmin(admin.ModelAdmin[AgentVersion]):
    list_display = ["agent", "number", "name", "endpoint", "model", "created_at"]
    list_filter = ["agent__tenant"]
    readonly_fields = [
        "agent",
        "number",
        "created_by",
        "created_at",
        *AgentVersion.CONFIG_FIELDS,
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a version never changes: an edit is a new version

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ModelEndpointForm(forms.ModelForm[ModelEndpoint]):
    class Meta:
        model = ModelEndpoint
        fields = ENDPOINT_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            endpoint_validate(
                tenant=self.instance.tenant,
                data={name: data.get(name) for name in ENDPOINT_FIELDS},
                instance=self.instance,
            )
        except DefinitionError as invalid:
            for field, problems in invalid.fields.items():
                self.add_error(field if field in self.fields else None, problems)
        return data


@admin.register(ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin[ModelEndpoint]):
    form = ModelEndpointForm
    list_display = ["slug", "name", "tenant", "kind", "base_url", "api_key_secret"]
    list_filter = ["kind", "tenant"]
    readonly_fields = ["tenant", "created_at", "updated_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # created in a tenant through the API or the Agents page

    def save_model(
        self, request: HttpRequest, obj: ModelEndpoint, form: Any, change: bool
    ) -> None:
        model_endpoint_update(
            endpoint=obj,
            actor=request.user,  # type: ignore[arg-type]
            data={name: form.cleaned_data[name] for name in ENDPOINT_FIELDS},
            partial=False,
        )

    def delete_model(self, request: HttpRequest, obj: ModelEndpoint) -> None:
        try:
            model_endpoint_delete(endpoint=obj, actor=request.user)  # type: ignore[arg-type]
        except EndpointInUse as in_use:
            self.message_user(request, str(in_use), level=messages.ERROR)

    def delete_queryset(
        self, request: HttpRequest, queryset: QuerySet[ModelEndpoint]
    ) -> None:
        for endpoint in queryset:
            self.delete_model(request, endpoint)
