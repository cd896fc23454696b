"""The OTLP/gRPC receiver: TraceService/Export and LogsService/Export on
OTLP_GRPC_PORT (4317, every OpenTelemetry SDK's default), for agents whose
exporter speaks gRPC. Daphne speaks HTTP/1.1 only, so this is a process of its
own (`manage.py otlp_grpc`, started by `make run` and compose).

A call goes the way a `POST /v1/traces` (or `/v1/logs`) goes: the same token
check (`runs.otlp.door`, metadata `authorization: Bearer <token>`), the same
decoding and checks (`tracing.ingest`) and the same ingest services
(`runs.services.external`, `runs.services.external_logs`), so a request is
stored whole or not at all.

Limits, so that no client holds a thread or a connection for ever:

* a request larger than OTLP_INGEST_MAX_BYTES is refused by gRPC itself
  (RESOURCE_EXHAUSTED) before it is read whole;
* at most OTLP_GRPC_MAX_WORKERS calls run at once, and at most
  OTLP_GRPC_MAX_CONCURRENT_RPCS are held (running or waiting for a thread),
  server-wide and per connection; more are RESOURCE_EXHAUSTED at once;
* a call must have sent its request within OTLP_GRPC_DEADLINE_SECONDS of being
  picked up: the methods are served as client-streaming ones, so the handler
  runs as soon as the call starts and a watchdog cancels it when the request
  has not arrived by then (a unary client sends the same bytes; this only lets
  us see a client that never finishes sending);
* connections: the HTTP/2 handshake must finish within the same deadline, an
  idle connection closes after five minutes and any connection is closed after
  thirty (clients reconnect; gRPC sends GOAWAY first).

Garbage, a bad value or too many spans: INVALID_ARGUMENT naming the problem,
nothing stored. No or bad token: UNAUTHENTICATED; a viewer's token:
PERMISSION_DENIED; an address locked out after refused tokens:
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from runs.otlp.door import OtlpCaller, OtlpRefused, otlp_caller
from runs.services.external import ingest_spans
from runs.services.external_logs import ingest_logs
from tracing.ingest import IngestError, parse_logs_request, parse_request

__all__ = ["OtlpGrpcServer", "TRACE_SERVICE", "LOGS_SERVICE", "otlp_grpc_server"]

logger = logging.getLogger(__name__)

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_PROTOBUF = "application/x-protobuf"
_IDLE_MS = 5 * 60 * 1000
_MAX_AGE_MS = 30 * 60 * 1000


class Watchdog:
    """One thread that runs each armed callback at its time unless disarmed
    first (a timer thread per call would double the threads under load)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._armed: set[int] = set()
        self._ids = itertools.count()
        self._condition = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._loop, name="otlp-grpc-watchdog", daemon=True
        )
        self._thread.start()

    def arm(self, seconds: float, callback: Callable[[], None]) -> int:
        with self._condition:
            key = next(self._ids)
            when = _now() + seconds
            heapq.heappush(self._heap, (when, key, callback))
            self._armed.add(key)
            self._condition.notify()
            return key

    def disarm(self, key: int) -> None:
        with self._condition:
            self._armed.discard(key)

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._stopped and (
                    not self._heap or self._heap[0][0] > _now()
                ):
                    timeout = self._heap[0][0] - _now() if self._heap else None
                    self._condition.wait(timeout)
                if self._stopped:
                    return
                _, key, callback = heapq.heappop(self._heap)
                if key not in self._armed:
                    continue
                self._armed.discard(key)
            try:
                callback()
            except Exception:  # a call that ended meanwhile: nothing to cut
                logger.debug("watchdog callback failed", exc_info=True)


def _now() -> float:
    return time.monotonic()


