"""The approvals API's reads and settings; deciding and rule writes act on runs and
are routed by runs/urls.py at the same prefix (approvals/, approval-rules/)."""

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
        "approval-settings/",
        api.ApprovalSettingsApi.as_view(),
        name="api-approval-settings",
    ),
]
