"""The alarms behind `span_batch_flush_if_slow`: one thread per process runs a
callback once its delay has passed, unless it was cancelled first."""

from __future__ import annotations

import threading
import time

from tracing.processor import _Alarms


def test_a_cancelled_alarm_never_runs() -> None:
    alarms, ran = _Alarms(), threading.Event()
    alarms.cancel(alarms.set(0.05, ran.set))
    assert not ran.wait(0.3)


def test_an_alarm_runs_once_its_delay_has_passed() -> None:
    alarms, ran = _Alarms(), threading.Event()
    started = time.monotonic()
    alarms.set(0.05, ran.set)
    assert ran.wait(5)
    assert time.monotonic() - started >= 0.05


def test_an_earlier_alarm_is_not_kept_waiting_by_a_later_one() -> None:
    alarms, late, early = _Alarms(), threading.Event(), threading.Event()
    later = alarms.set(30, late.set)
    time.sleep(0.05)  # the thread now sleeps until the later one is due
    alarms.set(0.01, early.set)
    assert early.wait(5)
    alarms.cancel(later)
    assert not late.is_set()


def test_cancel_waits_for_a_callback_already_running() -> None:
    alarms = _Alarms()
    started, finished = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.2)
        finished.set()

    key = alarms.set(0, slow)
    assert started.wait(5)
    alarms.cancel(key)
    assert finished.is_set()


def test_a_failing_callback_does_not_stop_later_alarms() -> None:
    alarms, ran = _Alarms(), threading.Event()

    def boom() -> None:
        raise RuntimeError("boom")

    alarms.set(0, boom)
    alarms.set(0.02, ran.set)
    assert ran.wait(5)
