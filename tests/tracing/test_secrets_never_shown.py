"""Secrets in tool arguments and results never reach a reader: the runs, approvals,
spans, events and audit APIs, the WebSocket replay and the logs all apply the one
redaction rule, while the rows keep what the tool executes with."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from approvals.models import ApprovalRequest
from controlplane.asgi import application
from controlplane.redaction import RedactingLogFilter, args_digest
from controlplane.services import api_token_issue
from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.tools import Tool
from runs.models import Run, ToolCall
from runs.services import run_start
from runs.services.decide import approval_decide
from runs.tools import registry
from tests.conftest import BASE_DIR
from tests.tracing.test_spans import exported
from tracing.models import RunEvent, Span, SpanPayload

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["exported"]  # the OTLP exporter fixture, behind the redacting wrapper

# Hidden because of their keys (not credential-shaped).
PASSWORD = "hunter2-Correct-Horse"
API_KEY = "ak-9f8e7d6c5b4a3210"
NESTED_TOKEN = "tok-5up3r-s3cr3t-n3st3d"
BEARER_VALUE = "zq81Wl0pQx7opaque"
RESULT_TOKEN = "rt-partner-session-77"
# Hidden because of their shape, under keys that are not secret.
OPENAI_KEY = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"
AWS_KEY = "AKIAABCDEFGHIJKLMNOP"
OUR_TOKEN = "cp_Zx9Yw8Vu7Ts6Rq5Po4Nm3"

SECRETS = [
    PASSWORD, API_KEY, NESTED_TOKEN, BEARER_VALUE, RESULT_TOKEN, OPENAI_KEY,
    AWS_KEY, OUR_TOKEN,
]  # fmt: skip

ARGS = {
    "url": "https://partner.example/orders",
    "password": PASSWORD,
    "api_key": API_KEY,
    "nested": {"token": NESTED_TOKEN, "region": "eu-west-1"},
    "headers": {"Authorization": f"Bearer {BEARER_VALUE}"},
    "note": f"fallback key {OPENAI_KEY}",
}

_STRING = {"type": "string"}


@pytest.fixture
def partner_api(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A write tool whose arguments carry credentials; it records what it ran with."""
    ran: list[dict[str, Any]] = []

    def handler(arguments: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ran.append(arguments)
        return {"accepted": True, "token": RESULT_TOKEN, "region": "eu-west-1"}

    schema = {
        "type": "object",
        "properties": {
            "url": _STRING,
            "password": _STRING,
            "api_key": _STRING,
            "nested": {
                "type": "object",
                "properties": {"token": _STRING, "region": _STRING},
                "required": ["token", "region"],
            },
            "headers": {
                "type": "object",
                "properties": {"Authorization": _STRING},
                "required": ["Authorization"],
            },
            "note": _STRING,
        },
        "required": ["url", "password", "api_key", "nested", "headers", "note"],
    }
    tool = Tool(
        ToolContract(
            name="call_partner_api",
            description="Send an order to the partner's API.",
            input_schema=schema,
            effect=Effect.WRITE,
            idempotency=Idempotency.NONE,
            source=ToolSource.BUILTIN,
        ),
        handler,
        timeout_seconds=None,
    )
    monkeypatch.setitem(registry.BUILTIN_TOOLS, "call_partner_api", tool)
    return ran


def _everything_a_member_reads(client: Any, run: Run) -> dict[str, str]:
    """Every API body about the run, as text."""
    bodies: dict[str, str] = {}

    def get(path: str) -> Any:
        response = client.get(path)
        assert response.status_code == 200, (path, response.content[:500])
        bodies[path] = response.content.decode()
        return response.json()

    get(f"/api/v1/runs/{run.id}/")
    get("/api/v1/runs/")
    approvals = get(f"/api/v1/approvals/?run={run.id}")["results"]
    for approval in approvals:
        get(f"/api/v1/approvals/{approval['id']}/")
    get(f"/api/v1/runs/{run.id}/events/?after_seq=0&limit=1000")
    parents = [""]
    while parents:
        parent = parents.pop()
        spans = get(f"/api/v1/runs/{run.id}/spans/?parent={parent}&limit=1000")
        for span in spans["results"]:
            get(f"/api/v1/spans/{span['id']}/")
            parents.append(span["span_id"])
    return bodies


def _replay(secret: str, path: str, *, last_id: int) -> list[dict[str, Any]]:
    """Event frames a stream replays from the start, up to the event `last_id`."""

    async def collect() -> list[dict[str, Any]]:
        ws = WebsocketCommunicator(
            application,
            path,
            headers=[
                (b"host", b"testserver"),
                (b"origin", b"http://testserver"),
                (b"authorization", f"Bearer {secret}".encode()),
            ],
        )
        connected, _ = await ws.connect()
        assert connected
        got: list[dict[str, Any]] = []
        while not got or got[-1]["id"] < last_id:
            frame = await ws.receive_json_from(timeout=5)
            if frame["type"] == "event":
                got.append(frame["event"])
        await ws.disconnect()
        return got

    return async_to_sync(collect)()


def _assert_no_secret(bodies: dict[str, str]) -> None:
    for where, text in bodies.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} is readable in {where}"


