"""Who owns a sandbox: the runner process, named by pid and start time.

Every cgroup and run directory is named `r<pid>-<starttime>-<token>`. The start time
(field 22 of /proc/<pid>/stat) makes the name immune to pid reuse: a recycled pid has
a different start time, so the janitor still sees the owner as gone.
"""

from __future__ import annotations

import os
import re
import secrets

_NAME = re.compile(r"^r(?P<pid>\d+)-(?P<start>\d+)-(?P<token>[0-9a-f]+)$")


def process_start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


_tag: tuple[int, str] | None = None


def owner_tag() -> str:
    """`r<pid>-<starttime>` of the calling process (read once per process)."""
    global _tag
    pid = os.getpid()
    if _tag is None or _tag[0] != pid:  # a forked child has its own pid
        _tag = (pid, f"r{pid}-{process_start_time(pid) or 0}")
    return _tag[1]


def run_name() -> str:
    return f"{owner_tag()}-{secrets.token_hex(6)}"


def owner_of(name: str) -> tuple[int, int] | None:
    m = _NAME.match(name)
    if not m:
        return None
    return int(m.group("pid")), int(m.group("start"))


def owner_alive(pid: int, start: int) -> bool:
    return process_start_time(pid) == start
