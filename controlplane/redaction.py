"""The one redaction rule: what a person, a log or an exporter may read.

A value is hidden when its key is listed in `TRACING_REDACT_KEYS` (the whole key
or its last dotted component, case-insensitive), and a substring is hidden when
it looks like a credential (`sk-…`, `cp_…`, `pl_…`, AWS key ids, `Bearer …`, JWTs, PEM
private keys, a URL's password, …) or follows a listed key in text
(`"password": "…"`, `api_key=…`). Strings that hold JSON are decoded and
redacted by key as well, so serialized tool arguments and a model's
`function.arguments` get the same rule as a dict, at any depth.

Spans, their payloads and run events are redacted before they are written,
streamed or exported; rows that keep raw values because a tool must execute
with them (tool calls, steps, approvals, the engine state) are redacted when an
API serializes them; the logging filter redacts every record. The values of
tenant secrets this process has handled (controlplane.secrets) are hidden
wherever they appear, whatever key or pattern surrounds them: a second layer
behind the rule that a secret never reaches any of these. It sits on the
ground floor (controlplane) because every app redacts: the audit API as much as
tracing and runs.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import re
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from rest_framework import serializers

REDACTED = "[REDACTED]"

# Deeper than this a value is not inspected but hidden whole: walking it could
# exhaust the stack, and no argument a person needs to read is that deep.
_MAX_DEPTH = 100

# Values that look like credentials, wherever they appear inside a string.
_CREDENTIAL_PATTERNS = [
    r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic style keys
    r"\bcp_[A-Za-z0-9_\-]{16,}",  # our API tokens
    r"\bpl_[A-Za-z0-9_\-]{16,}",  # our one-time password links (in URLs)
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
_DEFAULT_KEYS = ("password", "secret", "api_key", "authorization", "token")


# The tenant secret values this process has set or decrypted, in every form
# they take in text (as is, and JSON-escaped); the most recent are kept. Shorter
# values are not scrubbed: a test value like "none" or "true" would garble every
# later log line and span of the process, and no credential is that short.
_KNOWN_SECRETS_MAX = 4096
_KNOWN_SECRET_MIN_CHARS = 8
_known_secrets: dict[str, None] = {}
_known_secrets_pattern: re.Pattern[str] | None = None
_known_secrets_lock = threading.Lock()


def secret_value_known(value: str) -> None:
    """Hide `value` from now on wherever redaction runs in this process."""
    global _known_secrets_pattern
    forms = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
    }
    with _known_secrets_lock:
        fresh = [
            form
            for form in forms
            if len(form) >= _KNOWN_SECRET_MIN_CHARS and form not in _known_secrets
        ]
        if not fresh:
            return
        for form in fresh:
            _known_secrets[form] = None
        while len(_known_secrets) > _KNOWN_SECRETS_MAX:
            del _known_secrets[next(iter(_known_secrets))]
        # Longest first: a value that contains another is hidden whole.
        ordered = sorted(_known_secrets, key=len, reverse=True)
        _known_secrets_pattern = re.compile("|".join(map(re.escape, ordered)))


def known_secrets_forget() -> None:
    """Forget every remembered value (tests: one test's values are not the next's)."""
    global _known_secrets_pattern
    with _known_secrets_lock:
        _known_secrets.clear()
        _known_secrets_pattern = None


def scrub_known_secrets(text: str) -> str:
    pattern = _known_secrets_pattern
    return text if pattern is None else pattern.sub(REDACTED, text)


def _redacted_keys() -> frozenset[str]:
    # The logging filter may see a record before settings are configured.
    keys = (
        settings.TRACING_REDACT_KEYS
        if settings.configured and hasattr(settings, "TRACING_REDACT_KEYS")
        else _DEFAULT_KEYS
    )
    return _keys_of(tuple(keys))


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


@functools.lru_cache(maxsize=8)
def _key_value_pattern(secret: frozenset[str]) -> re.Pattern[str] | None:
    """`<key>: value` / `<key>=value` in text, for the listed keys: the key may be
    quoted (also JSON-escaped, `\\"password\\"`), the value quoted or bare (an
    `Authorization` value keeps its scheme word with it)."""
    if not secret:
        return None
    names = "|".join(re.escape(k) for k in sorted(secret, key=len, reverse=True))
    return re.compile(
        r"(?P<head>(?:\\?[\"'])?(?<![\w\-])(?:" + names + r")(?:\\?[\"'])?\s{0,8}"
        r"[:=]\s{0,8})"
        r"(?!\[REDACTED\])"  # already hidden by a credential pattern
        r"(?P<value>\\\"(?:[^\"\\]|\\[^\"]){0,4096}\\\""
        r"|\"(?:[^\"\\\n]|\\.){0,4096}\""
        r"|'[^'\n]{0,4096}'"
        r"|(?:(?:bearer|basic|token|digest)\s{1,8})?[^\s\"',;&}\]\\]{1,4096})",
        re.IGNORECASE,
    )


def redact_text(value: str, *, keys: frozenset[str] | None = None) -> str:
    """Replace credential-looking substrings and listed keys' values in `value`;
    a string that holds a JSON object or array is redacted as that JSON."""
    # Outside the memo below: its verdicts predate values learnt since.
    value = scrub_known_secrets(value)
    if len(value) < 8:
        return value
    secret = keys if keys is not None else _redacted_keys()
    if len(value) > _MEMO_MAX_CHARS:
        return _redact_text(value, secret)
    return _redact_text_memo(value, secret)


# A run's messages are scanned again with every model call: remember the
# verdicts on recent short strings (at most 4096 of 1 KB).
_MEMO_MAX_CHARS = 1024


@functools.lru_cache(maxsize=4096)
def _redact_text_memo(value: str, secret: frozenset[str]) -> str:
    return _redact_text(value, secret)


def _redact_text(value: str, secret: frozenset[str]) -> str:
    if value.lstrip()[:1] in ("{", "["):
        decoded = _json_or_none(value)
        if decoded is not None:
            redacted = redact(decoded, keys=secret)
            if redacted == decoded:
                return value
            return json.dumps(redacted, ensure_ascii=False)
    if "://" in value:
        value = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", value)
    value = _CREDENTIALS.sub(REDACTED, value)
    pattern = _key_value_pattern(secret)
    # Most text names no listed key: a substring test is far cheaper than the scan.
    lowered = value.lower()
    if pattern is not None and any(key in lowered for key in secret):
        value = pattern.sub(lambda m: m.group("head") + _hidden(m["value"]), value)
    return value


def _hidden(value: str) -> str:
    """The placeholder, quoted as the value was (so JSON-ish text stays readable)."""
    for quote in ('\\"', '"', "'"):
        if value.startswith(quote) and value.endswith(quote) and len(value) > 1:
            return quote + REDACTED + quote
    return REDACTED


def _json_or_none(text: str) -> dict[str, Any] | list[Any] | None:
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return decoded if isinstance(decoded, (dict, list)) else None


def redact(value: Any, *, keys: frozenset[str] | None = None, _depth: int = 0) -> Any:
    """Return `value` with secret keys and credential-looking strings redacted.

    Walks dicts, lists and tuples; strings are scanned, and strings that hold
    JSON are decoded and redacted by key too.
    """
    secret = keys if keys is not None else _redacted_keys()
    if _depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value, keys=secret)
    if isinstance(value, Mapping):
        return {
            k: (
                REDACTED
                if _key_in(str(k), secret)
                else redact(v, keys=secret, _depth=_depth + 1)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        items = [redact(v, keys=secret, _depth=_depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def redact_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Span attributes: a configured key loses its value; strings are scanned."""
    secret = _redacted_keys()
    return {
        key: (REDACTED if key_is_secret(key, secret) else redact(value, keys=secret))
        for key, value in (attributes or {}).items()
    }