def test_secrets_in_tool_calls_reach_no_reader_and_the_tool_still_gets_them(
    scripted_agent: Any,
    partner_api: list[dict[str, Any]],
    viewer_user: Any,
    operator_user: Any,
    admin_user: Any,
    tenant: Any,
    api_client_for: Any,
    drive_run: Any,
) -> None:
    call = {"id": "c1", "name": "call_partner_api", "arguments": ARGS}
    scripted_agent(
        [{"text": "", "tool_calls": [call]}, {"text": "Sent."}], ["call_partner_api"]
    )
    run = run_start(
        tenant=tenant,
        agent_slug="scripted",
        input=f"send order 4821; our AWS key is {AWS_KEY}",
        started_by=None,
    )
    run = drive_run(run)
    assert run.status == Run.Status.WAITING_APPROVAL, run.stop_detail
    # The rows keep the raw values: the tool must execute with them.
    stored = ToolCall.objects.get(run=run)
    assert stored.args == ARGS and PASSWORD in stored.raw_args

    viewer = api_client_for(viewer_user, tenant)
    waiting = _everything_a_member_reads(viewer, run)
    _assert_no_secret(waiting)
    shown = json.loads(waiting[f"/api/v1/runs/{run.id}/"])
    assert shown["input"] == "send order 4821; our AWS key is [REDACTED]"
    shown_call = shown["step_rows"][0]["tool_calls"][0]
    assert shown_call["args"] == {
        "url": "https://partner.example/orders",
        "password": "[REDACTED]",
        "api_key": "[REDACTED]",
        "nested": {"token": "[REDACTED]", "region": "eu-west-1"},
        "headers": {"Authorization": "[REDACTED]"},
        "note": "fallback key [REDACTED]",
    }
    # The model's action keeps its serialized arguments, redacted inside the JSON.
    shown_action = json.dumps(shown["step_rows"][0]["action"])
    assert "call_partner_api" in shown_action and "eu-west-1" in shown_action
    approval = json.loads(waiting[f"/api/v1/approvals/?run={run.id}"])["results"][0]
    assert approval["args"] == shown_call["args"]
    assert approval["tool"] == "call_partner_api"
    # The hash is keyed: with every other argument in view, a plain sha256 would
    # let a reader test guesses of the password offline.
    assert approval["args_sha256"] == args_digest(stored.args_sha256)
    assert not [p for p, t in waiting.items() if stored.args_sha256 in t]

    # An approver edits one argument of what was shown; the hidden ones stand.
    edited = {**approval["args"], "url": "https://partner.example/v2/orders"}
    decided = api_client_for(operator_user, tenant).post(
        f"/api/v1/approvals/{approval['id']}/decide/",
        {"decision": "approve", "reason": f"checked with {OUR_TOKEN}", "args": edited},
        format="json",
    )
    assert decided.status_code == 200, decided.json()
    assert decided.json()["args"] == edited
    for secret in SECRETS:
        assert secret not in decided.content.decode()
    snapshot = ApprovalRequest.objects.get(id=approval["id"]).args_snapshot
    assert snapshot == {**ARGS, "url": "https://partner.example/v2/orders"}

    run = drive_run(run)
    assert run.is_terminal, (run.status, run.stop_detail)
    assert partner_api == [snapshot]  # executed once, with the real secrets
    assert ToolCall.objects.get(run=run).result["data"]["token"] == RESULT_TOKEN

    ended = _everything_a_member_reads(viewer, run)
    _assert_no_secret(ended)
    step = json.loads(ended[f"/api/v1/runs/{run.id}/"])["step_rows"][0]
    result = step["tool_calls"][0]["result"]
    assert result["data"] == {
        "accepted": True,
        "token": "[REDACTED]",
        "region": "eu-west-1",
    }
    # The tool's span still shows its serialized arguments, redacted inside.
    tool_span = [
        json.loads(t)
        for p, t in ended.items()
        if p.startswith("/api/v1/spans/") and "execute_tool" in t
    ]
    payloads = tool_span[0]["payload_bodies"]
    shown_raw = payloads["gen_ai.tool.call.arguments"]
    shown_raw = json.loads(shown_raw) if isinstance(shown_raw, str) else shown_raw
    assert shown_raw == {**edited, "url": "https://partner.example/v2/orders"}
    events = json.loads(ended[f"/api/v1/runs/{run.id}/events/?after_seq=0&limit=1000"])
    decided_event = [e for e in events["events"] if e["type"] == "approval.decided"]
    assert decided_event[0]["payload"]["reason"] == "checked with [REDACTED]"

    # The WebSocket replays of the run's log and of the tenant's feed, to a viewer.
    secret = api_token_issue(tenant=tenant, user=viewer_user).secret
    last_id = (
        RunEvent.objects.filter(run=run).order_by("-id").values_list("id", flat=True)[0]
    )
    frames = _replay(secret, f"/ws/runs/{run.id}/?after_seq=0", last_id=last_id)
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    assert any(f["type"] == "approval.requested" for f in frames)
    feed = _replay(
        secret,
        "/ws/tenant/?after_id=0",
        last_id=max(e["id"] for e in frames if not e["type"].startswith("span.")),
    )
    assert any(f["type"] == "approval.decided" for f in feed)
    _assert_no_secret(
        {"run stream": json.dumps(frames), "tenant feed": json.dumps(feed)}
    )

    # The audit log, to an admin.
    audit = api_client_for(admin_user, tenant).get("/api/v1/audit/?limit=100")
    assert audit.status_code == 200
    decisions = [
        e for e in audit.json()["results"] if e["action"] == "approval.approve"
    ]
    assert decisions[0]["after"]["reason"] == "checked with [REDACTED]"
    _assert_no_secret({"audit": audit.content.decode()})
    assert stored.args_sha256 not in audit.content.decode()
    requested = [
        e for e in audit.json()["results"] if e["action"] == "approval.request"
    ]
    assert requested[0]["after"]["args_sha256"] == approval["args_sha256"]
    # Nor are they in the stored events and spans (rows written for readers).
    _assert_no_secret(
        {
            "stored events": json.dumps(
                list(RunEvent.objects.filter(run=run).values_list("payload", flat=True))
            )
        }
    )


