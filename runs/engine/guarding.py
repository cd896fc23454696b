"""What guardrails and hooks share: checking their parameters, and running a
check under a time limit that fails safe (spec §1.5 contract rules, §2.4).

Pure Python: the host supplies what the checks reach (a model adapter)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MAX_PATTERNS = 50
MAX_PATTERN_CHARS = 300
MAX_TEXT_PARAM_CHARS = 10_000
# A nested quantifier ("(a+)+", "(\w*)*") can backtrack for ages on a crafted
# input, and a regex holds the interpreter while it does (no timeout can stop
# it): such patterns are refused when configured.
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[+*}]\)[+*{]")


class ParamError(ValueError):
    """A parameter of a check is wrong; the message names it."""


def patterns_param(params: Mapping[str, Any], key: str = "patterns") -> list[str]:
    value = params.get(key)
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(p, str) and p for p in value)
    ):
        raise ParamError(f"{key} must be a non-empty list of regular expressions")
    if len(value) > MAX_PATTERNS:
        raise ParamError(f"{key} has {len(value)} patterns; at most {MAX_PATTERNS}")
    for pattern in value:
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ParamError(
                f"{key}: a pattern has {len(pattern)} characters; at most "
                f"{MAX_PATTERN_CHARS}"
            )
        if _NESTED_QUANTIFIER.search(pattern):
            raise ParamError(
                f"{key}: {pattern!r} repeats a repeated group, which can take "
                "exponential time; write it without the nested quantifier"
            )
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ParamError(
                f"{key}: {pattern!r} is not a valid regex ({exc})"
            ) from None
    return list(value)


def text_param(
    params: Mapping[str, Any],
    key: str,
    *,
    required: bool = True,
    default: str = "",
    limit: int = MAX_TEXT_PARAM_CHARS,
) -> str:
    if key not in params:
        if required:
            raise ParamError(f"{key} is required")
        return default
    value = params[key]
    if not isinstance(value, str) or (required and not value.strip()):
        raise ParamError(f"{key} must be a non-blank string")
    if len(value) > limit:
        raise ParamError(f"{key} has {len(value)} characters; at most {limit}")
    return value


def bool_param(params: Mapping[str, Any], key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ParamError(f"{key} must be true or false")
    return value


def int_param(
    params: Mapping[str, Any], key: str, *, low: int, high: int, default: int | None
) -> int:
    value = params.get(key, default)
    if value is None:
        raise ParamError(f"{key} is required")
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
    ):
        raise ParamError(f"{key} must be an integer between {low} and {high}")
    return value


def unknown_params(params: Mapping[str, Any], known: tuple[str, ...]) -> None:
    extra = sorted(set(params) - set(known))
    if extra:
        raise ParamError(
            f"unknown parameter {extra[0]!r}; known: {', '.join(known) or 'none'}"
        )


def compiled(patterns: list[str], *, ignore_case: bool) -> list[re.Pattern[str]]:
    flags = re.IGNORECASE if ignore_case else 0
    return [re.compile(p, flags) for p in patterns]


class CheckTimedOut(Exception):
    """The check did not answer within its time limit."""


@dataclass(frozen=True)
class Timed:
    """What a timed check returned, or the exception it raised, and how long it took."""

    value: Any
    error: BaseException | None
    latency_ms: float


def run_timed(check: Callable[[], T], timeout_seconds: float) -> Timed:
    """Run `check` in a helper thread and wait at most `timeout_seconds`; a check
    still running is abandoned (its result is ignored) and `CheckTimedOut` is the
    error. The caller treats every error as the fail-safe outcome."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = check()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            done.set()

    started = time.monotonic()
    thread = threading.Thread(target=target, name="guard-check", daemon=True)
    thread.start()
    finished = done.wait(timeout_seconds)
    latency = (time.monotonic() - started) * 1000
    if not finished:
        return Timed(
            None, CheckTimedOut(f"no answer within {timeout_seconds:g} s"), latency
        )
    return Timed(box.get("value"), box.get("error"), latency)
