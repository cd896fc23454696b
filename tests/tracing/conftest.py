from __future__ import annotations

from tests.runs.conftest import demo_agent, drive_run, scripted_agent, shop

__all__ = ["demo_agent", "drive_run", "scripted_agent", "shop"]
