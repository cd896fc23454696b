from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane import api, health, views
from tracing import api as tracing_api

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("livez", health.livez, name="livez"),
    path("readyz", health.readyz, name="readyz"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/switch/", views.tenant_switch, name="tenant-switch"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="api-schema"),
        name="api-docs",
    ),
    path("api/v1/me/", api.MeApi.as_view(), name="api-me"),
    path("api/v1/tokens/", api.TokenListApi.as_view(), name="api-tokens"),
    path(
        "api/v1/tokens/<uuid:token_id>/revoke/",
        api.TokenRevokeApi.as_view(),
        name="api-token-revoke",
    ),
    path("v1/traces", tracing_api.otlp_traces, name="otlp-traces"),
    path("api/v1/", include("tracing.urls")),
    path("api/v1/", include("runs.urls")),
    path("api/v1/", include("approvals.urls")),
    path("api/v1/", include("controlplane.budget_urls")),
    path("", include("frontend.urls")),
]
