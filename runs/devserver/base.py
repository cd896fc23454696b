"""A scripted model server over real HTTP: what it answers, and how it misbehaves.

Each request takes the next queued `Behaviour`; with none queued, the server's
`script` answers, its entry chosen by how many assistant turns the request
already holds (so concurrent conversations each get their own next reply, and a
retried request gets the same one); `{{call_id.key...}}` in a script's text is
filled from the tool results the request carries (`fill_placeholders`).
Subclasses speak one protocol (`ChatCompletionsServer`, `MessagesServer`).

Misbehaviours for tests: an HTTP error with any status, headers and body; a
delay before answering; a stream that drops its connection mid-way (`drop_after`
events, no final chunk), one that ends cleanly but early (`truncate_after`), an
error event inside a stream, a stream that never ends (`endless`), and one that
sends its headers and then nothing (`hang`) or a byte at a time without ever
finishing an event (`trickle`).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runs.devserver.judge import judge_request_reply


@dataclass(frozen=True)
class Reply:
    """One answer: text and/or tool calls (`{"name", "arguments", "id"?}`)."""

    text: str | None = None
    tool_calls: Sequence[Mapping[str, Any]] = ()
    finish_reason: str | None = None  # protocol default from the content
    input_tokens: int | None = None  # None: estimated from the request
    output_tokens: int | None = None
    usage: bool = True  # False: the provider reports no usage

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> Reply:
        """From a script entry in the scripted model's format (scripted.py)."""
        usage = entry.get("usage") or {}
        return cls(
            text=entry.get("text"),
            tool_calls=tuple(entry.get("tool_calls") or ()),
            finish_reason=entry.get("finish_reason"),
            input_tokens=usage.get("input_tokens"),
            output_tokens=usage.get("output_tokens"),
        )

    def arguments(self, call: Mapping[str, Any]) -> str:
        arguments = call.get("arguments", {})
        return arguments if isinstance(arguments, str) else json.dumps(arguments)


@dataclass(frozen=True)
class Behaviour:
    """How the server answers one request."""

    reply: Reply = field(default_factory=Reply)
    stream: bool | None = None  # None: as the request asks
    status: int = 200  # an error status answers `error_body` instead
    headers: Mapping[str, str] = field(default_factory=dict)
    error_body: Mapping[str, Any] | None = None
    delay: float = 0.0  # before the response
    chunk_delay: float = 0.0  # between stream events
    drop_after: int | None = None  # events sent before the connection is cut
    truncate_after: int | None = None  # events sent before a clean, early end
    stream_error: Mapping[str, Any] | None = None  # an error event after the first
    endless: bool = False  # text deltas until the client goes away
    hang: bool = False  # headers, then silence until the client goes away
    trickle: bool = False  # headers, then a byte at a time, never a whole event


