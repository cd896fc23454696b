from __future__ import annotations

import pytest

from runs.engine.progress import ProgressTracker, step_fingerprint


def test_fingerprint_is_canonical_and_short() -> None:
    a = step_fingerprint({"tool": "t", "args": {"a": 1, "b": 2}}, {"ok": True})
    b = step_fingerprint({"args": {"b": 2, "a": 1}, "tool": "t"}, {"ok": True})
    assert a == b
    assert len(a) == 16


def test_world_version_changes_the_fingerprint() -> None:
    assert step_fingerprint("read", "same", 1) != step_fingerprint("read", "same", 2)


def test_window_of_identical_fingerprints_is_no_progress() -> None:
    tracker = ProgressTracker(window=4)
    assert [tracker.record("x") for _ in range(4)] == [False, False, False, True]


def test_a_different_fingerprint_inside_the_window_is_progress() -> None:
    tracker = ProgressTracker(window=3)
    for fingerprint in ["x", "x", "y", "x", "x"]:
        assert tracker.record(fingerprint) is False


def test_tracker_state_survives_serialisation_between_steps() -> None:
    tracker = ProgressTracker(window=3)
    tracker.record("x")
    tracker.record("x")
    restored = ProgressTracker.from_dict(tracker.to_dict())
    assert restored.record("x") is True


def test_window_must_allow_at_least_one_retry() -> None:
    with pytest.raises(ValueError):
        ProgressTracker(window=1)