def test_an_unparseable_raw_arguments_string_is_redacted_in_spans_and_the_api(
    scripted_agent: Any,
    partner_api: list[dict[str, Any]],
    viewer_user: Any,
    tenant: Any,
    api_client_for: Any,
    drive_run: Any,
) -> None:
    # Cut off mid-object: no JSON decoder reads it, the key rule still applies.
    raw = f'{{"url": "https://partner.example", "password": "{PASSWORD}", "api_k'
    call = {"id": "c1", "name": "call_partner_api", "arguments": raw}
    scripted_agent(
        [{"text": "", "tool_calls": [call]}, {"text": "Gave up."}],
        ["call_partner_api"],
    )
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
    )
    assert ToolCall.objects.get(run=run).raw_args == raw
    assert partner_api == []  # unusable arguments never run
    bodies = _everything_a_member_reads(api_client_for(viewer_user, tenant), run)
    _assert_no_secret(bodies)
    spans = "".join(t for p, t in bodies.items() if p.startswith("/api/v1/spans/"))
    assert '\\"password\\": \\"[REDACTED]\\"' in spans
    assert "https://partner.example" in spans


@pytest.fixture
def log_stream() -> Iterator[Any]:
    """The stream of the console handler Django configured from settings.LOGGING."""
    handlers = [
        h
        for h in logging.getLogger().handlers
        if any(isinstance(f, RedactingLogFilter) for f in h.filters)
    ]
    assert handlers, "settings.LOGGING's console handler is not installed"
    buffer = io.StringIO()
    previous = [h.setStream(buffer) for h in handlers]  # type: ignore[attr-defined]
    yield buffer
    for handler, stream in zip(handlers, previous, strict=True):
        handler.setStream(stream)  # type: ignore[attr-defined]


