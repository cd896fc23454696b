"""An agent whose model key secret is not set fails its run at once, with a model
error naming the missing secret (before: the run stayed `running` with 0 steps,
retried by recovery every lease, because building the model client raised)."""

from __future__ import annotations

from runs.models import Run
from tests.conftest import wait_for
from tests.runs.conftest import MISSING_KEY, drive
from tracing.models import Span


def test_a_missing_key_fails_the_run_at_once_naming_the_secret(
    keyless_agent, tenant, operator_user, api_client_for
):
    api = api_client_for(operator_user, tenant)
    started = api.post(
        "/api/v1/runs/", {"agent": "keyless", "input": "hello"}, format="json"
    )
    assert started.status_code == 201
    run = drive(Run.objects.get(id=started.json()["id"]))
    assert (run.status, run.stop_reason) == ("failed", "model_error")
    assert f"secret '{MISSING_KEY}' is not set in this tenant" in run.stop_detail
    assert "model endpoint 'openai'" in run.stop_detail
    assert run.lease_owner == "" and run.step_token is None
    body = api.get(f"/api/v1/runs/{run.id}/").json()
    assert body["status"] == "failed" and MISSING_KEY in body["stop_detail"]
    chat = wait_for(
        lambda: Span.objects.filter(run=run, name__startswith="chat ").first(),
        what="the chat span",
    )
    assert chat.status == Span.Status.ERROR
    assert chat.attributes["error.type"] == "missing_secret"
    assert MISSING_KEY in chat.status_message
    # Nothing is left for recovery to retry.
    assert not Run.objects.filter(status=Run.Status.RUNNING).exists()
