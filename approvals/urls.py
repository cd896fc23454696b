from django.urls import path

from approvals import api

urlpatterns = [
    path("approvals/", api.ApprovalListApi.as_view(), name="api-approvals"),
    path(
        "approvals/<uuid:approval_id>/",
        api.ApprovalDetailApi.as_view(),
        name="api-approval",
    ),
    path(
        "approvals/<uuid:approval_id>/decide/",
        api.ApprovalDecideApi.as_view(),
        name="api-approval-decide",
    ),
    path(
        "approval-rules/", api.ApprovalRuleListApi.as_view(), name="api-approval-rules"
    ),
    path(
        "approval-rules/<uuid:rule_id>/",
        api.ApprovalRuleDetailApi.as_view(),
        name="api-approval-rule",
    ),
    path(
        "approval-settings/",
        api.ApprovalSettingsApi.as_view(),
        name="api-approval-settings",
    ),
    path("audit/", api.AuditListApi.as_view(), name="api-audit"),
]