def unredact(edited: Any, original: Any, *, key: str | None = None) -> Any:
    """`edited` (a reader's change to a redacted `original`) with every value it
    sent back exactly as it was shown replaced by the original value it hides:
    an approver may edit other arguments without knowing the secrets."""
    secret = _redacted_keys()
    shown = REDACTED if key is not None and _key_in(key, secret) else redact(original)
    if edited == shown and shown != original:
        return original
    if isinstance(edited, Mapping) and isinstance(original, Mapping):
        return {
            k: unredact(v, original[k], key=str(k)) if k in original else v
            for k, v in edited.items()
        }
    if (
        isinstance(edited, list)
        and isinstance(original, list)
        and len(edited) == len(original)
    ):
        return [unredact(e, o) for e, o in zip(edited, original, strict=True)]
    return edited


def args_digest(sha256: str) -> str:
    """An arguments hash as a reader sees it: keyed with the server's SECRET_KEY,
    so it still tells argument versions apart, but a reader who sees the other
    arguments cannot test guesses of a hidden value against it offline."""
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, f"args:{sha256}".encode(), hashlib.sha256).hexdigest()


class ArgsDigestField(serializers.CharField):
    """A stored arguments sha256, shown as `args_digest`."""

    def to_representation(self, value: Any) -> str:
        return args_digest(super().to_representation(value))


class RedactedJSONField(serializers.JSONField):
    """A JSON value as a reader may see it (the row keeps the raw value)."""

    def to_representation(self, value: Any) -> Any:
        return redact(super().to_representation(value))


class RedactedCharField(serializers.CharField):
    """Free text as a reader may see it."""

    def to_representation(self, value: Any) -> str:
        return redact_text(super().to_representation(value))


class RedactingLogFilter(logging.Filter):
    """Redact a log record's message, exception and stack text, for every handler
    the record reaches after this one (the record is changed in place)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the handler's to report
            return True
        record.msg = redact_text(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_text = redact_text(text.rstrip("\n"))
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True
