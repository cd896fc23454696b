"""`make test` checks the machine first and says, in one message, what is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFLIGHT = ROOT / "tests" / "preflight.py"
APT_LINE = "apt-get install -y bubblewrap chromium gcc libc6-dev python3 util-linux"


def _preflight(
    path: str, *, python: str = sys.executable, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), python, str(PREFLIGHT)],
        env={"PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_this_machine_passes_silently() -> None:
    proc = _preflight(os.environ["PATH"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_a_missing_package_gives_one_clear_message_and_fails(tmp_path: Path) -> None:
    # A PATH with everything but bubblewrap.
    for name in ("setpriv", "cc"):
        found = shutil.which(name)
        assert found, name
        (tmp_path / name).symlink_to(found)
    proc = _preflight(str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0] == "make test cannot run on this machine; missing:"
    assert lines[1] == "  - bubblewrap (`bwrap` on PATH) [package bubblewrap]"
    assert len([line for line in lines if line.startswith("  - ")]) == 1
    assert lines[-1] == f"  {APT_LINE}"


def test_not_being_root_is_named() -> None:
    # As uid 65534 with the system Python, the script fed on stdin (opened here).
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with PREFLIGHT.open() as script:
        proc = subprocess.run(
            [*drop, "/usr/bin/python3", "-"],
            stdin=script,
            env={"PATH": os.environ["PATH"]},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    missing = [line for line in proc.stderr.splitlines() if line.startswith("  - ")]
    assert missing == ["  - root (the sandbox tests make cgroups and mounts)"]


def test_make_test_runs_the_preflight_before_pytest() -> None:
    proc = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    commands = proc.stdout.splitlines()
    preflight = commands.index(".venv/bin/python tests/preflight.py")
    pytest = next(i for i, c in enumerate(commands) if " -m pytest" in c)
    assert pytest == preflight + 1
    assert commands[pytest] == ".venv/bin/python -m pytest -n 2 --dist loadfile"


def test_the_readme_gives_the_same_apt_line_next_to_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert APT_LINE in section
