"""A chat span's messages are the last call's plus a few: the encoding reuses the
last one's and equals a fresh one, redaction included."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tracing import payloads as store


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    store._encoded.clear()


def messages(count: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"message {i} " + "x" * 20} for i in range(count)
    ]


def test_an_extended_array_is_encoded_as_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh = store.payload_encode
    full: list[str] = []
    monkeypatch.setattr(
        store, "payload_encode", lambda value: full.append(value) or fresh(value)
    )
    store._payload_encode_cached(json.dumps(messages(2), ensure_ascii=False))
    for count in (4, 5, 9):
        raw = json.dumps(messages(count), ensure_ascii=False)
        assert store._payload_encode_cached(raw) == fresh(raw)
    assert len(full) == 1  # only the first was encoded whole


def test_a_secret_in_a_new_element_is_redacted() -> None:
    first = messages(3)
    store._payload_encode_cached(json.dumps(first))
    leaked = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX"
    grown = [*first, {"role": "tool", "content": f"key {leaked}", "password": "p"}]
    digest, text, size = store._payload_encode_cached(json.dumps(grown))
    assert leaked not in text and '"p"' not in text
    assert (digest, text, size) == store.payload_encode(json.dumps(grown))


def test_what_only_looks_like_an_extension_is_encoded_in_full() -> None:
    first = json.dumps(messages(2))
    store._payload_encode_cached(first)
    for value in (first[:-1] + ", 1] trailing", first[:-1] + ", ]", first[:-1] + "}"):
        assert store._payload_encode_cached(value) == store.payload_encode(value)


def test_the_longest_array_it_extends_is_the_one_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for count in (1, 6):
        store._payload_encode_cached(json.dumps(messages(count)))
    raw = json.dumps(messages(8))
    expected = store.payload_encode(raw)
    redacted: list[int] = []
    fresh_redact = store.redact
    monkeypatch.setattr(
        store,
        "redact",
        lambda value: redacted.append(len(value)) or fresh_redact(value),
    )
    assert store._payload_encode_cached(raw) == expected
    assert redacted == [2]  # the two new messages, not seven
