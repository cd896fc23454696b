"""An operator's endpoint that streams forever (or sends its headers and then
nothing) fails the run with a model error at the call's deadline
(RUN_MODEL_DEADLINE_SECONDS; the endpoint's `timeout_seconds` bounds each read),
on a real Celery worker, and leaves that worker free: the next run on it gets its
answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from runs.devserver import Behaviour, ChatCompletionsServer
from runs.models import Run
from tests.conftest import WorkerProcess, start_worker

DEADLINE_SECONDS = 6

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def model() -> Iterator[ChatCompletionsServer]:
    with ChatCompletionsServer() as server:
        yield server


@pytest.fixture
def worker(tmp_path: Any, transactional_db: Any) -> Iterator[WorkerProcess]:
    """A worker whose model calls end within DEADLINE_SECONDS (100 s by default)."""
    process = start_worker(
        tmp_path, extra_env={"RUN_MODEL_DEADLINE_SECONDS": str(DEADLINE_SECONDS)}
    )
    yield process
    process.stop()


@pytest.fixture
def operator_api(tenant: Any, operator_user: Any, api_client_for: Any) -> Any:
    return api_client_for(operator_user, tenant)


@pytest.fixture
def agent(model, tenant, admin_user, api_client_for) -> str:
    """Defined through the API as an operator would: a 3 s deadline, no retry."""
    admin = api_client_for(admin_user, tenant)
    endpoint = admin.post(
        "/api/v1/model-endpoints/",
        {"slug": "flaky", "name": "Flaky", "kind": "openai",
         "base_url": model.base_url,
         "options": {"timeout_seconds": 3, "max_retries": 0, "stream": True}},
        format="json",
    )  # fmt: skip
    assert endpoint.status_code == 201, endpoint.content
    created = admin.post(
        "/api/v1/agents/",
        {"slug": "talker", "name": "Talker", "endpoint": "flaky",
         "model": "gpt-4o-mini"},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    return "talker"


def run_to_the_end(api: Any, agent: str, timeout: float = 90) -> Run:
    started = api.post("/api/v1/runs/", {"agent": agent, "input": "hi"}, format="json")
    assert started.status_code == 201, started.content
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=started.json()["id"])
        if run.status in Run.TERMINAL:
            return run
        time.sleep(0.2)
    raise AssertionError(f"the run is still {run.status} after {timeout} s")


@pytest.mark.parametrize("misbehaviour", ["endless", "hang"])
def test_an_endpoint_that_never_finishes_fails_the_run_and_frees_the_worker(
    misbehaviour, model, agent, operator_api, worker
):
    for _ in range(4):  # whatever the host retries gets the same
        model.push(Behaviour(**{misbehaviour: True}, chunk_delay=0.05))
    began = time.monotonic()
    run = run_to_the_end(operator_api, agent)
    took = time.monotonic() - began
    assert (run.status, run.stop_reason) == ("failed", "model_error"), run.stop_detail
    assert run.final_answer == ""  # never a half answer taken as final
    assert took < DEADLINE_SECONDS + 30, took
    assert run.lease_owner == "" and run.step_token is None

    model.queue.clear()
    model.reply("All good.")
    after = run_to_the_end(operator_api, agent)
    assert after.final_answer == "All good.", (after.status, after.stop_detail)
