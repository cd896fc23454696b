"""Install the in-sandbox init where the sandbox uid can read it, precompiled.

The repository may not be readable by the sandbox uid, so the init is copied into the
state directory. It is also compiled to a .pyc by the very interpreter that will run
it: compiling ~200 lines on every start would cost a few milliseconds of each run, and
the .pyc's magic number matches that interpreter by construction. If compiling fails,
the plain source is used.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

from .spec import SandboxSettings

_lock = threading.Lock()
_installed: dict[tuple[str, str], Path] = {}
_COMPILE = (
    "import py_compile, sys; "
    "py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"
)


def install_init(settings: SandboxSettings) -> Path:
    """Return the path of the init (a .pyc where possible) inside the state dir."""
    key = (str(settings.state_dir), settings.python)
    with _lock:
        cached = _installed.get(key)
        if cached is not None and cached.exists():
            return cached
        source = Path(__file__).with_name("sandbox_init.py").read_bytes()
        digest = hashlib.sha256(source + settings.python.encode()).hexdigest()[:16]
        bin_dir = settings.state_dir / "bin"
        for d in (settings.state_dir, bin_dir, settings.state_dir / "runs"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o711)
        py = bin_dir / f"sandbox_init-{digest}.py"
        pyc = bin_dir / f"sandbox_init-{digest}.pyc"
        if not py.exists():
            _write_atomically(py, source)
        if not pyc.exists():
            tmp = pyc.with_name(f"{pyc.name}.{os.getpid()}.tmp")
            try:
                proc = subprocess.run(
                    [settings.python, "-I", "-c", _COMPILE, str(py), str(tmp)],
                    capture_output=True,
                    timeout=30,
                )
                compiled = proc.returncode == 0
            except (OSError, subprocess.SubprocessError):
                compiled = False
            if compiled:
                os.chmod(tmp, 0o644)
                os.replace(tmp, pyc)
        chosen = pyc if pyc.exists() else py
        _installed[key] = chosen
        return chosen


def _write_atomically(path: Path, content: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(content)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
