"""The result envelope every tool call ends in, and its error codes (DESIGN.md §5)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Errno-style codes: programs read the code, the model reads the message."""

    EINVAL = "EINVAL"  # arguments invalid (schema, unparseable JSON, truncated call)
    ENOTOOL = "ENOTOOL"  # no tool of that name
    EBUDGET = "EBUDGET"  # a budget dimension refused the call
    EPERM = "EPERM"  # policy or reviewer refused, or a precondition failed
    EACCES = "EACCES"  # the tool itself was refused access; never retried
    ETIMEDOUT = "ETIMEDOUT"  # the tool did not finish in time
    EPATH = "EPATH"  # a path escaped the workspace
    EDISK = "EDISK"  # disk or file-size limit
    EOUTPUT = "EOUTPUT"  # output limit
    ELIMIT = "ELIMIT"  # a CPU, memory or process limit ended the command
    EUNKNOWN = "EUNKNOWN"  # outcome of an interrupted write is not known
    ECANCELED = "ECANCELED"  # not executed because the run stopped first
    EINTERNAL = "EINTERNAL"  # the tool or host failed in an unexpected way


class SuggestedAction(StrEnum):
    """Machine tokens for the policy (and the human reading the trace)."""

    FIX_ARGUMENTS = "fix_arguments_and_retry_once"
    CHOOSE_LISTED_TOOL = "choose_a_listed_tool"
    STOP_AND_REQUEST_HUMAN = "stop_and_request_human"
    RETRY_LATER = "retry_later"
    CHECK_STATE_FIRST = "check_state_before_retrying"
    DO_NOT_RETRY = "do_not_retry"
    REDUCE_OUTPUT = "reduce_output"


_DEFAULTS: dict[ErrorCode, tuple[bool, SuggestedAction]] = {
    ErrorCode.EINVAL: (True, SuggestedAction.FIX_ARGUMENTS),
    ErrorCode.ENOTOOL: (True, SuggestedAction.CHOOSE_LISTED_TOOL),
    ErrorCode.EBUDGET: (False, SuggestedAction.STOP_AND_REQUEST_HUMAN),
    ErrorCode.EPERM: (False, SuggestedAction.STOP_AND_REQUEST_HUMAN),
    ErrorCode.EACCES: (False, SuggestedAction.STOP_AND_REQUEST_HUMAN),
    ErrorCode.ETIMEDOUT: (False, SuggestedAction.CHECK_STATE_FIRST),
    ErrorCode.EPATH: (True, SuggestedAction.FIX_ARGUMENTS),
    ErrorCode.EDISK: (False, SuggestedAction.REDUCE_OUTPUT),
    ErrorCode.EOUTPUT: (True, SuggestedAction.REDUCE_OUTPUT),
    ErrorCode.ELIMIT: (False, SuggestedAction.FIX_ARGUMENTS),
    ErrorCode.EUNKNOWN: (False, SuggestedAction.CHECK_STATE_FIRST),
    ErrorCode.ECANCELED: (False, SuggestedAction.DO_NOT_RETRY),
    ErrorCode.EINTERNAL: (False, SuggestedAction.DO_NOT_RETRY),
}


def utc_now_iso() -> str:
    """The current time as an ISO 8601 UTC string with a `Z` suffix."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class ToolError:
    """The error object: `code`, `message`, `retryable`, `suggested_action`."""

    code: ErrorCode
    message: str
    retryable: bool
    suggested_action: str

    @classmethod
    def of(
        cls,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        suggested_action: str | None = None,
    ) -> ToolError:
        """An error with the code's default retryability and suggested action."""
        default_retryable, default_action = _DEFAULTS[code]
        return cls(
            code=code,
            message=message,
            retryable=default_retryable if retryable is None else retryable,
            suggested_action=(
                str(default_action) if suggested_action is None else suggested_action
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": str(self.code),
            "message": self.message,
            "retryable": self.retryable,
            "suggested_action": self.suggested_action,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolError:
        return cls(
            code=ErrorCode(data["code"]),
            message=str(data["message"]),
            retryable=bool(data["retryable"]),
            suggested_action=str(data["suggested_action"]),
        )


@dataclass(frozen=True)
class ToolResult:
    """The result envelope: `ok`, `data`, `error`, `refs`, `cost`, `observed_at`."""

    ok: bool
    data: Any = None
    error: ToolError | None = None
    refs: tuple[Mapping[str, Any], ...] = ()
    cost: Mapping[str, Any] = field(default_factory=dict)
    observed_at: str = field(default_factory=utc_now_iso)

    @classmethod
    def success(
        cls,
        data: Any = None,
        *,
        refs: tuple[Mapping[str, Any], ...] = (),
        cost: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        return cls(ok=True, data=data, refs=refs, cost=dict(cost or {}))

    @classmethod
    def failure(
        cls,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        suggested_action: str | None = None,
        data: Any = None,
        refs: tuple[Mapping[str, Any], ...] = (),
        cost: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        error = ToolError.of(
            code, message, retryable=retryable, suggested_action=suggested_action
        )
        return cls(ok=False, data=data, error=error, refs=refs, cost=dict(cost or {}))

    def without_values(self, values: Iterable[str]) -> ToolResult:
        """A copy with every occurrence of `values` (as they are, or JSON-escaped)
        in its data, error message and refs replaced by SECRET_HIDDEN."""
        forms = sorted(
            {form for value in values if value for form in (value, _escaped(value))},
            key=len,
            reverse=True,  # the longer form first: an escaped one contains the raw
        )
        if not forms:
            return self
        error = self.error
        if error is not None:
            error = replace(error, message=_without(error.message, forms))
        return replace(
            self,
            data=_without(self.data, forms),
            error=error,
            refs=tuple(_without(dict(ref), forms) for ref in self.refs),
        )

    def with_cost(self, **cost: Any) -> ToolResult:
        """A copy with `cost` entries added (e.g. latency measured by the host)."""
        return ToolResult(
            ok=self.ok,
            data=self.data,
            error=self.error,
            refs=self.refs,
            cost={**self.cost, **cost},
            observed_at=self.observed_at,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "data": self.data,
            "error": None if self.error is None else self.error.to_dict(),
            "refs": [dict(ref) for ref in self.refs],
            "cost": dict(self.cost),
            "observed_at": self.observed_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolResult:
        error = data.get("error")
        return cls(
            ok=bool(data["ok"]),
            data=data.get("data"),
            error=None if error is None else ToolError.from_dict(error),
            refs=tuple(dict(ref) for ref in data.get("refs") or ()),
            cost=dict(data.get("cost") or {}),
            observed_at=str(data.get("observed_at") or utc_now_iso()),
        )


class ToolFailure(Exception):
    """Raised by a tool handler to return a specific error envelope."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        suggested_action: str | None = None,
        data: Any = None,
    ) -> None:
        super().__init__(message)
        self.result = ToolResult.failure(
            code,
            message,
            retryable=retryable,
            suggested_action=suggested_action,
            data=data,
        )


SECRET_HIDDEN = "[REDACTED]"


def _escaped(value: str) -> str:
    return json.dumps(value)[1:-1]


def _without(value: Any, forms: list[str]) -> Any:
    if isinstance(value, str):
        for form in forms:
            value = value.replace(form, SECRET_HIDDEN)
        return value
    if isinstance(value, Mapping):
        return {_without(k, forms): _without(v, forms) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without(item, forms) for item in value]
    return value
