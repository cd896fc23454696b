"""What the clients do: start demo runs over the API, decide their approvals, and
follow runs over WebSockets, recording every answer.

A client that gets a 5xx (or loses the connection) asks the database, as an
oracle, whether its work was committed: if it was, the 5xx is counted as "for
committed work" and the client takes what was committed instead of retrying
(a retry of a committed `POST /runs/` without an idempotency key would start a
second run); if not, it retries with the same `Idempotency-Key`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import websockets
from django.db import DatabaseError, close_old_connections, connection

from approvals.models import ApprovalRequest
from runs.demo import DEMO_AGENT_SLUG, DEMO_INPUT
from runs.models import Run

T = TypeVar("T")
RETRY_SECONDS = 180.0  # how long a client keeps retrying one piece of work
MARKER_PREFIX = "soak-"


class Stopped(Exception):
    """The harness is stopping: a client thread gives up at once."""


def db_retry(
    read: Callable[[], T],
    *,
    timeout: float = RETRY_SECONDS,
    stop: threading.Event | None = None,
) -> T:
    """A read of the database that waits out a PostgreSQL restart.

    The connection goes back to the process's pool after each read: the
    harness has more threads (starters, deciders, the phase) than its pool has
    connections (DATABASE_POOL_MAX_SIZE), and threads that kept theirs while
    idle starved the others (PoolTimeout after 20 s, a phase ended by it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            close_old_connections()
            return read()
        except DatabaseError:
            connection.close()
            if time.monotonic() > deadline:
                raise
            if stop is not None and stop.wait(0.5):
                raise Stopped from None
            if stop is None:
                time.sleep(0.5)
        finally:
            connection.close()


@dataclass
class Answer:
    status: int  # 0: no HTTP answer (connection refused or dropped)
    body: Any
    at: float


@dataclass
class Tally:
    """Every HTTP answer the clients got, and the 5xx whose work was committed."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter[str] = field(default_factory=Counter)
    committed_5xx: list[str] = field(default_factory=list)
    committed_dropped: list[str] = field(default_factory=list)
    gave_up: list[str] = field(default_factory=list)

    def note(self, what: str, answer: Answer) -> None:
        with self.lock:
            self.statuses[f"{what} {answer.status or 'no answer'}"] += 1

    def committed(self, what: str, answer: Answer) -> None:
        with self.lock:
            if answer.status >= 500:
                self.committed_5xx.append(f"{what}: {answer.status}")
            else:
                self.committed_dropped.append(what)


class Api:
    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url
        self.token = token

    def call(
        self, method: str, path: str, body: Any = None, *, key: str = ""
    ) -> Answer:
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json",
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if key:
            headers["Idempotency-Key"] = key
        request = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return Answer(reply.status, _json(reply.read()), time.monotonic())
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, _json(exc.read()), time.monotonic())
        except (urllib.error.URLError, OSError):
            return Answer(0, None, time.monotonic())


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw[:200].decode(errors="replace")


@dataclass
class RunRecord:
    """One run a client asked for; `deny` is the decision planned for it."""

    index: int
    marker: str
    deny: bool
    run_id: str = ""
    started_at: float = 0.0
    decided: bool = False


class Driver:
    """Starts runs and decides their approvals for one phase at a time."""

    def __init__(
        self, *, base_url: str, operator_token: str, admin_token: str, tally: Tally
    ) -> None:
        self.starter = Api(base_url, operator_token)
        self.approver = Api(base_url, admin_token)
        self.tally = tally
        # Two pools: creations retrying through an outage never hold up decisions.
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="soak-start")
        self.deciders = ThreadPoolExecutor(
            max_workers=8, thread_name_prefix="soak-decide"
        )
        self.lock = threading.Lock()
        self.records: list[RunRecord] = []
        self.by_run: dict[str, RunRecord] = {}
        self.deciding: set[str] = set()
        # A list read before a decision committed still shows it pending.
        self.decided: set[str] = set()
        self.stop_deciding = threading.Event()
        self.stopping = threading.Event()
        self.decider: threading.Thread | None = None
        self.submitted = 0
        self.on_started: Callable[[RunRecord], None] = lambda record: None

    # -- runs -----------------------------------------------------------------

    def start_runs(
        self, phase: str, count: int, *, rate: float, deny_every: int
    ) -> None:
        """Ask for `count` runs at `rate` per second (returns at once)."""
        tag = uuid.uuid4().hex[:8]
        began = time.monotonic()
        for index in range(count):
            record = RunRecord(
                index=index,
                marker=f"{MARKER_PREFIX}{phase}-{tag}-{index}",
                deny=deny_every > 0 and index % deny_every == deny_every - 1,
            )
            with self.lock:
                self.records.append(record)
            self.pool.submit(self._start_later, record, began + index / rate)

    def _pause(self, seconds: float) -> None:
        if self.stopping.wait(seconds):
            raise Stopped

    def _start_later(self, record: RunRecord, at: float) -> None:
        try:
            self._pause(max(0.0, at - time.monotonic()))
            self._start(record)
        except Stopped:
            return
        finally:
            with self.lock:
                self.submitted += 1

    def _start(self, record: RunRecord) -> None:
        body = {"agent": DEMO_AGENT_SLUG, "input": f"{DEMO_INPUT} [{record.marker}]"}
        deadline = time.monotonic() + RETRY_SECONDS
        while time.monotonic() < deadline:
            answer = self.starter.call("POST", "/api/v1/runs/", body, key=record.marker)
            self.tally.note("POST /runs/", answer)
            if answer.status == 201:
                self._adopt(record, str(answer.body["id"]))
                return
            if answer.status >= 500 or answer.status == 0:
                committed = db_retry(
                    lambda: list(
                        Run.objects.filter(
                            input__endswith=f"[{record.marker}]"
                        ).values_list("id", flat=True)[:1]
                    ),
                    stop=self.stopping,
                )
                if committed:
                    self.tally.committed(f"POST /runs/ {record.marker}", answer)
                    self._adopt(record, str(committed[0]))
                    return
            self._pause(1.0)
        with self.tally.lock:
            self.tally.gave_up.append(f"POST /runs/ {record.marker}")

    def _adopt(self, record: RunRecord, run_id: str) -> None:
        with self.lock:
            record.run_id = run_id
            record.started_at = time.monotonic()
            self.by_run[run_id] = record
        self.on_started(record)

    # -- approvals --------------------------------------------------------------

    def start_deciding(self) -> None:
        self.stop_deciding.clear()
        self.decider = threading.Thread(
            target=self._decide_loop, name="soak-decider", daemon=True
        )
        self.decider.start()

    def finish_deciding(self) -> None:
        self.stop_deciding.set()
        if self.decider is not None:
            self.decider.join(60)

    def _decide_loop(self) -> None:
        while not self.stop_deciding.is_set():
            answer = self.approver.call(
                "GET", "/api/v1/approvals/?status=pending&limit=200"
            )
            if answer.status != 200:
                self.tally.note("GET /approvals/", answer)
            else:
                for approval in answer.body.get("results", []):
                    approval_id = str(approval["id"])
                    with self.lock:
                        record = self.by_run.get(str(approval["run"]))
                        if (
                            record is None
                            or approval_id in self.deciding
                            or approval_id in self.decided
                        ):
                            continue
                        self.deciding.add(approval_id)
                    self.deciders.submit(self._decide, record, approval_id)
            self.stop_deciding.wait(0.5)

    def _decide(self, record: RunRecord, approval_id: str) -> None:
        body: dict[str, Any] = {"decision": "deny" if record.deny else "approve"}
        if record.deny:
            body["reason"] = "soak: this run's plan is a denial"
        key = f"{record.marker}-{approval_id}"
        path = f"/api/v1/approvals/{approval_id}/decide/"
        what = f"POST decide {record.marker}"
        deadline = time.monotonic() + RETRY_SECONDS
        try:
            while time.monotonic() < deadline:
                answer = self.approver.call("POST", path, body, key=key)
                self.tally.note("POST decide", answer)
                if answer.status in (200, 409):
                    self._decided(record, approval_id)
                    return
                if answer.status >= 500 or answer.status == 0:
                    status = db_retry(
                        lambda: (
                            ApprovalRequest.objects.filter(id=approval_id)
                            .values_list("status", flat=True)
                            .first()
                        ),
                        stop=self.stopping,
                    )
                    if status != ApprovalRequest.Status.PENDING:
                        self.tally.committed(what, answer)
                        self._decided(record, approval_id)
                        return
                elif 400 <= answer.status < 500:
                    with self.tally.lock:
                        self.tally.gave_up.append(
                            f"{what}: {answer.status} {answer.body}"
                        )
                    return
                self._pause(1.0)
            with self.tally.lock:
                self.tally.gave_up.append(what)
        except Stopped:
            return
        finally:
            with self.lock:
                self.deciding.discard(approval_id)

    def _decided(self, record: RunRecord, approval_id: str) -> None:
        with self.lock:
            record.decided = True
            self.decided.add(approval_id)

    def close(self) -> None:
        self.stopping.set()
        self.finish_deciding()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.deciders.shutdown(wait=True, cancel_futures=True)


@dataclass
class Follower:
    """One WebSocket client following one run: every seq it was sent, in order."""

    run_id: str
    seqs: list[int] = field(default_factory=list)
    connects: int = 0
    failed_handshakes: int = 0
    closes: Counter[str] = field(default_factory=Counter)


class Streams:
    """WebSocket clients on an event loop in a thread of their own."""

    def __init__(self, base_url: str, token: str) -> None:
        self.ws_url = base_url.replace("http://", "ws://")
        self.origin = base_url
        self.token = token
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="soak-ws", daemon=True
        )
        self.thread.start()
        self.tasks: list[tuple[Follower, Any]] = []

    def follow(self, run_id: str) -> Follower:
        follower = Follower(run_id)
        future = asyncio.run_coroutine_threadsafe(self._follow(follower), self.loop)
        self.tasks.append((follower, future))
        return follower

    async def _follow(self, follower: Follower) -> None:
        while True:
            after = follower.seqs[-1] if follower.seqs else 0
            url = f"{self.ws_url}/ws/runs/{follower.run_id}/?after_seq={after}"
            try:
                async with websockets.connect(
                    url,
                    origin=websockets.Origin(self.origin),
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    open_timeout=10,
                ) as ws:
                    follower.connects += 1
                    async for raw in ws:
                        frame = json.loads(raw)
                        if frame.get("type") == "event":
                            follower.seqs.append(int(frame["event"]["seq"]))
                    follower.closes[str(ws.close_code)] += 1
            except websockets.ConnectionClosed as exc:
                follower.closes[str(exc.rcvd.code if exc.rcvd else "abnormal")] += 1
            except (OSError, websockets.InvalidHandshake, TimeoutError):
                follower.failed_handshakes += 1
            await asyncio.sleep(0.5)

    def stop(self, followers: list[Follower]) -> None:
        for follower, future in list(self.tasks):
            if follower in followers:
                self.loop.call_soon_threadsafe(future.cancel)
                self.tasks.remove((follower, future))

    def close(self) -> None:
        for _, future in self.tasks:
            self.loop.call_soon_threadsafe(future.cancel)
        self.tasks.clear()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        with contextlib.suppress(RuntimeError):
            self.loop.close()
