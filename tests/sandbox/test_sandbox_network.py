"""Network: `none` is loopback only; an allowlist goes through the runner's proxy
(T-NET-1, T-NET-5, T-NET-6, NET-8, NET-9).

No test sends a packet to a non-loopback address. The allowlisted service is a real
HTTP server on the host's 127.0.0.1; reaching it needs the operator-level
`allow_loopback_targets` switch (the proxy refuses loopback otherwise), and names are
resolved by a fixed test resolver. What the proxy tests prove: the allowlist is
exact, refusals are decided on the resolved address before any connect, and the
sandbox has no route except the proxy. They do not prove anything about real DNS.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from runs.sandbox import NetworkPolicy, SandboxSettings, SandboxSpec, run_in_sandbox
from runs.sandbox.proxy import EgressProxy, address_refusal
from runs.sandbox.spec import HostPort

from .conftest import PYTHON, run_python

NAMES = {
    "svc.test": ["127.0.0.1"],
    "meta.test": ["169.254.169.254"],
    "intranet.test": ["10.1.2.3"],
    "mixed.test": ["93.184.215.14", "192.168.1.1"],
}


def fixed_resolver(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError(f"no such name {host}")
    return NAMES[host]


@pytest.fixture
def http_server() -> Iterator[int]:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"hello from the allowlisted service"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_network_none_cannot_reach_out_or_resolve(
    settings: SandboxSettings, workspace: Path, http_server: int
) -> None:
    code = f"""
import socket
try:
    socket.create_connection(("192.0.2.1", 80), timeout=2)
except OSError as exc:
    print("route", exc.errno)
try:
    socket.getaddrinfo("example.com", 80)
except OSError:
    print("dns failed")
try:
    socket.create_connection(("127.0.0.1", {http_server}), timeout=2)
    print("reached host loopback")
except OSError as exc:
    print("host-loopback", exc.errno)
"""
    r = run_python(settings, workspace, code)
    assert "route 101" in r.stdout  # ENETUNREACH: no route exists, nothing is sent
    assert "dns failed" in r.stdout
    assert "host-loopback 111" in r.stdout  # the sandbox has its own loopback


CLIENT = """
import json, socket, urllib.request
out = {}
for name, url in URLS:
    try:
        out[name] = urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as exc:
        out[name] = exc.code
    except OSError as exc:
        out[name] = str(exc)
try:
    socket.create_connection(("169.254.169.254", 80), timeout=2)
    out["raw"] = "connected"
except OSError as exc:
    out["raw"] = exc.errno
