from django.contrib import admin

from controlplane.models import ApiToken, AuditEvent, Membership, Tenant

admin.site.register(Tenant)
admin.site.register(Membership)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = [
        "prefix",
        "tenant",
        "user",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    readonly_fields = ["prefix", "token_sha256"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin[AuditEvent]):
    list_display = [
        "created_at",
        "tenant",
        "actor",
        "action",
        "object_type",
        "object_id",
    ]
