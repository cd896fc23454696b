from django.urls import path

from controlplane import budget_api

urlpatterns = [
    path("budget/", budget_api.BudgetApi.as_view(), name="api-budget"),
]
