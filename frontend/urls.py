from django.urls import path

from frontend import eval_views, views

urlpatterns = [
    path("overview/", views.overview_page, name="ui-overview"),
    path("runs/", views.runs_page, name="ui-runs"),
    path("runs/<str:run_id>/", views.run_page, name="ui-run"),
    path(
        "runs/<str:run_id>/diff/<str:other_id>/",
        views.run_diff_page,
        name="ui-run-diff",
    ),
    path("runs/<str:run_id>/replay/", views.run_replay_page, name="ui-run-replay"),
    path("approvals/", views.approvals_page, name="ui-approvals"),
    path("budget/", views.budget_page, name="ui-budget"),
    path("audit/", views.audit_page, name="ui-audit"),
    path("demos/", views.demos_page, name="ui-demos"),
    path("end-users/", views.end_users_page, name="ui-end-users"),
    path("end-users/<str:end_user>/", views.end_users_page, name="ui-end-user"),
    path("secrets/", views.secrets_page, name="ui-secrets"),
    path("mcp-servers/", views.mcp_page, name="ui-mcp"),
    path("members/", views.members_page, name="ui-members"),
    path("tokens/", views.tokens_page, name="ui-tokens"),
    path("agents/", views.agents_page, name="ui-agents"),
    path("agents/<str:agent_id>/", views.agent_page, name="ui-agent"),
    path("evals/", eval_views.evals_page, name="ui-evals"),
    path(
        "evals/suites/<slug:suite_slug>/",
        eval_views.eval_suite_page,
        name="ui-eval-suite",
    ),
    path(
        "evals/runs/<uuid:eval_run_id>/", eval_views.eval_run_page, name="ui-eval-run"
    ),
    path(
        "evals/runs/<uuid:eval_run_id>/compare/<uuid:other_eval_run_id>/",
        eval_views.eval_compare_page,
        name="ui-eval-compare",
    ),
]