class ModelServer:
    """A threaded HTTP server on 127.0.0.1 (port 0: any free one)."""

    protocol = ""

    def __init__(
        self,
        *,
        script: Sequence[Mapping[str, Any]] = (),
        port: int = 0,
        host: str = "127.0.0.1",
        chunk_delay: float = 0.0,
        model: str = "",
        judge_model: str = "",
    ) -> None:
        self.script = [Reply.from_entry(entry) for entry in script]
        # Requests for this model are eval judge prompts, answered by the
        # scripted judge (judge.py) instead of the script.
        self.judge_model = judge_model
        self.chunk_delay = chunk_delay
        self.model = model
        self.queue: list[Behaviour] = []
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.server = _QuietServer((host, port), self._handler())
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{self.protocol}-model-server",
            daemon=True,
        )

    # -- lifecycle --------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ModelServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting --------------------------------------------------------------

    def push(self, behaviour: Behaviour | None = None, **kw: Any) -> None:
        """Queue how the next request is answered (a Behaviour or its fields)."""
        with self._lock:
            self.queue.append(behaviour or Behaviour(**kw))

    def reply(self, text: str | None = None, **kw: Any) -> None:
        """Queue a plain answer (Reply fields; `stream`, `chunk_delay` allowed)."""
        behaviour_keys = {"stream", "chunk_delay", "delay", "headers"}
        outer = {k: kw.pop(k) for k in list(kw) if k in behaviour_keys}
        self.push(Behaviour(reply=Reply(text=text, **kw), **outer))

    def error(self, status: int, message: str, *, kind: str = "", **kw: Any) -> None:
        """Queue an HTTP error in the protocol's error format."""
        self.push(
            Behaviour(
                status=status, error_body=self.error_json(status, message, kind), **kw
            )
        )

    def _next(self, body: Mapping[str, Any]) -> Behaviour:
        with self._lock:
            if self.queue:
                return self.queue.pop(0)
        if self.judge_model and body.get("model") == self.judge_model:
            verdict = Reply(text=judge_request_reply(body))
            return Behaviour(reply=verdict, chunk_delay=self.chunk_delay)
        if not self.script:
            return Behaviour(
                status=500,
                error_body=self.error_json(500, "the server has nothing queued", ""),
            )
        turn = sum(
            1
            for message in body.get("messages") or []
            if message.get("role") == "assistant"
        )
        reply = self.script[min(turn, len(self.script) - 1)]
        if reply.text and "{{" in reply.text:
            reply = replace(reply, text=fill_placeholders(reply.text, body))
        return Behaviour(reply=reply, chunk_delay=self.chunk_delay)

    # -- what a protocol implements ------------------------------------------------

    def accepts(self, path: str) -> bool:
        raise NotImplementedError

    def error_json(self, status: int, message: str, kind: str) -> dict[str, Any]:
        raise NotImplementedError

    def render(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, reply: Reply, body: Mapping[str, Any]) -> list[bytes]:
        raise NotImplementedError

    def stream_error_event(self, error: Mapping[str, Any]) -> bytes:
        raise NotImplementedError

    def endless_event(self, n: int, body: Mapping[str, Any]) -> bytes:
        raise NotImplementedError

    def request_id_header(self) -> str:
        return "x-request-id"

    # -- shared helpers -----------------------------------------------------------

    @staticmethod
    def sse(data: Any, event: str | None = None) -> bytes:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {event}\n" if event else ""
        return f"{head}data: {text}\n\n".encode()

    @staticmethod
    def pieces(text: str, size: int = 6) -> Iterator[str]:
        for start in range(0, len(text), size):
            yield text[start : start + size]

    @staticmethod
    def input_estimate(body: Mapping[str, Any]) -> int:
        return max(1, len(json.dumps(body.get("messages") or [])) // 4)

    @staticmethod
    def output_estimate(reply: Reply) -> int:
        size = len(reply.text or "") + sum(
            len(json.dumps(dict(call))) for call in reply.tool_calls
        )
        return max(1, size // 4)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", "0"))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                server.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    }
                )
                if not server.accepts(self.path):
                    self._json(
                        404, server.error_json(404, "no such path", "not_found"), {}
                    )
                    return
                behaviour = server._next(body)
                if behaviour.delay and server.stopping.wait(behaviour.delay):
                    return
                # OSError: the client went away (a timeout, a closed stream).
                with contextlib.suppress(OSError):
                    self._answer(behaviour, body)

            def _answer(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
                headers = {
                    server.request_id_header(): f"req_{len(server.requests)}",
                    **behaviour.headers,
                }
                if behaviour.status >= 400:
                    self._json(
                        behaviour.status, dict(behaviour.error_body or {}), headers
                    )
                    return
                stream = behaviour.stream
                if stream is None:
                    stream = bool(body.get("stream"))
                if not stream:
                    self._json(200, server.render(behaviour.reply, body), headers)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.send_header("cache-control", "no-cache")
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self._stream(behaviour, body)

            def _stream(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
                delay = behaviour.chunk_delay
                if behaviour.hang:
                    server.stopping.wait(600)
                    return
                while behaviour.trickle and not server.stopping.wait(delay or 0.1):
                    self._chunk(b":")  # an SSE comment that never ends its line
                events = server.events(behaviour.reply, body)
                if behaviour.endless:
                    events = events[:1]  # the start, then deltas forever
                if behaviour.stream_error is not None:
                    events = events[:1] + [
                        server.stream_error_event(behaviour.stream_error)
                    ]
                for sent, event in enumerate(events):
                    if (
                        behaviour.drop_after is not None
                        and sent >= behaviour.drop_after
                    ):
                        # Cut the connection with no last chunk: a broken stream.
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if (
                        behaviour.truncate_after is not None
                        and sent >= behaviour.truncate_after
                    ):
                        break
                    self._chunk(event)
                    if delay and server.stopping.wait(delay):
                        return
                n = 0
                while behaviour.endless and not server.stopping.is_set():
                    self._chunk(server.endless_event(n, body))
                    n += 1
                    server.stopping.wait(delay or 0.05)
                self._chunk(b"")  # the last chunk: a clean end

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _json(
                self, status: int, payload: dict[str, Any], headers: Mapping[str, str]
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


# `{{call_id.key.key}}` in a script's text: a value from the observation the
# request carries for that call (its `data`, or its `error` when it failed), so a
# scripted answer quotes what the tools really returned, as a model would.
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z0-9_-]+)((?:\.[A-Za-z0-9_]+)+)\}\}")


def _tool_results(body: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(call id, result text) of each tool result in the request, in either
    protocol's shape (an OpenAI `tool` message, an Anthropic `tool_result`)."""
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool":
            yield str(message.get("tool_call_id")), message.get("content")
            continue
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = "".join(
                        str(part.get("text", "")) for part in inner
                        if isinstance(part, dict)
                    )  # fmt: skip
                yield str(block.get("tool_use_id")), inner


def fill_placeholders(text: str, body: Mapping[str, Any]) -> str:
    """`text` with each `{{call_id.key...}}` the request's observations answer
    filled in; a placeholder nothing answers stays as written."""
    observed: dict[str, Any] = {}
    for call_id, content in _tool_results(body):
        try:
            result = json.loads(content) if isinstance(content, str) else content
        except ValueError:
            continue
        if isinstance(result, dict):
            observed[call_id] = (
                result.get("data") if result.get("ok") else result.get("error")
            )

    def value(match: re.Match[str]) -> str:
        found = observed.get(match.group(1))
        for key in match.group(2).split(".")[1:]:
            found = found.get(key) if isinstance(found, dict) else None
        if found is None:
            return match.group(0)
        if isinstance(found, bool):
            return "yes" if found else "no"
        return found if isinstance(found, str) else json.dumps(found)

    return _PLACEHOLDER.sub(value, text)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (its point in a test) is no error here


def now() -> int:
    return int(time.time())
