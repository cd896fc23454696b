"""The overview's hourly rollups (runs/rollups.py reads them, and
runs/services/rollups.py keeps them as runs end). The agent is named by string
(`"runs.Agent"`) so `runs.models` can import this module."""

from __future__ import annotations

from django.db import models

from controlplane.models import Tenant

__all__ = ["RunDurationRollup", "RunHourRollup", "ToolHourRollup"]


class RunHourRollup(models.Model):
    """A tenant's ended runs created in one UTC hour, by agent and status: the
    overview reads these instead of the runs (runs/rollups.py)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    agent = models.ForeignKey("runs.Agent", on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=20)
    runs = models.IntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "hour", "agent", "status"], name="one_run_rollup"
            )
        ]

    def __str__(self) -> str:
        return f"{self.runs} {self.status} runs at {self.hour:%Y-%m-%d %H}:00"


class RunDurationRollup(models.Model):
    """How many of a tenant's runs created in one UTC hour took a duration in
    one histogram bucket (runs/rollups.py: 8 buckets per doubling)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    bucket = models.SmallIntegerField()
    runs = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "hour", "bucket"], name="one_duration_rollup"
            )
        ]

    def __str__(self) -> str:
        return f"{self.runs} runs in bucket {self.bucket} at {self.hour:%Y-%m-%d %H}:00"


class ToolHourRollup(models.Model):
    """The tool calls of a tenant's ended runs created in one UTC hour, by tool:
    calls, failed calls and the cost their calls settled in the ledger."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    tool_name = models.CharField(max_length=200)
    calls = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "hour", "tool_name"], name="one_tool_rollup"
            )
        ]

    def __str__(self) -> str:
        return f"{self.calls} {self.tool_name} calls at {self.hour:%Y-%m-%d %H}:00"
