"""`make test` checks the machine first: what the suite needs beyond the venv.

The sandbox tests need root (cgroups, tmpfs mounts, the drop to uid 65534),
bubblewrap, setpriv, a C compiler (the compiled init and launcher) and a
world-executable /usr/bin/python3; the browser tests need Debian's Chromium. Without
this check a fresh machine learns it only from failing tests. Everything missing is
reported in one message with the one `apt-get install` line, and the exit status is 1.

Run: `python tests/preflight.py` (the Makefile does, before pytest).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

# The one line the README gives next to the two commands.
APT_PACKAGES = ("bubblewrap", "chromium", "gcc", "libc6-dev", "python3", "util-linux")
CHROMIUM = "/usr/bin/chromium"  # tests/frontend/conftest.py launches this one
SYSTEM_PYTHON = "/usr/bin/python3"  # the sandbox tests run workloads with it


@dataclass(frozen=True)
class Need:
    what: str  # what is missing, as the message says it
    package: str | None  # the Debian package that provides it (None: not a package)
    present: Callable[[], bool]


def _runs(*argv: str) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _root() -> bool:
    return os.geteuid() == 0


def _bwrap() -> bool:
    path = shutil.which("bwrap")
    return path is not None and _runs(path, "--version")


def _on_path(*names: str) -> Callable[[], bool]:
    return lambda: any(shutil.which(name) is not None for name in names)


def _executable(path: str) -> Callable[[], bool]:
    return lambda: os.path.isfile(path) and os.access(path, os.X_OK)


NEEDS = (
    Need("root (the sandbox tests make cgroups and mounts)", None, _root),
    Need("bubblewrap (`bwrap` on PATH)", "bubblewrap", _bwrap),
    Need("setpriv (on PATH)", "util-linux", _on_path("setpriv")),
    Need("a C compiler (`cc` or `gcc` on PATH)", "gcc", _on_path("cc", "gcc")),
    Need(f"{SYSTEM_PYTHON}", "python3", _executable(SYSTEM_PYTHON)),
    Need(f"Chromium at {CHROMIUM}", "chromium", _executable(CHROMIUM)),
)


def missing(needs: tuple[Need, ...] = NEEDS) -> list[Need]:
    return [need for need in needs if not need.present()]


def report(absent: list[Need]) -> str:
    lines = ["make test cannot run on this machine; missing:"]
    lines += [
        f"  - {need.what}" + (f" [package {need.package}]" if need.package else "")
        for need in absent
    ]
    lines += [
        "Install the system packages (Debian/Ubuntu) and run `make test` as root:",
        f"  apt-get install -y {' '.join(APT_PACKAGES)}",
    ]
    return "\n".join(lines)


def main() -> int:
    absent = missing()
    if absent:
        print(report(absent), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
