"""Reads of a run's steering and follow-up messages (runs.services.steering)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from controlplane.models import Tenant
from runs.models import Run, RunMessage


def run_for_messages(*, tenant: Tenant, run_id: Any) -> Run | None:
    """The tenant's run, or None (absent, or another tenant's: no existence leak)."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return Run.objects.filter(tenant=tenant, id=key).first()


def run_messages(*, run: Run) -> QuerySet[RunMessage]:
    """The run's messages, oldest first."""
    return RunMessage.objects.filter(tenant_id=run.tenant_id, run=run).order_by(
        "created_at", "id"
    )
