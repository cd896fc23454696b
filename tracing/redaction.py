"""Redaction applied before a span or event is written, streamed or exported."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

REDACTED = "[REDACTED]"

# Values that look like credentials, wherever they appear inside a string.
_CREDENTIAL_PATTERNS = [
    r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic style keys
    r"\bcp_[A-Za-z0-9_\-]{16,}",  # our API tokens
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"\bxox[abpr]-[A-Za-z0-9\-]{10,}",  # Slack tokens
    r"(?i:\bbearer)\s+[A-Za-z0-9._~+/=\-]{8,}",  # Authorization: Bearer ...
    r"(?i:\bbasic)\s+[A-Za-z0-9+/=]{12,}",
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"(?i:(?<=aws_secret_access_key))[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}",
]
_CREDENTIALS = re.compile("|".join(f"(?:{p})" for p in _CREDENTIAL_PATTERNS))
# user:password@ in a URL: keep the user and the host, drop the password.
# Bounded repeats: a megabyte of text must not make the scan quadratic.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]{0,30}://[^/\s:@]{1,256}:)[^@\s/]{1,256}@"
)


def _redacted_keys() -> frozenset[str]:
    return _keys_of(tuple(settings.TRACING_REDACT_KEYS))


@functools.lru_cache(maxsize=8)
def _keys_of(keys: tuple[str, ...]) -> frozenset[str]:
    return frozenset(key.lower() for key in keys)


def key_is_secret(key: str, keys: Iterable[str] | None = None) -> bool:
    """A configured key matches the whole key or its last dotted component."""
    secret = frozenset(keys) if keys is not None else _redacted_keys()
    return _key_in(key, secret)


@functools.lru_cache(maxsize=4096)
def _key_in(key: str, secret: frozenset[str]) -> bool:
    lowered = key.lower()
    return lowered in secret or lowered.rsplit(".", 1)[-1] in secret


def redact_text(value: str) -> str:
    """Replace credential-looking substrings of `value`."""
    if len(value) < 8:
        return value
    if len(value) > _MEMO_MAX_CHARS:
        return _redact_text(value)
    return _redact_text_memo(value)


# A run's messages are scanned again with every model call: remember the
# verdicts on recent short strings (at most 4096 of 1 KB).
_MEMO_MAX_CHARS = 1024


@functools.lru_cache(maxsize=4096)
def _redact_text_memo(value: str) -> str:
    return _redact_text(value)


def _redact_text(value: str) -> str:
    if "://" in value:
        value = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", value)
    return _CREDENTIALS.sub(REDACTED, value)


def redact(value: Any, *, keys: frozenset[str] | None = None) -> Any:
    """Return `value` with secret keys and credential-looking strings redacted.

    Walks dicts, lists and tuples; strings that hold JSON are redacted as text,
    which covers serialized tool arguments and model messages as well.
    """
    secret = keys if keys is not None else _redacted_keys()
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if _key_in(str(k), secret) else redact(v, keys=secret))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        items = [redact(v, keys=secret) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def redact_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Span attributes: a configured key loses its value; strings are scanned."""
    secret = _redacted_keys()
    return {
        key: (REDACTED if key_is_secret(key, secret) else redact(value, keys=secret))
        for key, value in (attributes or {}).items()
    }
