"""Live streams: one run's events and a tenant's run/approval events (DESIGN.md §7).

The client says the last seq it holds; the server joins the group first, replays
everything after that seq from the log, then forwards live events, dropping what
it already sent and filling any gap in seq from the log (the channel layer may
drop messages; the log is the record). Consumers never write to the database.
Whether a run is the caller's tenant's is the runs app's question: its
`runs.consumers.RunStreamConsumer` answers it for the run stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, ClassVar
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from controlplane import metrics
from controlplane.authentication import (
    StreamPrincipal,
    TooManyFailures,
    tenant_context_current,
)
from controlplane.models import Tenant
from controlplane.permissions import Action, context_may
from controlplane.tenancy import SESSION_TENANT_KEY, TenantContext, tenant_context_for
from tracing import selectors
from tracing.services import event_message, run_group, tenant_group

__all__ = ["RunEventStreamConsumer", "TenantStreamConsumer"]

logger = logging.getLogger(__name__)

CLOSE_BAD_MESSAGE = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_SLOW_CLIENT = 4408
CLOSE_TOO_MANY_FAILURES = 4429

REPLAY_PAGE = 500


class BadMessage(ValueError):
    pass


def _cursor(value: Any, name: str) -> int:
    if isinstance(value, bool) or value is None:
        raise BadMessage(f"{name} must be a non-negative integer")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or value < 0:
        raise BadMessage(f"{name} must be a non-negative integer")
    return value


def _ahead(sent: int | None, requested: int) -> int:
    """The resume cursor: the client's, but never behind what was sent."""
    return requested if sent is None else max(sent, requested)


