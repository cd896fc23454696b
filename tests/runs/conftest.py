from __future__ import annotations

import time
from typing import Any

import pytest

from controlplane.secrets import secret_delete, secret_set
from runs.demo import demo_seed_shop
from runs.models import Agent, Run
from runs.services import run_advance
from tests.agents import make_agent

MISSING_KEY = "KEYLESS_MODEL_KEY"


@pytest.fixture
def shop(tenant: Any) -> Any:
    demo_seed_shop(tenant=tenant)
    return tenant


@pytest.fixture
def demo_agent(shop: Any) -> Agent:
    return Agent.objects.get(tenant=shop, slug="kettlecraft-support")


@pytest.fixture
def scripted_agent(tenant: Any) -> Any:
    """Build an agent on the scripted model with the given replies and tools."""

    def build(script: list[dict[str, Any]], tools: list[str], **fields: Any) -> Agent:
        fields.setdefault("name", "Scripted")
        return make_agent(
            tenant,
            fields.pop("slug", "scripted"),
            tools=tools,
            script=script,
            **fields,
        )

    return build


@pytest.fixture
def keyless_agent(tenant: Any) -> Agent:
    """`keyless`: an OpenAI-compatible agent whose endpoint's key secret is not
    set (it was when the endpoint was defined, then deleted)."""
    secret_set(tenant=tenant, name=MISSING_KEY, value="sk-soon-gone-123", actor=None)
    agent = make_agent(
        tenant, "keyless", kind="openai", model="gpt-4o-mini",
        base_url="http://127.0.0.1:9/v1", api_key_secret=MISSING_KEY,
    )  # fmt: skip
    secret_delete(tenant=tenant, name=MISSING_KEY, actor=None)
    return agent


def drive(run: Run, *, max_tasks: int = 200, beside_a_worker: bool = False) -> Run:
    """Advance the run task by task, in this process, until it ends or waits.

    `beside_a_worker`: the test also runs a live worker, which may take a step
    first; this driver's step is then skipped (the lease is the worker's) and
    the worker is left to finish it."""
    for _ in range(max_tasks):
        run.refresh_from_db()
        if run.status not in (Run.Status.QUEUED, Run.Status.RUNNING):
            return run
        outcome = run_advance(
            run_id=str(run.id), step_token=str(run.step_token), owner="test-driver"
        )
        if outcome == "skipped":
            assert beside_a_worker, f"a step was skipped in state {run.status}"
            time.sleep(0.05)
    raise AssertionError("the run did not settle")


@pytest.fixture
def drive_run() -> Any:
    return drive
