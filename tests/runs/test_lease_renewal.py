"""A step's lease outlives a slow model: a real worker, a real HTTP model server
speaking Chat Completions that answers after longer than the lease, and the
recovery sweep running all the while. One model call per step, never two."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runs.models import Run, Step, ToolCall
from runs.services import recover_stalled_runs, run_start
from tests.agents import make_agent
from tests.conftest import start_worker, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LEASE_SECONDS = 2.0
ANSWER_AFTER_SECONDS = 3 * LEASE_SECONDS  # each model call outlasts the lease
MODEL = "slow-model-1"


def completion(
    number: int, *, text: str | None, calls: list[dict[str, Any]]
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-slow-{number}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28},
    }


class SlowModelServer:
    """Chat Completions on 127.0.0.1: a tool call first, then an answer, each
    after `ANSWER_AFTER_SECONDS`; counts every request it gets."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.in_flight_since: float | None = None
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with server._lock:
                    server.requests.append(body)
                    number = len(server.requests)
                    server.in_flight_since = time.monotonic()
                time.sleep(ANSWER_AFTER_SECONDS)
                if number == 1:
                    reply = completion(
                        number,
                        text="Let me look the order up.",
                        calls=[
                            {
                                "id": "call_lookup",
                                "type": "function",
                                "function": {
                                    "name": "lookup_order",
                                    "arguments": '{"order_id": "4821"}',
                                },
                            }
                        ],
                    )
                else:
                    reply = completion(number, text="Your kettle is on file.", calls=[])
                data = json.dumps(reply).encode()
                with server._lock:
                    server.in_flight_since = None
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def in_flight_for(self) -> float:
        """How long the request being answered has been waiting (0: none)."""
        with self._lock:
            since = self.in_flight_since
        return 0.0 if since is None else time.monotonic() - since


@pytest.fixture
def slow_model() -> Iterator[SlowModelServer]:
    server = SlowModelServer()
    server.thread.start()
    yield server
    server.http.shutdown()
    server.http.server_close()


def test_a_model_call_longer_than_the_lease_is_made_once_while_recovery_sweeps(
    shop, slow_model, tmp_path, settings
):
    settings.RUN_LEASE_SECONDS = LEASE_SECONDS  # the sweep in this process
    agent = make_agent(
        shop, "slow", name="Slow", kind="openai", model=MODEL,
        base_url=slow_model.base_url, tools=["lookup_order"],
    )  # fmt: skip
    worker = start_worker(
        tmp_path,
        concurrency=2,  # a second process is free to take the run over
        extra_env={"RUN_LEASE_SECONDS": str(LEASE_SECONDS)},
    )
    sweeps: list[tuple[float, int]] = []  # (how long the call had run, recovered)
    try:
        run = run_start(
            tenant=shop, agent_slug=agent.slug, input="4821?", started_by=None
        )

        def sweep_until_settled() -> Run | None:
            in_flight = slow_model.in_flight_for()
            sweeps.append((in_flight, recover_stalled_runs()))
            run.refresh_from_db()
            # A take-over ends the wait: it is the failure this test is about.
            return run if run.is_terminal or sweeps[-1][1] else None

        run = wait_for(sweep_until_settled, timeout=90, what="the run to end")
        if not run.is_terminal:  # taken over: let the second call reach the server
            wait_for(lambda: len(slow_model.requests) > 1, timeout=30)
    finally:
        worker.stop()
    # Recovery took nothing over and the model was asked once per step...
    assert [recovered for _, recovered in sweeps if recovered] == []
    assert len(slow_model.requests) == 2, [r["messages"] for r in slow_model.requests]
    # ...though it ran while a call had been in flight for longer than the lease
    # (without renewals the lease would have run out).
    assert any(in_flight > LEASE_SECONDS + 1 for in_flight, _ in sweeps), sweeps
    assert run.status == Run.Status.UNVERIFIED, (run.stop_reason, run.stop_detail)
    assert list(
        Step.objects.filter(run=run).order_by("index").values_list("index", flat=True)
    ) == [0, 1]
    assert (run.steps, run.input_tokens, run.output_tokens) == (2, 40, 16)
    lookup = ToolCall.objects.get(run=run)
    assert (lookup.call_id, lookup.status, lookup.attempts) == (
        "call_lookup",
        "succeeded",
        1,
    )


def test_the_openai_adapter_of_a_run_gets_the_configured_deadline(shop, settings):
    from runs.runtime import model_adapter_for

    settings.RUN_MODEL_DEADLINE_SECONDS = 42.0
    agent = make_agent(
        shop, "remote", kind="openai", model=MODEL, base_url="http://127.0.0.1:9/v1"
    )
    adapter = model_adapter_for(
        agent.current_version, tenant_id=shop.pk, replies_consumed=0
    )
    assert getattr(adapter, "deadline_seconds", None) == 42.0


def test_a_renewal_never_extends_a_lease_another_worker_holds(shop, scripted_agent):
    import datetime as dt

    from django.utils import timezone

    from runs.services.lease_renewal import lease_renew

    scripted_agent([{"text": "hi"}], [])
    run = run_start(tenant=shop, agent_slug="scripted", input="x", started_by=None)
    expires = timezone.now() + dt.timedelta(seconds=5)
    Run.objects.filter(id=run.id).update(
        status=Run.Status.RUNNING, lease_owner="other-task", lease_expires_at=expires
    )
    assert lease_renew(run_id=run.id, owner="this-task") is False
    assert lease_renew(run_id=run.id, owner="") is False
    run.refresh_from_db()
    assert (run.lease_owner, run.lease_expires_at) == ("other-task", expires)
    assert lease_renew(run_id=run.id, owner="other-task") is True
    run.refresh_from_db()
    assert run.lease_owner == "other-task" and run.lease_expires_at > expires
