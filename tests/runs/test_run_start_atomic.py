"""`run_start` is a transaction of its own: called outside any (a management
command, a benchmark, a script), it starts the run whole."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from runs.services import run_start

pytestmark = pytest.mark.django_db(transaction=True)


def test_run_start_outside_any_transaction_starts_the_run(
    demo_agent: Any, operator_user: Any
) -> None:
    run = run_start(
        tenant=demo_agent.tenant, agent_slug=demo_agent.slug,
        input="order 4821 arrived damaged", started_by=operator_user,
    )  # fmt: skip
    stored = Run.objects.get(id=run.id)
    assert stored.status == Run.Status.QUEUED
    assert stored.input == "order 4821 arrived damaged"
