"""run_code with egress settings (tool_settings["run_code"]): the allowlist and the
credentials the proxy injects, through the tool's host path and the real sandbox,
against real local upstream servers; the settings validator names the field."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.secrets import secret_set
from runs.engine.contracts import Effect
from runs.engine.tools import ToolContext, execute_tool
from runs.tools.egress import egress_settings_errors
from runs.tools.registry import tool_registry_for
from runs.tools.run_code import RUN_CODE_TOOL, run_code_tool
from tests.sandbox.egress_servers import BODY, Upstream, upstream_server

SECRET = "pk-egress-0c1d2e3f4a5b6c7d8e9f"


@pytest.fixture(autouse=True)
def bubblewrap_installed() -> None:
    assert shutil.which("bwrap"), "run_code needs bubblewrap"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


PROGRAM = """
import json, os, urllib.request
out = {"env": dict(os.environ)}
for name, url in URLS:
    request = urllib.request.Request(url, headers={"Authorization": "Bearer mine"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            out[name] = [r.status, r.read().decode()]
    except urllib.error.HTTPError as exc:
        out[name] = [exc.code, exc.read().decode()]
print(json.dumps(out))
"""


def call_run_code(tool_settings: dict[str, Any], code: str, tenant: Any) -> Any:
    registry = tool_registry_for(
        ["run_code"],
        tenant_id=str(tenant.id),
        tool_settings={"run_code": tool_settings},
    )
    tool = registry.get("run_code")
    assert tool is not None
    ctx = ToolContext.for_call("run-1", "call-1", tenant_id=str(tenant.id))
    return execute_tool(tool, {"code": code}, ctx, timeout_seconds=None)


def test_run_code_reaches_listed_hosts_with_the_injected_credential(
    tenant: Any, upstream: Upstream
) -> None:
    secret_set(tenant=tenant, name="PARTNER_KEY", value=SECRET, actor=None)
    target = f"localhost:{upstream.port}"
    settings = {
        "network": [f"private:{target}", f"localhost:{upstream.port + 1}"],
        "credentials": {
            target: {"secret": "PARTNER_KEY", "prefix": "Bearer ", "tls": False}
        },
    }
    urls = [
        ("credentialed", f"http://{target}/orders"),
        ("refused", f"http://localhost:{upstream.port + 1}/"),
        ("off_list", "http://example.invalid:80/"),
    ]
    result = call_run_code(settings, f"URLS = {urls!r}\n" + PROGRAM, tenant)
    assert result.ok, result.to_dict()
    out = json.loads(result.data["stdout"])
    assert out["credentialed"] == [200, BODY.decode()]
    assert out["refused"][0] == 403 and "loopback" in out["refused"][1]
    assert out["off_list"][0] == 403
    [(_, path, headers)] = upstream.requests
    assert path == "/orders" and headers["Authorization"] == f"Bearer {SECRET}"
    # The secret is in no part of what the sandbox had or returned.
    assert SECRET not in json.dumps(out["env"])
    assert SECRET not in json.dumps(result.to_dict())
    [report] = [r["result"] for r in result.refs if r["kind"] == "sandbox_result"]
    log = {entry["target"]: entry for entry in report["network_log"]}
    assert log[target]["decision"] == "allow"
    assert log[target]["credential"] == "PARTNER_KEY"
    assert log[f"localhost:{upstream.port + 1}"]["decision"] == "deny"
    assert log["example.invalid:80"]["reason"] == "not on the allowlist"
    assert report["network_counts"] == {"allow": 1, "deny": 2}


@pytest.fixture
def echoing() -> Iterator[int]:
    """An upstream that says back the request headers it got (careless or hostile)."""

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = json.dumps(dict(self.headers)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_an_upstream_echoing_the_credential_cannot_pass_it_to_the_model(
    tenant: Any, echoing: int
) -> None:
    secret_set(tenant=tenant, name="PARTNER_KEY", value=SECRET, actor=None)
    target = f"localhost:{echoing}"
    settings = {
        "network": [f"private:{target}"],
        "credentials": {target: {"secret": "PARTNER_KEY", "tls": False}},
    }
    code = f"URLS = [('echoed', 'http://{target}/me')]\n" + PROGRAM
    result = call_run_code(settings, code, tenant)
    assert result.ok, result.to_dict()
    out = json.loads(result.data["stdout"])
    status, body = out["echoed"]
    # The upstream got it (and said it back); the program's output lost it.
    assert status == 200 and json.loads(body)["Authorization"] == "[REDACTED]"
    assert SECRET not in json.dumps(result.to_dict())


def test_a_missing_secret_fails_the_call_naming_it_and_runs_nothing(
    tenant: Any, upstream: Upstream
) -> None:
    target = f"localhost:{upstream.port}"
    settings = {
        "network": [f"private:{target}"],
        "credentials": {target: {"secret": "NOT_SET_HERE"}},
    }
    code = f"URLS = [('x', 'http://{target}/')]\n" + PROGRAM
    result = call_run_code(settings, code, tenant)
    assert not result.ok
    assert result.error.code == "EACCES"
    assert "NOT_SET_HERE" in result.error.message
    assert result.error.retryable is False
    assert upstream.requests == []
    assert not result.refs  # no sandbox ran


def test_without_network_run_code_is_the_read_only_tool() -> None:
    assert run_code_tool(None) is RUN_CODE_TOOL
    assert run_code_tool({"approval": "never"}) is RUN_CODE_TOOL
    assert run_code_tool({"network": []}) is RUN_CODE_TOOL
    assert RUN_CODE_TOOL.contract.effect is Effect.READ_ONLY


def test_with_network_run_code_is_an_external_write_that_names_its_hosts() -> None:
    tool = run_code_tool(
        {
            "network": ["api.example.com:443", "private:10.0.0.5:8080"],
            "credentials": {"api.example.com:443": {"secret": "K"}},
        }
    )
    assert tool.contract.effect is Effect.IRREVERSIBLE_EXTERNAL
    text = tool.contract.description
    assert "api.example.com:443" in text and "10.0.0.5:8080" in text
    assert "private:" not in text
    assert "http://HOST:PORT/" in text
    assert tool.contract.input_schema == RUN_CODE_TOOL.contract.input_schema


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"network": "api.test:443"}, "t.network"),
        ({"network": ["api.test"]}, "t.network[0]"),
        ({"network": ["ok.test:443", "api.test:99999"]}, "t.network[1]"),
        ({"network": ["ok.test:443", 443]}, "t.network[1]"),
        ({"network": ["https://api.test:443"]}, "t.network[0]"),
        ({"network": ["x.test:1"] * 33}, "t.network"),
        ({"network": ["a.test:443"], "credentials": []}, "t.credentials"),
        (
            {"network": ["a.test:443"], "credentials": {"b.test:443": {"secret": "K"}}},
            "t.credentials.b.test:443",
        ),
        (
            {"network": ["a.test:443"], "credentials": {"a.test": {"secret": "K"}}},
            "t.credentials.a.test",
        ),
        (
            {"network": ["a.test:443"], "credentials": {"a.test:443": {}}},
            "t.credentials.a.test:443.secret",
        ),
        (
            {"network": ["a.test:443"], "credentials": {"a.test:443": {"secret": "1"}}},
            "t.credentials.a.test:443.secret",
        ),
        (
            {
                "network": ["a.test:443"],
                "credentials": {"a.test:443": {"secret": "K", "header": "Bad Name"}},
            },
            "t.credentials.a.test:443.header",
        ),
        (
            {
                "network": ["a.test:443"],
                "credentials": {"a.test:443": {"secret": "K", "header": "Host"}},
            },
            "t.credentials.a.test:443.header",
        ),
        (
            {
                "network": ["a.test:443"],
                "credentials": {"a.test:443": {"secret": "K", "prefix": "x\r\ny"}},
            },
            "t.credentials.a.test:443.prefix",
        ),
        (
            {
                "network": ["a.test:443"],
                "credentials": {"a.test:443": {"secret": "K", "tls": "yes"}},
            },
            "t.credentials.a.test:443.tls",
        ),
        (
            {
                "network": ["a.test:443"],
                "credentials": {"a.test:443": {"secret": "K", "value": "sk-x"}},
            },
            "t.credentials.a.test:443",
        ),
    ],
)
def test_malformed_settings_name_the_field(settings: Any, field: str) -> None:
    errors = egress_settings_errors(settings, field="t")
    assert field in errors, errors


def test_valid_settings_have_no_errors() -> None:
    settings = {
        "network": [
            "api.example.com:443",
            "private:10.0.0.5:5432",
            "[2001:db8::1]:443",
        ],
        "credentials": {
            "api.example.com:443": {
                "secret": "PARTNER_KEY",
                "header": "Authorization",
                "prefix": "Bearer ",
                "tls": True,
            },
            "10.0.0.5:5432": {"secret": "DB_TOKEN", "header": "X-Token"},
        },
        "approval": "never",
    }
    assert egress_settings_errors(settings, field="t") == {}
    assert egress_settings_errors(None, field="t") == {}


def test_with_a_tenant_a_credential_naming_an_unset_secret_is_an_error(
    tenant: Any,
) -> None:
    secret_set(tenant=tenant, name="PARTNER_KEY", value=SECRET, actor=None)
    settings = {
        "network": ["a.test:443", "b.test:443"],
        "credentials": {
            "a.test:443": {"secret": "PARTNER_KEY"},
            "b.test:443": {"secret": "NOT_SET"},
        },
    }
    errors = egress_settings_errors(settings, field="t", tenant_id=tenant.id)
    assert errors == {
        "t.credentials.b.test:443.secret": "secret 'NOT_SET' is not set in this tenant"
    }
