"""The approvals API's reads and settings; deciding and rule writes act on runs and
are routed by runs/urls.py at the same prefix (approvals/, approval-rules/)."""

from django.urls import path

from approvals import api, questions_api

urlpatterns = [
    path("approvals/", api.ApprovalListApi.as_view(), name="api-approvals"),
    path(
        "approvals/<uuid:approval_id>/",
        api.ApprovalDetailApi.as_view(),
        name="api-approval",
    ),
    path("questions/", questions_api.QuestionListApi.as_view(), name="api-questions"),
    path(
        "questions/<uuid:question_id>/",
        questions_api.QuestionDetailApi.as_view(),
        name="api-question",
    ),
    path(
        "approval-settings/",
        api.ApprovalSettingsApi.as_view(),
        name="api-approval-settings",
    ),
]