print(json.dumps(out))
"""


def test_allowlisted_host_reachable_others_refused(
    settings: SandboxSettings, workspace: Path, http_server: int
) -> None:
    port = http_server
    urls = [
        ("allowed", f"http://svc.test:{port}/"),
        ("other_host", f"http://other.test:{port}/"),
        ("other_port", f"http://svc.test:{port + 1}/"),
        ("private_literal", "http://10.1.2.3/"),
        ("metadata", "http://169.254.169.254/latest/meta-data/"),
        ("metadata_by_name", "http://meta.test/"),
        ("intranet_by_name", "http://intranet.test/"),
    ]
    network = NetworkPolicy.parse(
        f"svc.test:{port},10.1.2.3:80,169.254.169.254:80,meta.test:80,intranet.test:80"
    )
    test_settings = replace(
        settings, allow_loopback_targets=True, resolver=fixed_resolver
    )
    code = f"URLS = {urls!r}\n" + CLIENT
    spec = SandboxSpec(argv=[PYTHON, "-c", code], workspace=workspace, network=network)
    r = run_in_sandbox(spec, test_settings)
    import json

    out = json.loads(r.stdout)
    assert out["allowed"] == 200
    for name in (
        "other_host",
        "other_port",
        "private_literal",
        "metadata",
        "metadata_by_name",
        "intranet_by_name",
    ):
        assert out[name] == 403, name
    assert out["raw"] == 101  # a raw socket ignores HTTP_PROXY and has no route
    assert r.enforcement["network"] == "proxy"
    by_target = {e["target"]: e for e in r.network_log}
    assert by_target[f"svc.test:{port}"]["decision"] == "allow"
    for target, reason in [
        (f"other.test:{port}", "not on the allowlist"),
        ("10.1.2.3:80", "private address"),
        ("169.254.169.254:80", "cloud metadata address"),
        ("meta.test:80", "cloud metadata address"),
        ("intranet.test:80", "private address"),
    ]:
        entry = by_target[target]
        assert entry["decision"] == "deny" and reason in entry["reason"]
        assert entry["connect_attempted"] is False  # decided before any packet


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.0.1",
        "169.254.169.254",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "fe80::1",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "2002:a9fe:a9fe::1",
        "::",
    ],
)
def test_address_ranges_refused(address: str) -> None:
    assert address_refusal(address) is not None


def test_public_address_allowed() -> None:
    assert address_refusal("93.184.215.14") is None
    assert address_refusal("2606:4700::1111") is None


@pytest.mark.parametrize(
    "spelling",
    [
        "2130706433",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "127.1",
        "[::ffff:127.0.0.1]",
    ],
)
def test_loopback_in_every_spelling_is_refused(spelling: str) -> None:
    host = spelling.strip("[]")
    proxy = EgressProxy("/nonexistent", (HostPort(host, 80),), resolver=fixed_resolver)
    address, reason = proxy.decide(spelling, 80)
    assert address is None and "loopback" in reason


def test_a_name_resolving_to_any_private_address_is_refused() -> None:
    proxy = EgressProxy(
        "/nonexistent", (HostPort("mixed.test", 443),), resolver=fixed_resolver
    )
    address, reason = proxy.decide("mixed.test", 443)
    assert address is None and "192.168.1.1" in reason


def test_names_off_the_allowlist_are_never_resolved() -> None:
    looked_up: list[str] = []

    def spy(host: str, port: int) -> list[str]:
        looked_up.append(host)
        return ["93.184.215.14"]

    proxy = EgressProxy("/nonexistent", (HostPort("ok.test", 443),), resolver=spy)
    assert proxy.decide("exfil-secret.attacker.test", 443)[0] is None
    assert looked_up == []
    assert proxy.decide("ok.test", 443) == ("93.184.215.14", "")


CONNECT = """
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT svc.test:%d HTTP/1.1\\r\\nHost: svc.test\\r\\n\\r\\n" % PORT)
print(s.recv(4096).split(b"\\r\\n")[0].decode())
s.sendall(b"GET / HTTP/1.1\\r\\nHost: svc.test\\r\\nConnection: close\\r\\n\\r\\n")
data = b""
while chunk := s.recv(4096):
    data += chunk
print(data.split(b"\\r\\n")[0].decode(), data.endswith(b"allowlisted service"))
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT 169.254.169.254:443 HTTP/1.1\\r\\n\\r\\n")
print(s.recv(4096).split(b"\\r\\n")[0].decode())
"""


def test_connect_tunnel_is_allowlisted_too(
    settings: SandboxSettings, workspace: Path, http_server: int
) -> None:
    network = NetworkPolicy.parse(f"svc.test:{http_server},169.254.169.254:443")
    test_settings = replace(
        settings, allow_loopback_targets=True, resolver=fixed_resolver
    )
    code = f"PORT = {http_server}\n" + CONNECT
    spec = SandboxSpec(argv=[PYTHON, "-c", code], workspace=workspace, network=network)
    r = run_in_sandbox(spec, test_settings)
    assert r.stdout.splitlines() == [
        "HTTP/1.1 200 Connection established",
        "HTTP/1.0 200 OK True",
        "HTTP/1.1 403 Forbidden (sandbox proxy: 169.254.169.254: cloud metadata "
        "address)",
    ], r.stderr
