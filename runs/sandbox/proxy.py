"""The egress proxy of one run: allowlisted host:port only, decided before any packet.

The sandbox has its own network namespace with only loopback; its one way out is a
unix socket bound into it (bridged to 127.0.0.1:<port> inside by the init). This proxy
listens on that socket in the runner and, for each HTTP CONNECT or absolute-URI
request:

1. refuses any host:port not on the allowlist (no DNS lookup happens for it, so a
   refused name cannot exfiltrate data through the resolver either);
2. resolves the name itself and refuses if ANY resolved address is loopback, private,
   link-local, metadata, multicast, reserved or otherwise not global. The check runs on
   the resolved address with `ipaddress`, so 2130706433, 0177.0.0.1, 0x7f.1 and
   ::ffff:127.0.0.1 are all the same 127.0.0.1. An entry the admin marked `private:`
   may reach loopback, private and link-local addresses; metadata, multicast,
   unspecified and reserved ones stay refused for every entry;
3. connects to the pinned addresses (not the name again, so DNS rebinding between
   check and connect is impossible) and re-checks the peer address.

For a target with an injected credential the sandbox sends plain HTTP
(`GET http://host:port/path`); the proxy removes any header of the credential's name
the client sent, adds the real one, and opens TLS to the upstream itself when the
credential says so (verified against the system CAs or the operator's CA file, SNI
and hostname = the listed name). A CONNECT to such a target is refused: the proxy
cannot add a header inside a tunnel it cannot read, and the refusal says what to do.
Only one request per connection is forwarded (`Connection: close` upstream).

It follows no redirects: a 3xx goes back to the client, whose next request comes
through these same checks. Each connection is logged (`log`): target, resolved
address, decision, reason, bytes each way, and the credential's secret name (never
its value); past `max_log` entries only the counts grow.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from .spec import HostPort, InjectedCredential

Resolver = Callable[[str, int], list[str]]

_METADATA = {
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure IMDS
    ipaddress.ip_address("fd00:ec2::254"),  # AWS IMDS over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    ipaddress.ip_address("168.63.129.16"),  # Azure wireserver
}
_MAX_HEAD = 16384
MAX_LOG_ENTRIES = 200
# How long stop() lets connections forward what the ended sandbox sent last.
DRAIN_SECONDS = 1.0


def default_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _numeric_address(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )
    except socket.gaierror:
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def address_refusal(
    address: str, *, allow_loopback: bool = False, allow_private: bool = False
) -> str | None:
    """Why `address` must not be reached, or None if it may be. `allow_private`
    (an admin's `private:` entry) lets loopback, private and link-local through;
    metadata, multicast, unspecified and reserved addresses are always refused."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
            address.split("%", 1)[0]
        )
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
        elif ip.teredo is not None:
            return "teredo tunnel address"
    if ip in _METADATA:
        return "cloud metadata address"
    if ip.is_multicast or ip.is_unspecified:
        return "multicast, reserved or unspecified address"
    if ip.is_loopback:
        return None if allow_loopback or allow_private else "loopback address"
    if ip.is_reserved:
        return "multicast, reserved or unspecified address"
    if allow_private:
        return None
    if ip.is_link_local:
        return "link-local address"
    if ip.is_private:
        return "private address"
    if not ip.is_global:
        return "non-global address"
    return None