def test_a_log_record_with_secrets_is_redacted(log_stream: Any) -> None:
    logger = logging.getLogger("runs.services.advance")
    logger.warning("calling %s with password=%s", "https://partner.example", PASSWORD)
    try:
        raise RuntimeError(f"partner refused Authorization: Bearer {BEARER_VALUE}")
    except RuntimeError:
        logger.exception("tool failed: %s", json.dumps(ARGS))
    written = log_stream.getvalue()
    _assert_no_secret({"log": written})
    assert "calling https://partner.example with password=[REDACTED]" in written
    assert "RuntimeError: partner refused Authorization: [REDACTED]" in written
    assert '"region": "eu-west-1"' in written


def test_a_celery_process_logs_through_the_redacting_handler() -> None:
    # Celery's own logging setup (what `celery worker` and `beat` run) must keep
    # the project's handlers instead of installing unfiltered ones.
    script = (
        "import logging\n"
        "from controlplane.celery import app\n"
        "app.log.setup(loglevel='INFO')\n"
        f"logging.getLogger('celery.worker').warning('token=%s', {NESTED_TOKEN!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING celery.worker: token=[REDACTED]" in done.stderr
    assert NESTED_TOKEN not in done.stdout + done.stderr


def test_spans_stored_and_exported_hide_secrets_inside_serialized_arguments(
    scripted_agent: Any,
    partner_api: list[dict[str, Any]],
    operator_user: Any,
    tenant: Any,
    drive_run: Any,
    exported: Any,
) -> None:
    # The model's `function.arguments` and the tool span's arguments are JSON
    # text: the key rule applies inside them as it does to a dict.
    call = {"id": "c1", "name": "call_partner_api", "arguments": json.dumps(ARGS)}
    scripted_agent(
        [{"text": "", "tool_calls": [call]}, {"text": "Sent."}], ["call_partner_api"]
    )
    run = drive_run(
        run_start(tenant=tenant, agent_slug="scripted", input="go", started_by=None)
    )
    approval_decide(
        request=ApprovalRequest.objects.get(run=run),
        decided_by=operator_user,
        approve=True,
    )
    run = drive_run(run)
    assert run.is_terminal and partner_api == [ARGS]
    stored = json.dumps(
        [
            list(Span.objects.filter(run=run).values()),
            list(RunEvent.objects.filter(run=run).values("payload")),
            list(SpanPayload.objects.filter(tenant=tenant).values("content")),
        ],
        default=str,
    )
    spans = exported.get_finished_spans()
    sent = json.dumps(
        [
            [dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]]
            for s in spans
        ]
    )
    assert any(s.name == "execute_tool call_partner_api" for s in spans)
    _assert_no_secret({"stored spans": stored, "exported spans": sent})
    assert "eu-west-1" in stored and "eu-west-1" in sent
