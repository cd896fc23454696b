"""The live stream of one run (`/ws/runs/<id>/`): tracing's run event stream,
told by the runs app which runs the caller's tenant holds."""

from __future__ import annotations

from typing import Any

from controlplane.models import Tenant
from runs.selectors import run_for_tenant
from tracing.consumers import RunEventStreamConsumer

__all__ = ["RunStreamConsumer"]


class RunStreamConsumer(RunEventStreamConsumer):
    """`/ws/runs/<id>/`: every event of one run, exactly once, in seq order."""

    def run_in_tenant(self, *, tenant: Tenant, run_id: Any) -> bool:
        return run_for_tenant(tenant=tenant, run_id=run_id) is not None
