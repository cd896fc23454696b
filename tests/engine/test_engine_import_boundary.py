"""The engine and the sandbox are pure libraries: nothing from Django, Celery or
the apps, and neither imports the other (tests/layers.py reads their imports)."""

from __future__ import annotations

from tests.layers import ROOT, library_violations, source_files


def test_engine_imports_nothing_from_django_or_the_apps() -> None:
    assert library_violations("runs.engine") == []
    files = {p.relative_to(ROOT).as_posix() for p in source_files("runs/engine")}
    assert {"runs/engine/loop.py", "runs/engine/adapters/openai_compatible.py"} <= files


def test_sandbox_imports_nothing_from_django_or_the_apps() -> None:
    assert library_violations("runs.sandbox") == []