def _peer_address(peer: str) -> str | None:
    """The client's address in a gRPC peer string: `ipv4:1.2.3.4:5`,
    `ipv6:%5B::1%5D:5` (URL-quoted), or None for another transport."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or not rest:
        return None
    host = urllib.parse.unquote(rest).rsplit(":", 1)[0]
    return host.strip("[]") or None


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, text: str) -> NoReturn:
    context.abort(code, text)
    raise AssertionError("context.abort returned")  # it always raises


_REFUSED_CODES = {
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "forbidden": grpc.StatusCode.PERMISSION_DENIED,
    "locked_out": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def _export_traces(caller: OtlpCaller, body: bytes) -> bytes:
    spans = parse_request(body, content_type=_PROTOBUF)
    result = ingest_spans(
        tenant=caller.context.tenant, user=caller.token.user, spans=spans
    )
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = "; ".join(result.errors)
    return bytes(response.SerializeToString())


def _export_logs(caller: OtlpCaller, body: bytes) -> bytes:
    records = parse_logs_request(body, content_type=_PROTOBUF)
    result = ingest_logs(
        tenant=caller.context.tenant, user=caller.token.user, records=records
    )
    response = ExportLogsServiceResponse()
    if result.rejected:
        response.partial_success.rejected_log_records = result.rejected
        response.partial_success.error_message = "; ".join(result.errors)
    return bytes(response.SerializeToString())


@dataclass
class _Export:
    """One Export method: read the caller and the request, store, answer."""

    name: str
    store: Callable[[OtlpCaller, bytes], bytes]
    watchdog: Watchdog
    deadline: float

    def __call__(self, requests: Iterator[bytes], context: Any) -> bytes:
        close_old_connections()  # as Django does around each request
        try:
            return self._handle(requests, context)
        finally:
            close_old_connections()

    def _handle(self, requests: Iterator[bytes], context: Any) -> bytes:
        metadata = dict(context.invocation_metadata() or ())
        try:
            caller = otlp_caller(
                authorization=metadata.get("authorization"),
                remote_addr=_peer_address(context.peer()),
            )
        except OtlpRefused as refused:
            logger.info("OTLP/gRPC %s refused: %s", self.name, refused.message)
            _abort(context, _REFUSED_CODES[refused.kind], refused.message)
        body = self._receive(requests, context)
        try:
            return self.store(caller, body)
        except IngestError as exc:
            # Garbage, a bad value or a limit passed: nothing was stored.
            code, problem = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except DatabaseError:
            # Rolled back whole; the exporter retries UNAVAILABLE.
            logger.exception("OTLP/gRPC %s: the database failed", self.name)
            code, problem = grpc.StatusCode.UNAVAILABLE, "could not store; retry"
        except Exception:
            # gRPC would send the exception's text; the client gets no detail.
            logger.exception("OTLP/gRPC %s failed", self.name)
            code, problem = grpc.StatusCode.INTERNAL, "internal error"
        _abort(context, code, problem)

    def _receive(self, requests: Iterator[bytes], context: Any) -> bytes:
        """The one request message, or the call is cut at the deadline."""
        key = self.watchdog.arm(self.deadline, context.cancel)
        try:
            body = next(requests)
        except StopIteration:
            body = None
        finally:
            self.watchdog.disarm(key)
        if body is None:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "no request message")
        return body


@dataclass
class OtlpGrpcServer:
    server: grpc.Server
    port: int
    watchdog: Watchdog

    def stop(self, grace: float | None = None) -> None:
        self.server.stop(grace).wait()
        self.watchdog.stop()


def otlp_grpc_server(
    *,
    host: str | None = None,
    port: int | None = None,
    max_workers: int | None = None,
    max_concurrent_rpcs: int | None = None,
    deadline: float | None = None,
) -> OtlpGrpcServer:
    """A started receiver on host:port (the settings by default; port 0: a free
    one, see `.port`)."""
    host = settings.OTLP_GRPC_BIND if host is None else host
    port = settings.OTLP_GRPC_PORT if port is None else port
    max_workers = max_workers or settings.OTLP_GRPC_MAX_WORKERS
    max_rpcs = max_concurrent_rpcs or settings.OTLP_GRPC_MAX_CONCURRENT_RPCS
    deadline = deadline or settings.OTLP_GRPC_DEADLINE_SECONDS
    limit = settings.OTLP_INGEST_MAX_BYTES
    watchdog = Watchdog()
    server = grpc.server(
        futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="otlp-grpc"
        ),
        maximum_concurrent_rpcs=max_rpcs,
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 1024 * 1024),
            ("grpc.max_concurrent_streams", max_rpcs),
            ("grpc.server_handshake_timeout_ms", int(deadline * 1000)),
            ("grpc.max_connection_idle_ms", _IDLE_MS),
            ("grpc.max_connection_age_ms", _MAX_AGE_MS),
            ("grpc.max_connection_age_grace_ms", int(deadline * 1000)),
        ],
    )
    services = ((TRACE_SERVICE, _export_traces), (LOGS_SERVICE, _export_logs))
    for service, store in services:
        # Bytes in and out (no deserializer): garbage reaches the handler, which
        # answers INVALID_ARGUMENT, instead of gRPC's opaque INTERNAL.
        export = _Export(f"{service}/Export", store, watchdog, deadline)
        handler = grpc.stream_unary_rpc_method_handler(export)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"Export": handler}),)
        )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        watchdog.stop()
        raise OSError(f"cannot listen on {address}: {exc}") from exc
    server.start()
    return OtlpGrpcServer(server=server, port=bound, watchdog=watchdog)
