"""Celery beat's heartbeat: proof that its loop still turns, for a healthcheck.

Beat answers no ping and serves no port, so a hung beat (a lost Redis
connection it waits on forever, a stuck sync of its schedule file) looked
alive to compose. Its scheduler touches a file on every tick; beat ticks at
least every `CELERY_BEAT_MAX_LOOP_INTERVAL` seconds, and
`python -m controlplane.beat` exits 1 when the file is older than
`HEARTBEAT_MAX_AGE` (compose's healthcheck of the beat service).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings

# Several missed ticks, not one late one: a tick that publishes to a Redis
# that is restarting waits for kombu's retries.
HEARTBEAT_MAX_AGE = 120.0


class HeartbeatScheduler(PersistentScheduler):
    """Celery's default scheduler, touching the heartbeat file on every tick."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        heartbeat_touch()
        return float(super().tick(*args, **kwargs))


def heartbeat_path() -> Path:
    return Path(settings.BEAT_HEARTBEAT_FILE)


def heartbeat_touch() -> None:
    path = heartbeat_path()
    try:
        path.touch()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def heartbeat_age() -> float | None:
    """Seconds since beat's last tick; None when it never ticked."""
    try:
        return time.time() - os.path.getmtime(heartbeat_path())
    except OSError:
        return None


def main() -> int:
    age = heartbeat_age()
    if age is None:
        print(f"beat: no heartbeat at {heartbeat_path()}", file=sys.stderr)
        return 1
    if age > HEARTBEAT_MAX_AGE:
        print(f"beat: last tick {age:.0f} s ago", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    sys.exit(main())
