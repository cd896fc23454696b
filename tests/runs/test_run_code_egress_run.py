"""A real run of an agent whose version gives run_code egress: the proxy's
decisions show as `egress` events on the run's `sandbox` span, the credential
reaches the upstream, and the secret is nowhere a reader or the sandbox can look."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.redaction import REDACTED
from controlplane.secrets import secret_set
from runs.models import ToolCall
from runs.services import run_start
from tests.sandbox.egress_servers import BODY, Upstream, upstream_server
from tests.secrets_probe import SecretProbe, captured_logs
from tracing.models import Span

SECRET = "pk-run-egress-5e6f7a8b9c0d1e2f3a4b"

PROGRAM = """
import json, os, urllib.request
out = {"env": sorted(os.environ.items())}
for name, url in URLS:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            out[name] = [r.status, r.read().decode()]
    except urllib.error.HTTPError as exc:
        out[name] = [exc.code, exc.read().decode()]
print(json.dumps(out))
"""


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


def test_egress_of_a_run_shows_in_its_sandbox_span_and_the_secret_nowhere(
    scripted_agent: Any, tenant: Any, drive_run: Any, upstream: Upstream
) -> None:
    secret_set(tenant=tenant, name="PARTNER_KEY", value=SECRET, actor=None)
    target = f"localhost:{upstream.port}"
    refused = f"localhost:{upstream.port + 1}"
    urls = [
        ("partner", f"http://{target}/v1/orders/4821"),
        ("loopback", f"http://{refused}/"),
        ("metadata", "http://169.254.169.254/latest/meta-data/"),
    ]
    code = f"URLS = {urls!r}\n" + PROGRAM
    scripted_agent(
        [
            {
                "tool_calls": [
                    {"id": "c1", "name": "run_code", "arguments": {"code": code}}
                ]
            },
            {"text": "done"},
        ],
        ["run_code"],
        tool_settings={
            "run_code": {
                "network": [f"private:{target}", refused],
                "credentials": {
                    target: {"secret": "PARTNER_KEY", "prefix": "Bearer ", "tls": False}
                },
                # run_code with network is an external write: the agent's
                # override lets it run without a reviewer in this test.
                "approval": "never",
            }
        },
    )
    with captured_logs() as logs:
        run = drive_run(
            run_start(tenant=tenant, agent_slug="scripted", input="x", started_by=None)
        )
    call = ToolCall.objects.get(run=run)
    assert call.status == "succeeded", call.result
    out = json.loads(call.result["data"]["stdout"])
    assert out["partner"] == [200, BODY.decode()]
    assert out["loopback"][0] == 403 and out["metadata"][0] == 403
    [(_, path, headers)] = upstream.requests
    assert path == "/v1/orders/4821"
    assert headers["Authorization"] == f"Bearer {SECRET}"

    # The trace tree: execute_tool run_code > sandbox, one egress event each.
    tool_span = Span.objects.get(run=run, name="execute_tool run_code")
    sandbox = Span.objects.get(run=run, name="sandbox")
    assert sandbox.parent_span_id == tool_span.span_id
    assert sandbox.attributes["cp.sandbox.egress.allow"] == 1
    assert sandbox.attributes["cp.sandbox.egress.deny"] == 2
    events = {
        e["attributes"]["cp.egress.target"]: e["attributes"]
        for e in sandbox.events
        if e["name"] == "egress"
    }
    assert events[target]["cp.egress.decision"] == "allow"
    assert events[target]["cp.egress.credential"] == "PARTNER_KEY"
    assert events[target]["cp.egress.bytes_in"] > len(BODY)
    assert events[target]["cp.egress.address"] in ("127.0.0.1", "::1")
    assert events[refused]["cp.egress.decision"] == "deny"
    assert "loopback address" in events[refused]["cp.egress.reason"]
    assert events["169.254.169.254:80"]["cp.egress.reason"] == "not on the allowlist"

    # The secret: not in what the sandbox had or printed, no table (spans, events,
    # payloads, the tool call's result and sandbox report), no log line; and
    # nothing had to be scrubbed from the trace for it (the run never held it).
    probe = SecretProbe(SECRET)
    probe.text("the sandbox's environment and output", call.result["data"]["stdout"])
    probe.text("the sandbox's stderr", call.result["data"]["stderr"])
    probe.logs(logs)
    probe.database()
    probe.assert_clean()
    assert REDACTED not in json.dumps([sandbox.attributes, sandbox.events])
