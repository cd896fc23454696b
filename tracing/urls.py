from django.urls import path

from tracing import api

urlpatterns = [
    path(
        "runs/<str:run_id>/events/",
        api.RunEventListApi.as_view(),
        name="api-run-events",
    ),
    path(
        "runs/<str:run_id>/spans/", api.RunSpanListApi.as_view(), name="api-run-spans"
    ),
    path("spans/<int:span_pk>/", api.SpanDetailApi.as_view(), name="api-span"),
]
