"""ControlPlaneClient: gates and budget reservations over the control plane's API."""

from __future__ import annotations

import time
from collections.abc import Mapping
from decimal import Decimal
from types import TracebackType
from typing import Any

import httpx

from controlplane_client.models import (
    BudgetExhausted,
    ControlPlaneError,
    Gate,
    GateTimeout,
    Reservation,
)

Amount = int | str | Decimal
# The server caps one long-poll at 60 seconds; the client asks for this much.
LONG_POLL_SECONDS = 30


class ControlPlaneClient:
    """A client of one control plane, authenticated by an API token.

    `base_url` is the control plane's address (http://host:8000); the token is
    an API token of a member whose role may start runs (operator or admin).
    Thread-safe as httpx.Client is; close it (or use it as a context manager).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": "controlplane-client/0.1",
            },
            # A long-poll holds the read for up to its wait; connect stays short.
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
        )

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControlPlaneClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        read_timeout: float | None = None,
    ) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        timeout = httpx.Timeout(read_timeout, connect=10.0) if read_timeout else None
        extra: dict[str, Any] = {"timeout": timeout} if timeout else {}
        response = self._http.request(
            method, path, json=json, params=params, headers=headers, **extra
        )
        if response.status_code >= 400:
            raise _error_of(response)
        return response.json()

    # ------------------------------------------------------------ gates

    def gate(
        self,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        trace_id: str,
        span_id: str | None = None,
        input_schema: Mapping[str, Any] | None = None,
        effect: str | None = None,
        agent: str | None = None,
        idempotency_key: str | None = None,
        webhook_url: str | None = None,
        ttl_seconds: int | None = None,
    ) -> Gate:
        """Put a tool call to the tenant's policy; the gate may be final at once
        (allowed or denied) or pending a person's decision (`wait` for it)."""
        body: dict[str, Any] = {
            "tool": tool,
            "arguments": dict(arguments),
            "trace_id": trace_id,
        }
        optional = {
            "span_id": span_id,
            "input_schema": dict(input_schema) if input_schema else None,
            "effect": effect,
            "agent": agent,
            "idempotency_key": idempotency_key,
            "webhook_url": webhook_url,
            "ttl_seconds": ttl_seconds,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return Gate.from_json(self._request("POST", "/api/v1/gates/", json=body))

    def get_gate(self, gate: Gate | str, *, wait: float = 0) -> Gate:
        """The gate as it is; with `wait` (seconds, at most 60) the server holds
        the answer until the gate is decided or the wait ends."""
        gate_id = gate.id if isinstance(gate, Gate) else gate
        seconds = max(0, min(int(wait), 60))
        return Gate.from_json(
            self._request(
                "GET",
                f"/api/v1/gates/{gate_id}/",
                params={"wait": seconds} if seconds else None,
                read_timeout=seconds + 30.0 if seconds else None,
            )
        )

    def wait(self, gate: Gate | str, *, timeout: float | None = None) -> Gate:
        """Long-poll until the gate is final; GateTimeout if `timeout` seconds
        pass first (None: wait as long as the gate does: it expires by itself)."""
        current = gate if isinstance(gate, Gate) else self.get_gate(gate)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not current.final:
            left = (
                LONG_POLL_SECONDS if deadline is None else deadline - time.monotonic()
            )
            if left <= 0:
                raise GateTimeout(current)
            current = self.get_gate(
                current.id, wait=max(1, min(left, LONG_POLL_SECONDS))
            )
        return current

    # ------------------------------------------------------------ budget

    def reserve(
        self,
        *,
        trace_id: str,
        amounts: Mapping[str, Amount],
        kind: str = "model_call",
        ttl_seconds: int | None = None,
        agent: str | None = None,
        idempotency_key: str | None = None,
    ) -> Reservation:
        """Reserve `amounts` (`input_tokens`, `output_tokens`, `cost`) against the
        tenant's budget for the trace's run; BudgetExhausted when over a limit."""
        body: dict[str, Any] = {
            "trace_id": trace_id,
            "amounts": _amounts(amounts),
            "kind": kind,
        }
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        if agent:
            body["agent"] = agent
        return Reservation.from_json(
            self._request(
                "POST",
                "/api/v1/budget/reservations/",
                json=body,
                idempotency_key=idempotency_key,
            )
        )

    def settle(
        self, reservation: Reservation | str, actual: Mapping[str, Amount]
    ) -> Reservation:
        """Settle with what was actually used (the spend happened: never refused
        for being over; ControlPlaneError 409 `not_open` if already closed)."""
        reservation_id = _id_of(reservation)
        return Reservation.from_json(
            self._request(
                "POST",
                f"/api/v1/budget/reservations/{reservation_id}/settle/",
                json={"actual": _amounts(actual)},
            )
        )

    def release(self, reservation: Reservation | str) -> Reservation:
        """Give the reservation back unused."""
        reservation_id = _id_of(reservation)
        return Reservation.from_json(
            self._request(
                "POST", f"/api/v1/budget/reservations/{reservation_id}/release/"
            )
        )

    # ------------------------------------------------------------ runs

    def start_run(
        self,
        *,
        agent: str,
        input: str,
        end_user: str | None = None,
        limits: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Start a run of one of the tenant's agents. `end_user`: who the run
        serves (its memory and the per-end-user budget limits)."""
        body: dict[str, Any] = {"agent": agent, "input": input}
        if end_user is not None:
            body["end_user"] = end_user
        if limits is not None:
            body["limits"] = dict(limits)
        result: dict[str, Any] = self._request("POST", "/api/v1/runs/", json=body)
        return result

    def get_run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/api/v1/runs/{run_id}/")
        return result

    def end_user_memory(self, end_user: str) -> dict[str, Any]:
        """What the `memory` tool keeps about an end user."""
        result: dict[str, Any] = self._request(
            "GET", f"/api/v1/end-users/{end_user}/memory/"
        )
        return result

    def delete_end_user_memory(self, end_user: str) -> dict[str, Any]:
        """Delete everything the `memory` tool keeps about an end user (admins)."""
        result: dict[str, Any] = self._request(
            "DELETE", f"/api/v1/end-users/{end_user}/memory/"
        )
        return result

    # ------------------------------------------------------------ evals

    def start_eval_run(
        self,
        *,
        suite: str,
        external_agent: str,
        k: int,
        gate: str | None = None,
        baseline: str | None = None,
    ) -> dict[str, Any]:
        """Start an eval run of `suite` for this external agent: k pending trials
        per case (`cases[].trials[].id`, with each case's `input`) to run and
        report. `gate` and `baseline` are checked before anything is written."""
        body: dict[str, Any] = {"suite": suite, "external_agent": external_agent}
        body["k"] = k
        if gate is not None:
            body["gate"] = gate
        if baseline is not None:
            body["baseline"] = baseline
        result: dict[str, Any] = self._request("POST", "/api/v1/evals/runs/", json=body)
        return result

    def get_eval_run(self, eval_run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "GET", f"/api/v1/evals/runs/{eval_run_id}/"
        )
        return result

    def report_trial(
        self,
        eval_run_id: str,
        trial_id: str,
        *,
        trace_id: str | None = None,
        final_answer: str | None = None,
        error: str | None = None,
    ) -> dict[str, Any]:
        """Report a trial the agent ran under `trace_id` (or `error`: why it
        produced no trace); the answer is the graded trial. A 409 `trace_not_found`
        means the agent's spans have not arrived yet."""
        body: dict[str, Any] = {}
        if trace_id is not None:
            body["trace_id"] = trace_id
        if final_answer is not None:
            body["final_answer"] = final_answer
        if error is not None:
            body["error"] = error
        result: dict[str, Any] = self._request(
            "POST",
            f"/api/v1/evals/runs/{eval_run_id}/trials/{trial_id}/result/",
            json=body,
        )
        return result

    def eval_verdict(
        self, eval_run_id: str, *, gate: str | None = None, baseline: str | None = None
    ) -> dict[str, Any]:
        """The server's CI verdict of a finished eval run: `lines` (one per case
        and the suite's figures), `gate`, `regression`, `junit` and `passed`."""
        params = {
            name: value
            for name, value in (("gate", gate), ("baseline", baseline))
            if value is not None
        }
        result: dict[str, Any] = self._request(
            "GET", f"/api/v1/evals/runs/{eval_run_id}/verdict/", params=params or None
        )
        return result


def _id_of(reservation: Reservation | str) -> str:
    return reservation.id if isinstance(reservation, Reservation) else reservation


def _amounts(amounts: Mapping[str, Amount]) -> dict[str, int | str]:
    """Tokens as ints, cost as a decimal string (a float's binary noise never
    reaches the ledger)."""
    return {
        name: value if isinstance(value, int) and not isinstance(value, bool)
        else str(value)
        for name, value in amounts.items()
    }  # fmt: skip


def _error_of(response: httpx.Response) -> ControlPlaneError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": "http_error", "message": response.text[:500]}
    code = str(error.get("code", "error"))
    message = str(error.get("message", ""))
    if code == "budget_exhausted":
        return BudgetExhausted(response.status_code, code, message, error)
    return ControlPlaneError(response.status_code, code, message, error)
