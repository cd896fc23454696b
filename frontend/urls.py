from django.urls import path

from frontend import views

urlpatterns = [
    path("overview/", views.overview_page, name="ui-overview"),
    path("runs/", views.runs_page, name="ui-runs"),
    path("runs/<str:run_id>/", views.run_page, name="ui-run"),
    path(
        "runs/<str:run_id>/diff/<str:other_id>/",
        views.run_diff_page,
        name="ui-run-diff",
    ),
    path("approvals/", views.approvals_page, name="ui-approvals"),
    path("budget/", views.budget_page, name="ui-budget"),
    path("audit/", views.audit_page, name="ui-audit"),
    path("secrets/", views.secrets_page, name="ui-secrets"),
    path("mcp-servers/", views.mcp_page, name="ui-mcp"),
    path("members/", views.members_page, name="ui-members"),
    path("tokens/", views.tokens_page, name="ui-tokens"),
    path("agents/", views.agents_page, name="ui-agents"),
    path("agents/<str:agent_id>/", views.agent_page, name="ui-agent"),
]
