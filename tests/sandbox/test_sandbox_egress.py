"""Egress through the proxy: `private:` entries, DNS rebinding, the per-connection
log, and credentials injected by the proxy so the sandbox never holds them.

The upstreams are real HTTP(S) servers on the host's 127.0.0.1 (tests send no packet
elsewhere); reaching them takes a `private:` entry, which is the admin's explicit
permission, not the test-only `allow_loopback_targets` switch.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from runs.sandbox import (
    InjectedCredential,
    NetworkPolicy,
    SandboxSettings,
    SandboxSpec,
    SandboxSpecError,
    run_in_sandbox,
)
from runs.sandbox.proxy import EgressProxy, address_refusal
from runs.sandbox.spec import HostPort

from .conftest import PYTHON
from .egress_servers import BODY, Upstream, make_ca, upstream_server

SECRET = "sk-live-egress-7f3a9c0d1e2b4a68"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with upstream_server() as server:
        yield server


def run(
    settings: SandboxSettings, workspace: Path, code: str, network: NetworkPolicy
) -> tuple[dict, object]:
    spec = SandboxSpec(argv=[PYTHON, "-c", code], workspace=workspace, network=network)
    result = run_in_sandbox(spec, settings)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result


FETCH = """
import json, urllib.request
out = {}
for name, url in URLS:
    request = urllib.request.Request(url, headers=HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            out[name] = [r.status, r.read().decode()]
    except urllib.error.HTTPError as exc:
        out[name] = [exc.code, exc.read().decode()]
    except OSError as exc:
        out[name] = [0, str(exc)]
print(json.dumps(out))
"""


def fetch(urls: list[tuple[str, str]], headers: dict[str, str] | None = None) -> str:
    return f"URLS = {urls!r}\nHEADERS = {headers or {}!r}\n" + FETCH


def test_private_entries_reach_loopback_plain_entries_do_not(
    settings: SandboxSettings, workspace: Path, upstream: Upstream
) -> None:
    port = upstream.port
    network = NetworkPolicy.parse(
        f"private:127.0.0.1:{port},private:localhost:{port},localhost:{port + 1}"
    )
    urls = [
        ("literal", f"http://127.0.0.1:{port}/a"),
        ("name", f"http://localhost:{port}/b"),
        ("not_private", f"http://localhost:{port + 1}/c"),
    ]
    out, result = run(settings, workspace, fetch(urls), network)
    assert out["literal"] == [200, BODY.decode()]
    assert out["name"] == [200, BODY.decode()]
    assert out["not_private"][0] == 403
    assert "loopback address" in out["not_private"][1]
    assert [path for _, path, _ in upstream.requests] == ["/a", "/b"]
    log = {entry["target"]: entry for entry in result.network_log}
    allowed = log[f"127.0.0.1:{port}"]
    assert allowed["decision"] == "allow" and allowed["address"] == "127.0.0.1"
    assert allowed["bytes_in"] > len(BODY) and allowed["bytes_out"] > 0
    refused = log[f"localhost:{port + 1}"]
    assert refused["decision"] == "deny" and refused["connect_attempted"] is False
    assert result.network_counts == {"allow": 2, "deny": 1}


def test_metadata_multicast_and_unspecified_stay_refused_for_private_entries() -> None:
    for address in ("169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        assert address_refusal(address, allow_private=True) == "cloud metadata address"
    for address in ("224.0.0.1", "0.0.0.0", "::", "ff02::1", "240.0.0.1"):
        assert address_refusal(address, allow_private=True) is not None
    for address in ("10.1.2.3", "192.168.0.1", "172.16.0.1", "100.64.0.1", "::1"):
        assert address_refusal(address, allow_private=True) is None
        assert address_refusal(address) is not None


def test_dns_rebinding_the_address_connected_to_is_the_one_checked() -> None:
    """The name resolves to a public address once, then to loopback: each
    connection is decided on what that connection's resolution returned, and the
    proxy connects only to those addresses."""
    answers = [["93.184.215.14"], ["127.0.0.1"], ["93.184.215.14", "10.0.0.7"]]

    def rebinding(host: str, port: int) -> list[str]:
        return answers.pop(0)

    proxy = EgressProxy(
        "/nonexistent", (HostPort("api.test", 443),), resolver=rebinding
    )
    assert proxy.decide("api.test", 443) == ("93.184.215.14", "")
    assert proxy.decide("api.test", 443) == (None, "127.0.0.1: loopback address")
    assert proxy.decide("api.test", 443) == (None, "10.0.0.7: private address")


def test_a_name_rebound_to_loopback_is_refused_in_the_sandbox(
    settings: SandboxSettings, workspace: Path, upstream: Upstream
) -> None:
    port = upstream.port
    rebound = replace(settings, resolver=lambda host, p: ["127.0.0.1"])
    network = NetworkPolicy.parse(f"api.test:{port}")
    out, result = run(
        rebound, workspace, fetch([("x", f"http://api.test:{port}/")]), network
    )
    assert out["x"][0] == 403 and "loopback" in out["x"][1]
    assert upstream.requests == []  # nothing reached it
    [entry] = result.network_log
    assert entry["decision"] == "deny" and entry["connect_attempted"] is False


def _proxy_request(proxy: EgressProxy, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(proxy.socket_path)
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_the_log_is_capped_but_every_connection_is_counted(tmp_path: Path) -> None:
    proxy = EgressProxy(
        str(tmp_path / "proxy.sock"), (HostPort("ok.test", 443),), max_log=3
    )
    proxy.start()
    try:
        for i in range(5):
            reply = _proxy_request(
                proxy, f"CONNECT x{i}.test:443 HTTP/1.1\r\n\r\n".encode()
            )
            assert reply.startswith(b"HTTP/1.1 403")
        reply = _proxy_request(proxy, b"GARBAGE\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 400")
        folded = b"GET http://ok.test:443/ HTTP/1.1\r\nX-A: 1\r\n Host: evil\r\n\r\n"
        assert _proxy_request(proxy, folded).startswith(b"HTTP/1.1 400")
    finally:
        proxy.stop()
    assert len(proxy.log) == 3
    assert proxy.counts == {"deny": 7}


CREDENTIALED = """
import json, os, urllib.request
out = {}
request = urllib.request.Request(
    URL, headers={"Authorization": "Bearer forged", "Host": "fronted.example"}
)
with urllib.request.urlopen(request, timeout=10) as r:
    out["status"] = r.status
    out["body"] = r.read().decode()
# CONNECT to the credentialed target: refused, with what to do instead.
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(("CONNECT %s HTTP/1.1\\r\\n\\r\\n" % TARGET).encode())
out["connect"] = s.recv(4096).decode()
# Everything the sandbox can see that could hold a secret, dumped for the host.
seen = {"env": dict(os.environ), "procs": {}, "files": {}}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("cmdline", "environ"):
            try:
                data = open(f"/proc/{pid}/{name}", "rb").read()
                seen["procs"][pid + "/" + name] = data.decode("latin-1")
            except OSError as exc:
                seen["procs"][pid + "/" + name] = str(exc)
for top in ("/workspace", "/tmp", "/dev/shm", "/run"):
    for root, dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            try:
                seen["files"][path] = open(path, "rb").read(20000).decode("latin-1")
            except OSError as exc:
                seen["files"][path] = str(exc)
out["seen"] = seen
print(json.dumps(out))
"""


def test_the_proxy_injects_the_credential_the_sandbox_never_holds_it(
    settings: SandboxSettings, workspace: Path, upstream: Upstream
) -> None:
    target = f"localhost:{upstream.port}"
    network = NetworkPolicy(
        allow=(HostPort.parse(f"private:{target}"),),
        credentials=(
            InjectedCredential(
                "localhost",
                upstream.port,
                header="Authorization",
                value=f"Bearer {SECRET}",
                tls=False,
                secret_name="PARTNER_KEY",
            ),
        ),
    )
    assert SECRET not in repr(network)
    code = f"URL = 'http://{target}/v1/orders'\nTARGET = {target!r}\n" + CREDENTIALED
    out, result = run(settings, workspace, code, network)
    assert out["status"] == 200 and out["body"] == BODY.decode()
    [(method, path, headers)] = upstream.requests
    assert (method, path) == ("GET", "/v1/orders")
    # The program's own Authorization header was replaced, not doubled.
    assert headers["Authorization"] == f"Bearer {SECRET}"
    assert "forged" not in json.dumps(headers)
    # Host is the checked target's, not the program's (no domain fronting).
    assert headers["Host"] == target
    # The reason is in the status line too: a client shows only that.
    status_line = out["connect"].split("\r\n")[0]
    assert status_line.startswith("HTTP/1.1 403 Forbidden (")
    assert f"http://{target}/" in status_line
    # Nowhere in the sandbox: environment, processes, files, output, result.
    assert out["seen"]["files"], "the dump saw no files at all"
    assert SECRET not in result.stdout and SECRET not in result.stderr
    assert SECRET not in json.dumps(result.to_dict())
    # Logged as each connection ends, so in either order.
    by_decision = {entry["decision"]: entry for entry in result.network_log}
    allowed, refused = by_decision["allow"], by_decision["deny"]
    assert allowed["credential"] == "PARTNER_KEY" and allowed["decision"] == "allow"
    assert refused["decision"] == "deny" and "CONNECT" in refused["reason"]


def test_tls_upstream_opened_by_the_proxy_verified_against_the_ca(
    settings: SandboxSettings, workspace: Path, tmp_path: Path
) -> None:
    ca = make_ca(tmp_path)
    (tmp_path / "other").mkdir()
    other_ca = make_ca(tmp_path / "other")
    with upstream_server(tls=ca.server_context) as upstream:
        target = f"localhost:{upstream.port}"
        credential = InjectedCredential(
            "localhost",
            upstream.port,
            header="X-Api-Key",
            value=SECRET,
            tls=True,
            secret_name="PARTNER_KEY",
        )
        network = NetworkPolicy(
            allow=(HostPort.parse(f"private:{target}"),), credentials=(credential,)
        )
        code = fetch([("tls", f"http://{target}/secure")], {"X-Api-Key": "forged"})
        trusted = replace(settings, egress_ca_file=str(ca.ca_file))
        out, result = run(trusted, workspace, code, network)
        assert out["tls"] == [200, BODY.decode()]
        [(_, path, headers)] = upstream.requests
        assert path == "/secure" and headers["X-Api-Key"] == SECRET
        assert headers["Host"] == target
        [entry] = result.network_log
        assert entry["tls"] is True and entry["decision"] == "allow"
        assert SECRET not in result.stdout

        # A certificate the proxy does not trust: no request, no header sent.
        untrusted = replace(settings, egress_ca_file=str(other_ca.ca_file))
        out, result = run(untrusted, workspace, code, network)
        assert out["tls"][0] == 502
        assert len(upstream.requests) == 1
        [entry] = result.network_log
        assert entry["decision"] == "error" and "TLS" in entry["reason"]


def test_a_credential_must_be_for_a_listed_target_and_a_single_line(
    settings: SandboxSettings, workspace: Path
) -> None:
    def spec(allow: str, value: str) -> SandboxSpec:
        credential = InjectedCredential(
            "api.test", 443, header="Authorization", value=value, tls=True
        )
        network = NetworkPolicy(
            allow=(HostPort.parse(allow),), credentials=(credential,)
        )
        return SandboxSpec(
            argv=[PYTHON, "-c", "pass"], workspace=workspace, network=network
        )

    with pytest.raises(SandboxSpecError, match="not on the allowlist"):
        run_in_sandbox(spec("other.test:443", "x"), settings)
    with pytest.raises(SandboxSpecError, match="line break"):
        run_in_sandbox(spec("api.test:443", "x\r\nHost: evil"), settings)


@pytest.mark.parametrize(
    "text",
    [
        "api.test",
        "api.test:0",
        "api.test:70000",
        ":443",
        "a..b:1",
        "private:",
        "x y:1",
        "http://api.test:443",
        "[::1:443",
    ],
)
def test_malformed_entries_are_refused(text: str) -> None:
    with pytest.raises(SandboxSpecError):
        HostPort.parse(text)


def test_entries_parse_with_and_without_private() -> None:
    assert HostPort.parse("API.test.:443") == HostPort("api.test", 443)
    assert HostPort.parse("private:10.0.0.5:8080") == HostPort("10.0.0.5", 8080, True)
    assert HostPort.parse("[::1]:80") == HostPort("::1", 80)
    assert str(HostPort("10.0.0.5", 8080, True)) == "private:10.0.0.5:8080"


LEFT_OPEN = """
import os, socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT " + TARGET.encode() + b" HTTP/1.1\\r\\n\\r\\n")
print(s.recv(4096).split(b"\\r\\n")[0].decode(), flush=True)
s.sendall(b"GET / HTTP/1.1\\r\\n")  # half a request, then gone without closing
os._exit(0)
"""


def test_a_connection_left_open_is_in_the_log(
    settings: SandboxSettings, workspace: Path, upstream: Upstream
) -> None:
    target = f"127.0.0.1:{upstream.port}"
    network = NetworkPolicy.parse(f"private:{target}")
    code = f"TARGET = {target!r}\n" + LEFT_OPEN
    spec = SandboxSpec(argv=[PYTHON, "-c", code], workspace=workspace, network=network)
    result = run_in_sandbox(spec, settings)
    assert result.stdout == "HTTP/1.1 200 Connection established\n", result.stderr
    [entry] = result.network_log
    assert entry["decision"] == "allow" and entry["bytes_out"] == len(
        "GET / HTTP/1.1\r\n"
    )