class _StreamConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Authorisation, a bounded send queue, heartbeats and bad-message handling."""

    cursor_name = "after_seq"
    # What the permission gate is asked at connect and again while it runs.
    gate_action: ClassVar[Action] = Action.STREAM_READ
    context: TenantContext | None = None

    async def _authorize(self) -> bool:
        """Resolve the caller through the one authenticator and permission gate;
        refuse (and return False) unless they may read this stream."""
        refusal = self.scope.get("auth_refusal")
        if refusal is not None:
            code = (
                CLOSE_TOO_MANY_FAILURES
                if isinstance(refusal, TooManyFailures)
                else CLOSE_UNAUTHENTICATED
            )
            await self._refuse(code, refusal.message)
            return False
        self.context = await self._tenant_context()
        if self.context is None:
            await self._refuse(CLOSE_UNAUTHENTICATED, "sign in or send an API token")
            return False
        if not context_may(self.context, self.gate_action):
            await self._refuse(CLOSE_FORBIDDEN, "your role may not read streams")
            return False
        return True

    async def _tenant_context(self) -> TenantContext | None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        session = self.scope.get("session")
        requested = (query.get("tenant") or [None])[0] or (
            session.get(SESSION_TENANT_KEY) if session is not None else None
        )
        context: TenantContext | None = await database_sync_to_async(
            tenant_context_for
        )(
            user=self.scope.get("user"),
            token=self.scope.get("api_token"),
            requested_slug=requested,
        )
        return context

    def _query_cursor(self) -> int | None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        raw = (query.get(self.cursor_name) or [None])[0]
        return None if raw is None else _cursor(raw, self.cursor_name)

    async def _refuse(self, code: int, message: str) -> None:
        # Accept first so a browser sees the close code and reason.
        await self.accept()
        await self.send_json({"type": "error", "code": code, "message": message})
        await self.close(code=code)

    async def _join(self, group: str, hello: dict[str, Any], start: int | None) -> None:
        # Join first, then replay: nothing committed after the replay's read is
        # missed, and what both deliver is dropped by its position.
        self.group = group
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.counted = True
        metrics.websocket_opened()
        await self._start_pumps()
        # The client calls the stream stale after two heartbeats without a frame.
        beat = settings.STREAM_HEARTBEAT_SECONDS
        await self._enqueue({"type": "hello", "heartbeat_seconds": beat, **hello})
        if start is not None:
            await self._resume(start)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            metrics.websocket_closed()
        await self._stop_pumps()
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def _start_pumps(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(
            maxsize=settings.STREAM_QUEUE_EVENTS
        )
        self.closing = False
        self.sender = asyncio.create_task(self._send_loop())
        self.heart = asyncio.create_task(self._heartbeat_loop())
        self.guard = asyncio.create_task(self._principal_loop())

    async def _stop_pumps(self) -> None:
        tasks = ("sender", "heart", "guard")
        for task in (getattr(self, name, None) for name in tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _send_loop(self) -> None:
        while True:
            frame = await self.queue.get()
            await self.send_json(frame)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.STREAM_HEARTBEAT_SECONDS)
            await self._on_heartbeat()

    async def _on_heartbeat(self) -> None:
        await self._enqueue({"type": "heartbeat"})

    async def _principal_loop(self) -> None:
        """Ask again, every few seconds, whether the caller still may read: a
        revoked token, a deactivated user or a removed membership ends the
        stream (whatever path made the change, the admin site included)."""
        assert self.context is not None
        principal = StreamPrincipal(
            user_id=self.context.user.pk,
            tenant_id=self.context.tenant.id,
            token_id=self.context.token.id if self.context.token else None,
        )
        while True:
            await asyncio.sleep(settings.STREAM_AUTH_RECHECK_SECONDS)
            try:
                current = await database_sync_to_async(tenant_context_current)(
                    principal=principal, action=self.gate_action
                )
            except Exception:
                # Fail closed: a stream whose caller cannot be checked ends; the
                # client reconnects and is authenticated afresh.
                logger.exception("could not re-check a stream's caller")
                current = None
            if current is None:
                await self._end_access()
                return
            self.context = current

    async def _end_access(self) -> None:
        # Nothing more reaches this socket: leave the group, drop what is
        # queued, then say why and close.
        self.closing = True
        await self.channel_layer.group_discard(self.group, self.channel_name)
        self.sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.sender
        while not self.queue.empty():  # frees a replay waiting for room
            self.queue.get_nowait()
        await self.send_json(
            {
                "type": "error",
                "code": CLOSE_UNAUTHENTICATED,
                "message": "access ended: the token was revoked, the user "
                "deactivated or the membership removed",
            }
        )
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def _enqueue(self, frame: dict[str, Any], *, wait: bool = False) -> bool:
        """Queue a frame; a client too slow to keep up with live events is
        disconnected. Replay from the log (`wait`) is paced by the client."""
        if self.closing:
            return False
        if wait:
            await self.queue.put(frame)
            return True
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.closing = True
            await self.send_json(
                {
                    "type": "error",
                    "code": CLOSE_SLOW_CLIENT,
                    "message": "the client did not keep up; reconnect with the last "
                    "seq it holds",
                    **self._position(),
                }
            )
            await self.close(code=CLOSE_SLOW_CLIENT)
            return False
        return True

    def _position(self) -> dict[str, Any]:
        return {}

    async def receive(
        self, text_data: str | None = None, bytes_data: Any = None
    ) -> None:
        try:
            if text_data is None:
                raise BadMessage("messages are JSON text frames")
            try:
                content = json.loads(text_data)
            except ValueError as exc:
                raise BadMessage("the message is not JSON") from exc
            if not isinstance(content, dict):
                raise BadMessage("the message is not a JSON object")
            await self.receive_json(content)
        except BadMessage as exc:
            await self.send_json(
                {"type": "error", "code": CLOSE_BAD_MESSAGE, "message": str(exc)}
            )
            await self.close(code=CLOSE_BAD_MESSAGE)


class RunEventStreamConsumer(_StreamConsumer):
    """Every event of one run, exactly once, in seq order; the run named by the
    route's `run_id` and shown only if `run_in_tenant` says it is the caller's
    tenant's (tracing holds runs by id: a subclass asks the app that owns them)."""

    cursor_name = "after_seq"

    def run_in_tenant(self, *, tenant: Tenant, run_id: Any) -> bool:
        """Whether the tenant holds this run (called in a database thread)."""
        raise NotImplementedError("the runs app's consumer answers this")

    async def connect(self) -> None:
        self.run_id = ""
        self.last_seq: int | None = None  # None until the client says where it is
        self.pending: dict[int, dict[str, Any]] = {}
        if not await self._authorize():
            return
        assert self.context is not None
        run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        if not await database_sync_to_async(self.run_in_tenant)(
            tenant=self.context.tenant, run_id=run_id
        ):
            await self._refuse(CLOSE_NOT_FOUND, "no such run in this tenant")
            return
        self.run_id = run_id
        try:
            start = self._query_cursor()
        except BadMessage as exc:
            await self._refuse(CLOSE_BAD_MESSAGE, str(exc))
            return
        await self._join(run_group(self.run_id), {"run_id": self.run_id}, start)

    def _position(self) -> dict[str, Any]:
        return {"last_seq": self.last_seq}

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        kind = content.get("type", "resume")
        if kind == "resume":
            if "run_id" in content and str(content["run_id"]) != self.run_id:
                raise BadMessage("this stream is for one run; open another for that")
            await self._resume(_cursor(content.get("after_seq", 0), "after_seq"))
        elif kind == "ping":
            await self._enqueue({"type": "pong", **self._position()})
        else:
            raise BadMessage(f"unknown message type {kind!r}")

    async def _resume(self, after_seq: int) -> None:
        # A connection never sends a seq twice, whatever the client asks: a
        # cursor behind what it already sent is taken as that position.
        self.last_seq = _ahead(self.last_seq, after_seq)
        await self._fill(upto=None)
        # Live events that arrived before the client said where it was.
        buffered, self.pending = sorted(self.pending.items()), {}
        for _, event in buffered:
            await self._deliver(event)

    async def _fill(self, *, upto: int | None) -> None:
        """Send what the log holds after last_seq (up to `upto`), in pages."""
        while not self.closing:
            assert self.last_seq is not None
            page = await database_sync_to_async(self._page)(self.last_seq, upto)
            for event in page:
                await self._send_event(event, wait=True)
            if len(page) < REPLAY_PAGE:
                return

    def _page(self, after: int, upto: int | None) -> list[dict[str, Any]]:
        query = selectors.run_events_after(run_id=self.run_id, after_seq=after)
        if upto is not None:
            query = query.filter(seq__lte=upto)
        return [event_message(event) for event in query[:REPLAY_PAGE]]

    async def _send_event(self, event: dict[str, Any], *, wait: bool = False) -> None:
        assert self.last_seq is not None
        if event["seq"] != self.last_seq + 1:
            return
        if await self._enqueue({"type": "event", "event": event}, wait=wait):
            self.last_seq = event["seq"]

    async def _deliver(self, event: dict[str, Any]) -> None:
        if self.last_seq is None:
            if len(self.pending) < settings.STREAM_QUEUE_EVENTS:
                self.pending[event["seq"]] = event
            return
        seq = event["seq"]
        if seq <= self.last_seq:
            return  # already replayed
        if seq > self.last_seq + 1:
            await self._fill(upto=seq - 1)  # the layer lost some: the log has them
        await self._send_event(event)

    async def run_event(self, message: dict[str, Any]) -> None:
        """A live event broadcast by run_event_append after commit."""
        await self._deliver(message["event"])

    async def run_events(self, message: dict[str, Any]) -> None:
        """Live events committed together, in order (see tracing.broadcast)."""
        for event in message["events"]:
            await self._deliver(event)

    async def run_delta(self, message: dict[str, Any]) -> None:
        """Live text of a running span (tracing.live): not in the log, no seq.
        Sent only once the client said where it is, and dropped rather than
        queued when the client is behind: a full queue must not cost it the
        stream, and the span's end carries the whole text."""
        if self.last_seq is None or self.closing:
            return
        if self.queue.qsize() >= self.queue.maxsize // 2:
            return
        await self._enqueue({"type": "delta", **message["delta"]})

    async def _on_heartbeat(self) -> None:
        # A lost broadcast at the tail shows no gap until the next event: the
        # heartbeat looks at the log too.
        if self.last_seq is not None:
            await self._fill(upto=None)
        await self._enqueue({"type": "heartbeat", **self._position()})


