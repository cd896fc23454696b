"""The dashboard's aggregates of one tenant's runs since a moment: success rate,
tokens, cost and turns per task (run), per-tool error rates and human
interventions. Read-only and tenant-scoped; computed by the database (ORM
aggregates), never by loading rows."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Count, Q, Sum
from django.db.models.functions import Coalesce

from approvals.models import ApprovalDecision, ApprovalRequest
from controlplane.models import Tenant
from runs.models import Run, ToolCall

# Ended without the host's verdict that it did the task.
_ENDED = [str(status) for status in Run.TERMINAL]
_TOOL_ERRORS = (ToolCall.Status.FAILED, ToolCall.Status.UNKNOWN)


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _money(value: Decimal | None) -> str:
    return str((value or Decimal(0)).quantize(Decimal("0.000001")))


def _figures() -> dict[str, Any]:
    """One set of aggregates for the whole window and for each agent (aliases
    differ from the fields they sum: Django refuses to average an alias)."""
    ended = Q(status__in=_ENDED)
    return {
        "n_runs": Count("id"),
        "n_ended": Count("id", filter=ended),
        "n_succeeded": Count("id", filter=Q(status=Run.Status.SUCCEEDED)),
        "sum_input_tokens": Coalesce(Sum("input_tokens"), 0),
        "sum_output_tokens": Coalesce(Sum("output_tokens"), 0),
        "sum_cost": Sum("cost"),
        "avg_turns": Avg("steps", filter=ended),
        "avg_tool_calls": Avg("tool_calls", filter=ended),
        "avg_input_tokens": Avg("input_tokens", filter=ended),
        "avg_output_tokens": Avg("output_tokens", filter=ended),
        "avg_cost": Avg("cost", filter=ended),
    }


def _shape(figures: dict[str, Any]) -> dict[str, Any]:
    def avg(value: Any) -> float | None:
        return None if value is None else round(float(value), 4)

    return {
        "runs": figures["n_runs"],
        "ended": figures["n_ended"],
        "succeeded": figures["n_succeeded"],
        "success_rate": _rate(figures["n_succeeded"], figures["n_ended"]),
        "input_tokens": figures["sum_input_tokens"],
        "output_tokens": figures["sum_output_tokens"],
        "cost": _money(figures["sum_cost"]),
        "per_task": {
            "turns": avg(figures["avg_turns"]),
            "tool_calls": avg(figures["avg_tool_calls"]),
            "input_tokens": avg(figures["avg_input_tokens"]),
            "output_tokens": avg(figures["avg_output_tokens"]),
            "cost": None
            if figures["avg_cost"] is None
            else _money(Decimal(figures["avg_cost"])),
        },
    }


def run_stats_for(*, tenant: Tenant, since: dt.datetime) -> dict[str, Any]:
    runs = Run.objects.filter(tenant=tenant, created_at__gte=since)
    by_status = dict(
        runs.order_by()
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    agents = runs.order_by("agent__slug").values("agent__slug").annotate(**_figures())
    tools = (
        ToolCall.objects.filter(run__tenant=tenant, run__created_at__gte=since)
        .order_by("tool_name")
        .values("tool_name")
        .annotate(
            calls=Count("id"),
            errors=Count("id", filter=Q(status__in=_TOOL_ERRORS)),
            refused=Count("id", filter=Q(status=ToolCall.Status.REFUSED)),
            denied=Count("id", filter=Q(status=ToolCall.Status.DENIED)),
        )
    )
    requests = ApprovalRequest.objects.filter(tenant=tenant, requested_at__gte=since)
    decisions = dict(
        ApprovalDecision.objects.filter(request__tenant=tenant, created_at__gte=since)
        .order_by()
        .values_list("decision")
        .annotate(n=Count("id"))
        .values_list("decision", "n")
    )
    return {
        "since": since.isoformat(),
        **_shape(runs.aggregate(**_figures())),
        "by_status": {str(s): by_status.get(s, 0) for s in Run.Status.values},
        "agents": [{"agent": row["agent__slug"], **_shape(row)} for row in agents],
        "tools": [
            {
                "tool": row["tool_name"],
                "calls": row["calls"],
                "errors": row["errors"],
                "refused": row["refused"],
                "denied": row["denied"],
                "error_rate": _rate(row["errors"], row["calls"]),
            }
            for row in tools
        ],
        "human_interventions": {
            "requests": requests.count(),
            "runs_with_requests": requests.values("run").distinct().count(),
            "decisions": sum(decisions.values()),
            "approvals": decisions.get(ApprovalDecision.Decision.APPROVE, 0),
            "denials": decisions.get(ApprovalDecision.Decision.DENY, 0),
            "edited": requests.filter(original_args__isnull=False).count(),
        },
    }
