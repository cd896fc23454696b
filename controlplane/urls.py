from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from controlplane import (
    accept_views,
    api,
    audit_api,
    health,
    members_api,
    metrics,
    secrets_api,
    views,
)
from frontend import views as pages
from runs import trace_api
from runs.otlp import logs_api as otlp_logs_api

# Swagger UI comes from its CDN and keeps a small inline <style>; its own
# initialisation script is served as a file (the split view), so even this page
# runs no inline script.
SWAGGER_CDN = "https://cdn.jsdelivr.net"
api_docs = csp_update(
    {
        "script-src": [SWAGGER_CDN],
        "style-src": [SWAGGER_CDN, "'unsafe-inline'"],
        "img-src": [SWAGGER_CDN],
    }
)(SpectacularSwaggerSplitView.as_view(url_name="api-schema"))

urlpatterns = [
    # The start page is the overview (where a login without `next` lands), served
    # at "/" too (no redirect hop); the runs list stays at /runs/.
    path("", pages.overview_page, name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("livez", health.livez, name="livez"),
    path("readyz", health.readyz, name="readyz"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/switch/", views.tenant_switch, name="tenant-switch"),
    path(
        "accept/<str:token>/",
        accept_views.password_link_accept,
        name="password-link-accept",
    ),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", api_docs, name="api-docs"),
    path("api/v1/me/", api.MeApi.as_view(), name="api-me"),
    path("api/v1/tokens/", api.TokenListApi.as_view(), name="api-tokens"),
    path(
        "api/v1/tokens/<uuid:token_id>/revoke/",
        api.TokenRevokeApi.as_view(),
        name="api-token-revoke",
    ),
    path("api/v1/members/", members_api.MemberListApi.as_view(), name="api-members"),
    path(
        "api/v1/members/invite/",
        members_api.MemberInviteApi.as_view(),
        name="api-member-invite",
    ),
    path(
        "api/v1/members/<int:member_id>/",
        members_api.MemberDetailApi.as_view(),
        name="api-member",
    ),
    path(
        "api/v1/members/<int:member_id>/role/",
        members_api.MemberRoleApi.as_view(),
        name="api-member-role",
    ),
    path(
        "api/v1/members/<int:member_id>/deactivate/",
        members_api.MemberDeactivateApi.as_view(),
        name="api-member-deactivate",
    ),
    path(
        "api/v1/members/<int:member_id>/reactivate/",
        members_api.MemberReactivateApi.as_view(),
        name="api-member-reactivate",
    ),
    path(
        "api/v1/members/<int:member_id>/password-link/",
        members_api.MemberPasswordLinkApi.as_view(),
        name="api-member-password-link",
    ),
    path("api/v1/audit/", audit_api.AuditListApi.as_view(), name="api-audit"),
    path("api/v1/secrets/", secrets_api.SecretListApi.as_view(), name="api-secrets"),
    path(
        "api/v1/secrets/<str:name>/",
        secrets_api.SecretDetailApi.as_view(),
        name="api-secret",
    ),
    path("v1/traces", trace_api.otlp_traces, name="otlp-traces"),
    path("v1/logs", otlp_logs_api.otlp_logs, name="otlp-logs"),
    path("api/v1/", include("runs.urls")),
    path("api/v1/", include("approvals.urls")),
    path("", include("frontend.urls")),
]

# JSON on /api/ and /v1/ when DEBUG is off (controlplane.api_errors).
handler404 = "controlplane.api_errors.page_not_found"
handler500 = "controlplane.api_errors.server_error"