class EgressProxy:
    """A per-run HTTP CONNECT / forward proxy on a unix socket."""

    def __init__(
        self,
        socket_path: str,
        allow: tuple[HostPort, ...],
        *,
        credentials: tuple[InjectedCredential, ...] = (),
        resolver: Resolver | None = None,
        allow_loopback: bool = False,
        connect_timeout: float = 10.0,
        tls_context: ssl.SSLContext | None = None,
        max_log: int = MAX_LOG_ENTRIES,
    ) -> None:
        self.socket_path = socket_path
        # An entry listed both plain and `private:` is private: the admin said so.
        self.allow: dict[tuple[str, int], HostPort] = {}
        for target in allow:
            key = (target.host.lower(), target.port)
            if key not in self.allow or target.private:
                self.allow[key] = target
        self.credentials = {(c.host.lower(), c.port): c for c in credentials}
        self.resolver = resolver or default_resolver
        self.allow_loopback = allow_loopback
        self.connect_timeout = connect_timeout
        self._tls_context = tls_context
        self.max_log = max_log
        self.log: list[dict[str, Any]] = []
        # Every connection by decision, the ones past `max_log` included.
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()
        # Set when a connection has read all the sandbox sent (or ended).
        self._drained: set[threading.Event] = set()
        self._stopping = False

    @property
    def tls_context(self) -> ssl.SSLContext:
        if self._tls_context is None:
            self._tls_context = ssl.create_default_context()
        return self._tls_context

    def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        # The sandbox uid must be able to connect; the directory above it is the
        # runner's per-run directory, reachable only by that bind mount.
        os.chmod(self.socket_path, 0o666)
        listener.listen(64)
        self._listener = listener
        thread = threading.Thread(
            target=self._accept_loop, name="sandbox-proxy", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stopping = True
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        # The sandbox is gone: what it wrote last still sits in its sockets.
        # Let each relay read and forward it (so the log counts it) before the
        # sockets are shut, for a bounded time.
        deadline = time.monotonic() + DRAIN_SECONDS
        with self._lock:
            draining = list(self._drained)
        for drained in draining:
            drained.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=2.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _record(self, entry: dict[str, Any]) -> None:
        entry["at"] = time.time()
        entry.setdefault("decision", "error")
        with self._lock:
            decision = str(entry["decision"])
            self.counts[decision] = self.counts.get(decision, 0) + 1
            if len(self.log) < self.max_log:
                self.log.append(entry)

    def decide(self, host: str, port: int) -> tuple[str | None, str]:
        """(first address to connect to, "") or (None, reason). Sends no packet."""
        addresses, reason = self.decide_all(host, port)
        return (addresses[0], "") if addresses else (None, reason)

    def decide_all(self, host: str, port: int) -> tuple[list[str], str]:
        """(every resolved address, all checked, "") or ([], reason)."""
        host = host.lower().rstrip(".").strip("[]")
        target = self.allow.get((host, port))
        if target is None:
            return [], "not on the allowlist"
        try:
            # An IP literal in any spelling (2130706433, 0177.0.0.1, 0x7f.1, ::ffff:..)
            # is decoded here without DNS; only real names go to the resolver.
            addresses = _numeric_address(host, port) or self.resolver(host, port)
        except OSError as exc:
            return [], f"resolution failed: {exc}"
        if not addresses:
            return [], "resolution returned no address"
        for address in addresses:
            reason = self._refusal(address, target)
            if reason:
                return [], f"{address}: {reason}"
        return addresses, ""

    def _refusal(self, address: str, target: HostPort) -> str | None:
        return address_refusal(
            address, allow_loopback=self.allow_loopback, allow_private=target.private
        )

    def _connect(self, addresses: list[str], port: int) -> socket.socket:
        """The first pinned address that answers (localhost may be ::1 and
        127.0.0.1, a server listening on one of them)."""
        error: OSError = OSError("no address")
        for address in addresses:
            try:
                return socket.create_connection(
                    (address, port), timeout=self.connect_timeout
                )
            except OSError as exc:
                error = exc
        raise error

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        drained = threading.Event()
        with self._lock:
            self._drained.add(drained)
        upstream: socket.socket | None = None
        entry: dict[str, Any] = {"connect_attempted": False}
        try:
            head, rest = _read_head(client)
            method, target, version, header_lines = _parse_head(head)
            entry["method"] = method
            if method == "CONNECT":
                host, port = _split_host_port(target, default_port=443)
                path = ""
            else:
                host, port, path = _split_url(target)
            host = host.lower().rstrip(".").strip("[]")
            entry.update(host=host, port=port, target=f"{host}:{port}")
            credential = self.credentials.get((host, port))
            if credential is not None:
                entry["credential"] = credential.secret_name
            addresses, reason = self.decide_all(host, port)
            if not addresses:
                entry.update(decision="deny", reason=reason)
                client.sendall(_response(403, f"sandbox proxy: {reason}"))
                return
            if credential is not None and method == "CONNECT":
                reason = (
                    "the proxy adds this host's credential: send plain "
                    f"http://{host}:{port}/... requests through the proxy "
                    "(it opens TLS itself), not CONNECT"
                )
                entry.update(decision="deny", reason=reason)
                client.sendall(_response(403, f"sandbox proxy: {reason}"))
                return
            entry.update(connect_attempted=True, addresses=addresses)
            upstream = self._connect(addresses, port)
            self._track(upstream)
            peer = str(upstream.getpeername()[0])
            entry["address"] = peer
            assert (host, port) in self.allow
            peer_reason = self._refusal(peer, self.allow[(host, port)])
            if peer_reason:
                entry.update(decision="deny", reason=f"peer {peer}: {peer_reason}")
                client.sendall(_response(403, "sandbox proxy: peer refused"))
                return
            entry["decision"] = "allow"
            if credential is not None and credential.tls:
                entry["tls"] = True
                upstream.settimeout(self.connect_timeout)
                plain = upstream
                upstream = self.tls_context.wrap_socket(plain, server_hostname=host)
                self._track(upstream)
            upstream.settimeout(None)
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = rest
            else:
                first = (
                    _rewrite_request(
                        method,
                        path,
                        version,
                        header_lines,
                        host=_host_header(host, port, tls=bool(entry.get("tls"))),
                        credential=credential,
                    )
                    + rest
                )
            entry["connected"] = True
            if first:
                upstream.sendall(first)
            if isinstance(upstream, ssl.SSLSocket):
                sent, received = _relay_one_thread(client, upstream, drained)
            else:
                sent, received = _relay(client, upstream, drained)
            entry.update(bytes_out=len(first) + sent, bytes_in=received)
        except _BadRequest as exc:
            entry.update(decision="deny", reason=str(exc))
            with contextlib.suppress(OSError):
                client.sendall(_response(400, f"sandbox proxy: {exc}"))
        except ssl.SSLError as exc:
            entry["decision"] = "error"
            entry["reason"] = f"upstream TLS failed: {exc.reason or exc}"
            with contextlib.suppress(OSError):
                client.sendall(_response(502, "sandbox proxy: upstream TLS failed"))
        except OSError as exc:
            if entry.get("decision") != "allow" or not entry.get("connected"):
                entry["decision"] = "error"
                entry["reason"] = f"upstream error: {exc}"
                with contextlib.suppress(OSError):
                    client.sendall(
                        _response(502, "sandbox proxy: upstream unreachable")
                    )
        finally:
            self._record(entry)
            drained.set()
            with self._lock:
                self._drained.discard(drained)
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    sock.close()


class _BadRequest(Exception):
    pass


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise _BadRequest("connection closed before request head")
        data += chunk
        if len(data) > _MAX_HEAD:
            raise _BadRequest("request head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _parse_head(head: bytes) -> tuple[str, str, str, list[str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _BadRequest("malformed request line")
    if any(line[:1] in (" ", "\t") or ":" not in line for line in lines[1:]):
        # A folded or colon-less line could smuggle a header past the rewrite.
        raise _BadRequest("malformed header line")
    return parts[0].upper(), parts[1], parts[2], lines[1:]


def _split_host_port(text: str, *, default_port: int) -> tuple[str, int]:
    if text.startswith("["):
        host, _, after = text[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else ""
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise _BadRequest(f"bad port in {text!r}") from None
    if not host or not 0 < port < 65536:
        raise _BadRequest(f"bad target {text!r}")
    return host, port


def _split_url(url: str) -> tuple[str, int, str]:
    if not url.lower().startswith("http://"):
        raise _BadRequest("only CONNECT or absolute http:// URLs are proxied")
    rest = url[7:]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        raise _BadRequest("userinfo in URL refused")
    host, port = _split_host_port(authority, default_port=80)
    return host, port, slash + path if slash else "/"


_HOP_BY_HOP = ("proxy-", "connection:", "keep-alive:")


def _host_header(host: str, port: int, *, tls: bool) -> str:
    name = f"[{host}]" if ":" in host else host
    return name if port == (443 if tls else 80) else f"{name}:{port}"


def _rewrite_request(
    method: str,
    path: str,
    version: str,
    headers: list[str],
    *,
    host: str,
    credential: InjectedCredential | None = None,
) -> bytes:
    """The request as sent upstream. `Host` is the checked target's own: a program
    must not reach another site behind the same address (a CDN's) by naming it
    in Host, least of all with an injected credential."""
    dropped = (*_HOP_BY_HOP, "host:")
    kept = [h for h in headers if not h.lower().startswith(dropped)]
    if credential is not None:
        # Whatever the program sent under the credential's name is replaced.
        name = credential.header.lower() + ":"
        kept = [h for h in kept if not h.lower().replace(" ", "").startswith(name)]
        kept.append(f"{credential.header}: {credential.value}")
    lines = [
        f"{method} {path} {version}",
        f"Host: {host}",
        *kept,
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode("latin-1")


def _response(code: int, message: str) -> bytes:
    """An error response; the message is in the reason phrase too, since a client
    refused a CONNECT shows only that ("Tunnel connection failed: 403 ...")."""
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(
        code, "Error"
    )
    said = "".join(ch if " " <= ch <= "~" else "?" for ch in message)[:300]
    body = (message + "\n").encode()
    return (
        f"HTTP/1.1 {code} {reason} ({said})\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def _relay(
    a: socket.socket, b: socket.socket, a_drained: threading.Event
) -> tuple[int, int]:
    """Copy both ways until both ends close; (bytes a->b, bytes b->a).
    `a_drained` is set once a has nothing more to send."""
    counted = [0, 0]

    def one_way(src: socket.socket, dst: socket.socket, slot: int) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
                counted[slot] += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=one_way, args=(b, a, 1), daemon=True)
    other.start()
    one_way(a, b, 0)
    a_drained.set()
    other.join()
    return counted[0], counted[1]


def _relay_one_thread(
    client: socket.socket, upstream: ssl.SSLSocket, client_drained: threading.Event
) -> tuple[int, int]:
    """Like _relay, for a TLS upstream: one thread, since an SSL object must not be
    read and written from two threads at once, and no half-close of the TLS side
    (SSLSocket.shutdown drops the TLS layer). Ends when the upstream closes."""
    sent = received = 0
    client_open = True
    while True:
        if upstream.pending():
            readable: list[Any] = [upstream]
        else:
            waiting = [client, upstream] if client_open else [upstream]
            readable = select.select(waiting, [], [])[0]
        if upstream in readable:
            try:
                data = upstream.recv(65536)
            except ssl.SSLWantReadError:
                continue
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_WR)
                return sent, received
            client.sendall(data)
            received += len(data)
        if client_open and client in readable:
            data = client.recv(65536)
            if not data:
                client_open = False
                client_drained.set()
                continue
            upstream.sendall(data)
            sent += len(data)