class TenantStreamConsumer(_StreamConsumer):
    """`/ws/tenant/`: run and approval events of the caller's tenant (lists and
    the approvals inbox). Resumes by event id (`after_id`)."""

    cursor_name = "after_id"

    async def connect(self) -> None:
        self.last_id: int | None = None
        if not await self._authorize():
            return
        assert self.context is not None
        try:
            start = self._query_cursor()
        except BadMessage as exc:
            await self._refuse(CLOSE_BAD_MESSAGE, str(exc))
            return
        hello = {"tenant": self.context.tenant.slug}
        await self._join(tenant_group(self.context.tenant.id), hello, start)

    def _position(self) -> dict[str, Any]:
        return {"last_id": self.last_id}

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        kind = content.get("type", "resume")
        if kind == "resume":
            assert self.context is not None
            if "tenant" in content and content["tenant"] != self.context.tenant.slug:
                raise BadMessage("this stream is for your current tenant only")
            await self._resume(_cursor(content.get("after_id", 0), "after_id"))
        elif kind == "ping":
            await self._enqueue({"type": "pong", **self._position()})
        else:
            raise BadMessage(f"unknown message type {kind!r}")

    async def _resume(self, after_id: int) -> None:
        self.last_id = _ahead(self.last_id, after_id)  # as for a run's seq
        assert self.context is not None
        tenant = self.context.tenant

        def page(after: int) -> list[dict[str, Any]]:
            query = selectors.tenant_events_after(tenant=tenant, after_id=after)
            return [event_message(event) for event in query[:REPLAY_PAGE]]

        while not self.closing:
            events = await database_sync_to_async(page)(self.last_id)
            for event in events:
                await self._send(event, wait=True)
            if len(events) < REPLAY_PAGE:
                return

    async def _send(self, event: dict[str, Any], *, wait: bool = False) -> None:
        if self.last_id is not None and event["id"] <= self.last_id:
            return
        if await self._enqueue({"type": "event", "event": event}, wait=wait):
            self.last_id = event["id"]

    async def run_event(self, message: dict[str, Any]) -> None:
        await self._send(message["event"])

    async def run_events(self, message: dict[str, Any]) -> None:
        for event in message["events"]:
            await self._send(event)
