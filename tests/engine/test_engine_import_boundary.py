from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "django",
    "celery",
    "controlplane",
    "approvals",
    "tracing",
    "frontend",
    "runs.sandbox",
    "rest_framework",
    "channels",
)


def test_engine_imports_nothing_from_django_or_the_apps() -> None:
    modules = sorted(
        "runs.engine."
        + ".".join(p.relative_to(ROOT / "runs" / "engine").with_suffix("").parts)
        for p in (ROOT / "runs" / "engine").rglob("*.py")
        if p.name != "__init__.py"
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}"
        f" or m.startswith('runs.sandbox'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == ""
    assert (
        "runs.engine.loop" in modules
        and "runs.engine.adapters.openai_compatible" in modules
    )
