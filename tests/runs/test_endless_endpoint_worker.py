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
from tests.runs.conftest import MISSING_KEY

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


def test_a_missing_key_fails_the_run_at_once_on_a_worker_and_cancel_is_final(
    keyless_agent, operator_api, worker
):
    """The issue's first bad input, with a real worker (test_missing_key.py drives
    the step in-process): failed within seconds, never left `running` for
    recovery, and a cancel of the ended run changes nothing."""
    began = time.monotonic()
    run = run_to_the_end(operator_api, keyless_agent.slug, timeout=60)
    assert time.monotonic() - began < 30
    assert (run.status, run.stop_reason) == ("failed", "model_error")
    assert f"secret '{MISSING_KEY}' is not set in this tenant" in run.stop_detail
    assert run.lease_owner == "" and run.step_token is None
    cancel = operator_api.post(f"/api/v1/runs/{run.id}/cancel/")
    assert cancel.status_code in (200, 409), cancel.content
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == ("failed", "model_error")


def test_a_cancel_during_an_endless_stream_takes_effect(
    model, agent, operator_api, worker
):
    """Cancel is answered at once and ends the run no later than the model call's
    deadline, though the stream never ends by itself."""
    for _ in range(4):
        model.push(Behaviour(endless=True, chunk_delay=0.05))
    started = operator_api.post(
        "/api/v1/runs/", {"agent": agent, "input": "hi"}, format="json"
    )
    run_id = started.json()["id"]
    deadline = time.monotonic() + 30
    while len(model.requests) == 0:  # the worker is reading the stream
        assert time.monotonic() < deadline, "the model was never called"
        time.sleep(0.1)
    cancel = operator_api.post(f"/api/v1/runs/{run_id}/cancel/")
    assert cancel.status_code == 200, cancel.content
    asked = time.monotonic()
    while (run := Run.objects.get(pk=run_id)).status not in Run.TERMINAL:
        assert time.monotonic() - asked < DEADLINE_SECONDS + 20, run.status
        time.sleep(0.2)
    assert run.status == Run.Status.CANCELLED
    assert run.final_answer == ""
