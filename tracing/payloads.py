"""Payloads of spans: large values (model input/output, tool arguments/results)
redacted, encoded as JSON text, and stored once per tenant by their sha256; a
span refers to them by digest (`Span.payloads`), so span rows and stream events
stay small. Span rows themselves are `tracing.store`'s."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from controlplane.redaction import redact, redact_attributes
from tracing.models import SpanPayload

__all__ = [
    "PAYLOAD_KEYS",
    "PayloadMemo",
    "payload_encode",
    "payload_store",
    "payloads_split",
]

# Attributes that carry model input/output and tool arguments/results: stored as
# payloads (once, by hash, not truncated below TRACING_PAYLOAD_MAX_BYTES) and
# referenced from the span, so span rows and stream events stay small.
PAYLOAD_KEYS = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.tool.definitions",
    }
)


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return str(value)


def payload_encode(value: Any) -> tuple[str, str, int]:
    """Redact and serialise a payload: (sha256, JSON text, size in bytes).

    Kept whole up to TRACING_PAYLOAD_MAX_BYTES (at least 1 MB); a larger one is
    stored as its head with a note of its full size.
    """
    sent = value
    if isinstance(value, str):
        with contextlib.suppress(ValueError, RecursionError):
            value = json.loads(value)
    try:
        text = json.dumps(redact(value), ensure_ascii=False, default=_json_default)
    except RecursionError:
        # A JSON text nested deeper than redaction walks (an ingested attribute
        # may be anything): kept as the text it was, redacted as text.
        text = json.dumps(redact(str(sent)), ensure_ascii=False)
    return _payload_of(text)


def _payload_of(text: str) -> tuple[str, str, int]:
    limit = settings.TRACING_PAYLOAD_MAX_BYTES
    encoded = text.encode()
    if len(encoded) > limit:
        head = encoded[:limit].decode("utf-8", "ignore")
        text = json.dumps({"truncated": True, "size_bytes": len(encoded), "head": head})
        encoded = text.encode()
    return hashlib.sha256(encoded).hexdigest(), text, len(encoded)


def payload_store(*, tenant_id: Any, value: Any) -> str:
    """Store a (redacted) payload once per tenant; return its sha256."""
    digest, text, size = payload_encode(value)
    SpanPayload.objects.bulk_create(
        [SpanPayload(tenant_id=tenant_id, sha256=digest, size=size, content=text)],
        ignore_conflicts=True,
    )
    return digest


_encoded: OrderedDict[str, tuple[str, str, int]] = OrderedDict()
_ENCODED_LIMIT = 64
_encoded_lock = threading.Lock()


def _payload_encode_cached(value: Any) -> tuple[str, str, int]:
    """payload_encode, remembered for recent JSON texts: every chat span of a run
    carries the same tool definitions, and its messages are the last call's
    plus a few (only those are parsed and redacted, see `_array_extended`)."""
    if not isinstance(value, str):
        return payload_encode(value)
    with _encoded_lock:
        known = _encoded.get(value)
        if known is not None:
            _encoded.move_to_end(value)
            return known
        recent = list(_encoded.items()) if value.startswith("[") else []
    encoded = _array_extended(value, recent) or payload_encode(value)
    with _encoded_lock:
        _encoded[value] = encoded
        if len(_encoded) > _ENCODED_LIMIT:
            _encoded.popitem(last=False)
    return encoded


def _array_extended(
    value: str, recent: list[tuple[str, tuple[str, str, int]]]
) -> tuple[str, str, int] | None:
    """The encoding of the JSON array `value` from the longest recent one it
    extends: the same text up to its last element, then more elements.
    Redaction works element by element, so only the new elements are parsed
    and redacted."""
    extended = [
        (raw, text)
        for raw, (_, text, _) in recent
        if 2 < len(raw) < len(value)
        and value[len(raw) - 1] == ","  # cheap: most of the recent fail here
        and raw.endswith("]")
        and text.startswith("[")  # not a truncated head
        and value.startswith(raw[:-1])
    ]
    if not extended:
        return None
    raw, text = max(extended, key=lambda found: len(found[0]))
    try:
        more = json.loads("[" + value[len(raw) :])
    except ValueError:
        return None
    if not isinstance(more, list) or not more:
        return None
    tail = json.dumps(redact(more), ensure_ascii=False, default=_json_default)
    return _payload_of(text[:-1] + ", " + tail[1:])


# Payload digests by (span, attribute) with the raw value they were computed
# from: a span's end repeats its start's attributes, identical objects.
PayloadMemo = dict[str, tuple[Any, str]]


def payloads_split(
    tenant_id: Any,
    raw: Mapping[str, Any],
    memo: PayloadMemo | None = None,
    pending: dict[tuple[Any, str], SpanPayload] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Plain (redacted) attributes and payload digests. Payload rows are stored
    now, or added to `pending` for the caller to store in one insert."""
    plain: dict[str, Any] = {}
    payloads: dict[str, str] = {}
    for key, value in raw.items():
        if key in PAYLOAD_KEYS:
            known = memo.get(key) if memo is not None else None
            if known is not None and known[0] is value:
                payloads[key] = known[1]
                continue
            if pending is None:
                payloads[key] = payload_store(tenant_id=tenant_id, value=value)
            else:
                digest, text, size = _payload_encode_cached(value)
                pending.setdefault(
                    (tenant_id, digest),
                    SpanPayload(
                        tenant_id=tenant_id, sha256=digest, size=size, content=text
                    ),
                )
                payloads[key] = digest
            if memo is not None:
                memo[key] = (value, payloads[key])
        else:
            plain[key] = list(value) if isinstance(value, tuple) else value
    return redact_attributes(plain), payloads
