"""Fixtures for approval tests: the demo shop, scripted agents, waiting runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run
from runs.services import run_start
from tests.runs.conftest import demo_agent, drive, drive_run, scripted_agent, shop

__all__ = ["demo_agent", "drive_run", "scripted_agent", "shop"]

REFUND_ARGS = {"order_id": "4821", "amount": 50, "reason": "dented spout"}
REPLACE_ARGS = {"order_id": "4821", "reason": "arrived with a dented spout"}


def call(name: str, arguments: dict[str, Any], call_id: str = "") -> dict[str, Any]:
    return {"id": call_id or f"call_{name}", "name": name, "arguments": arguments}


def script_of(*calls: dict[str, Any], final: str = "Done.") -> list[dict[str, Any]]:
    """One reply per call, then a final answer."""
    return [{"text": "", "tool_calls": [c]} for c in calls] + [{"text": final}]


@pytest.fixture
def shop_agent(shop: Any, scripted_agent: Any) -> Callable[..., Any]:
    """A scripted agent on the demo shop's tools."""

    def build(script: list[dict[str, Any]], slug: str = "scripted") -> Any:
        return scripted_agent(
            script,
            ["lookup_order", "get_delivery_date", "create_replacement", "refund"],
            slug=slug,
        )

    return build


@pytest.fixture
def waiting_run(shop_agent: Any) -> Callable[..., tuple[Run, ApprovalRequest]]:
    """Start a run of a fresh scripted agent and drive it to its approval wait."""

    def build(
        script: list[dict[str, Any]], *, started_by: Any = None, slug: str = "scripted"
    ) -> tuple[Run, ApprovalRequest]:
        agent = shop_agent(script, slug=slug)
        run = run_start(
            tenant=agent.tenant, agent_slug=slug, input="help", started_by=started_by
        )
        run = drive(run, beside_a_worker=True)
        assert run.status == Run.Status.WAITING_APPROVAL, (run.status, run.stop_detail)
        return run, ApprovalRequest.objects.get(run=run, status="pending")

    return build


def wait_until(predicate: Callable[[], Any], *, timeout: float = 60.0) -> Any:
    """Poll until `predicate()` is truthy; fail with a message at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s")
