from django.urls import path

from runs import (
    agents_api,
    api,
    approvals_api,
    budget_api,
    data_api,
    diff_api,
    eval_runs_api,
    evals_api,
    gates_api,
    mcp_api,
    overview_api,
    reservations_api,
    trace_api,
)

urlpatterns = [
    path("evals/suites/", evals_api.EvalSuiteListApi.as_view(), name="api-eval-suites"),
    path(
        "evals/suites/import/",
        evals_api.EvalSuiteImportApi.as_view(),
        name="api-eval-suite-import",
    ),
    path(
        "evals/suites/<slug:slug>/",
        evals_api.EvalSuiteDetailApi.as_view(),
        name="api-eval-suite",
    ),
    path(
        "evals/suites/<slug:slug>/export/",
        evals_api.EvalSuiteExportApi.as_view(),
        name="api-eval-suite-export",
    ),
    path(
        "evals/suites/<slug:slug>/cases/",
        evals_api.EvalCaseListApi.as_view(),
        name="api-eval-cases",
    ),
    path(
        "evals/suites/<slug:slug>/cases/<slug:case_slug>/",
        evals_api.EvalCaseDetailApi.as_view(),
        name="api-eval-case",
    ),
    path("evals/runs/", eval_runs_api.EvalRunListApi.as_view(), name="api-eval-runs"),
    path(
        "evals/runs/<uuid:eval_run_id>/",
        eval_runs_api.EvalRunDetailApi.as_view(),
        name="api-eval-run",
    ),
    path("gates/", gates_api.GateListApi.as_view(), name="api-gates"),
    path("gates/<uuid:gate_id>/", gates_api.gate_detail, name="api-gate"),
    path("agents/", agents_api.AgentListApi.as_view(), name="api-agents"),
    path(
        "agents/<uuid:agent_id>/",
        agents_api.AgentDetailApi.as_view(),
        name="api-agent",
    ),
    path(
        "agents/<uuid:agent_id>/disable/",
        agents_api.AgentDisableApi.as_view(),
        name="api-agent-disable",
    ),
    path(
        "agents/<uuid:agent_id>/enable/",
        agents_api.AgentEnableApi.as_view(),
        name="api-agent-enable",
    ),
    path(
        "agents/<uuid:agent_id>/versions/",
        agents_api.AgentVersionListApi.as_view(),
        name="api-agent-versions",
    ),
    path(
        "agents/<uuid:agent_id>/versions/compare/",
        agents_api.AgentVersionCompareApi.as_view(),
        name="api-agent-versions-compare",
    ),
    path(
        "agents/<uuid:agent_id>/versions/<int:number>/",
        agents_api.AgentVersionDetailApi.as_view(),
        name="api-agent-version",
    ),
    path(
        "agents/<uuid:agent_id>/versions/<int:number>/restore/",
        agents_api.AgentVersionRestoreApi.as_view(),
        name="api-agent-version-restore",
    ),
    path(
        "model-endpoints/",
        agents_api.ModelEndpointListApi.as_view(),
        name="api-model-endpoints",
    ),
    path(
        "model-endpoints/<uuid:endpoint_id>/",
        agents_api.ModelEndpointDetailApi.as_view(),
        name="api-model-endpoint",
    ),
    path("stats/", api.StatsApi.as_view(), name="api-stats"),
    path("overview/", overview_api.OverviewApi.as_view(), name="api-overview"),
    path("runs/", api.RunListApi.as_view(), name="api-runs"),
    path("runs/<str:run_id>/", api.RunDetailApi.as_view(), name="api-run"),
    path(
        "runs/<str:run_id>/diff/<str:other_id>/",
        diff_api.RunDiffApi.as_view(),
        name="api-run-diff",
    ),
    path(
        "runs/<str:run_id>/cancel/", api.RunCancelApi.as_view(), name="api-run-cancel"
    ),
    path(
        "runs/<str:run_id>/export/",
        data_api.RunExportApi.as_view(),
        name="api-run-export",
    ),
    path(
        "runs/<str:run_id>/export.otlp.json",
        data_api.RunExportOtlpApi.as_view(),
        name="api-run-export-otlp",
    ),
    path(
        "runs/<str:run_id>/events/",
        trace_api.RunEventListApi.as_view(),
        name="api-run-events",
    ),
    path(
        "runs/<str:run_id>/spans/",
        trace_api.RunSpanListApi.as_view(),
        name="api-run-spans",
    ),
    path(
        "runs/<str:run_id>/spans/search/",
        trace_api.RunSpanSearchApi.as_view(),
        name="api-run-span-search",
    ),
    path("traces/<str:trace_id>/", trace_api.TraceRunApi.as_view(), name="api-trace"),
    path("spans/<int:span_pk>/", trace_api.SpanDetailApi.as_view(), name="api-span"),
    path(
        "spans/<int:span_pk>/subtree/",
        trace_api.SpanSubtreeApi.as_view(),
        name="api-span-subtree",
    ),
    path("retention/", data_api.RetentionApi.as_view(), name="api-retention"),
    path("budget/", budget_api.BudgetApi.as_view(), name="api-budget"),
    path(
        "budget/activity/",
        budget_api.BudgetActivityApi.as_view(),
        name="api-budget-activity",
    ),
    path(
        "budget/reservations/",
        reservations_api.ReservationListApi.as_view(),
        name="api-budget-reservations",
    ),
    path(
        "budget/reservations/<uuid:reservation_id>/",
        reservations_api.ReservationDetailApi.as_view(),
        name="api-budget-reservation",
    ),
    path(
        "budget/reservations/<uuid:reservation_id>/settle/",
        reservations_api.ReservationSettleApi.as_view(),
        name="api-budget-reservation-settle",
    ),
    path(
        "budget/reservations/<uuid:reservation_id>/release/",
        reservations_api.ReservationReleaseApi.as_view(),
        name="api-budget-reservation-release",
    ),
    # The approvals API's operations that act on runs (approvals/urls.py has the rest).
    path(
        "approvals/<uuid:approval_id>/decide/",
        approvals_api.ApprovalDecideApi.as_view(),
        name="api-approval-decide",
    ),
    path(
        "approval-rules/",
        approvals_api.ApprovalRuleListApi.as_view(),
        name="api-approval-rules",
    ),
    path(
        "approval-rules/<uuid:rule_id>/",
        approvals_api.ApprovalRuleDetailApi.as_view(),
        name="api-approval-rule",
    ),
    path("mcp-servers/", mcp_api.McpServerListApi.as_view(), name="api-mcp-servers"),
    path(
        "mcp-servers/<uuid:server_id>/",
        mcp_api.McpServerDetailApi.as_view(),
        name="api-mcp-server",
    ),
    path(
        "mcp-servers/<uuid:server_id>/refresh/",
        mcp_api.McpServerRefreshApi.as_view(),
        name="api-mcp-server-refresh",
    ),
    path(
        "mcp-servers/<uuid:server_id>/tools/<str:tool_name>/",
        mcp_api.McpToolDetailApi.as_view(),
        name="api-mcp-tool",
    ),
    path(
        "mcp-servers/<uuid:server_id>/tools/<str:tool_name>/accept/",
        mcp_api.McpToolAcceptApi.as_view(),
        name="api-mcp-tool-accept",
    ),
]
