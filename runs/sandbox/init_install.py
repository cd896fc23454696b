"""Install the in-sandbox init where the sandbox uid can read it, ready to run.

The repository may not be readable by the sandbox uid, so the init is installed into
the state directory. Two inits exist:

- `sandbox_init.c`, compiled once with the host's C compiler (`cc -O2 -static`, or
  dynamic if static linking fails) into `bin/sandbox_init-<digest>`, the digest
  covering the source and the compiler path. It starts in well under a millisecond,
  where any Python interpreter costs more than a whole raw bubblewrap start. Used
  whenever a compiler is present, the run needs no network bridge and
  `settings.init` is not "python".
- `sandbox_init.py`, compiled to a .pyc by the very interpreter that will run it
  (the .pyc's magic number matches that interpreter by construction; if compiling
  fails, the plain source is used). Used for network allowlists (the bridge lives
  only there), without a compiler, or when the C build fails.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from .spec import SandboxSettings

_lock = threading.Lock()
_installed: dict[tuple[str, str, str], Path] = {}
_c_failed: set[tuple[str, str]] = set()
_COMPILE = (
    "import py_compile, sys; "
    "py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"
)
_CFLAGS = ("-O2", "-Wall", "-Werror")


@dataclass(frozen=True)
class InstalledInit:
    path: Path
    kind: str  # "c" or "python"


@functools.cache
def c_compiler() -> str | None:
    """The host's C compiler (`cc`, else `gcc`), resolved; None when there is none.

    Looked up once per process: a run must not pay a PATH search."""
    for name in ("cc", "gcc"):
        found = shutil.which(name)
        if found:
            return os.path.realpath(found)
    return None


def planned_init_kind(settings: SandboxSettings, *, bridge: bool) -> str:
    """The init a run will use, before anything is installed."""
    if bridge or settings.init == "python":
        return "python"
    compiler = c_compiler()
    if compiler is None or (str(settings.state_dir), compiler) in _c_failed:
        return "python"
    return "c"


def install_init(settings: SandboxSettings, *, bridge: bool = False) -> InstalledInit:
    """Return the init to run: the C one where possible, else the Python one."""
    if planned_init_kind(settings, bridge=bridge) == "c":
        compiler = c_compiler()
        assert compiler is not None
        path = _install_c(settings, compiler)
        if path is not None:
            return InstalledInit(path, "c")
    return InstalledInit(_install_python(settings), "python")


def _bin_dir(settings: SandboxSettings) -> Path:
    bin_dir = settings.state_dir / "bin"
    for d in (settings.state_dir, bin_dir, settings.state_dir / "runs"):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o711)
    return bin_dir


def _install_c(settings: SandboxSettings, compiler: str) -> Path | None:
    key = (str(settings.state_dir), compiler)
    with _lock:
        cached = _installed.get(("c", *key))
        if cached is not None and cached.exists():
            return cached
        if key in _c_failed:
            return None
        source_path = Path(__file__).with_name("sandbox_init.c")
        source = source_path.read_bytes()
        digest = hashlib.sha256(source + b"\0" + compiler.encode()).hexdigest()[:16]
        binary = _bin_dir(settings) / f"sandbox_init-{digest}"
        if not binary.exists():
            tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
            try:
                built = any(
                    _compile_c(compiler, source_path, tmp, static)
                    for static in (True, False)
                )
                if built:
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, binary)
            finally:
                tmp.unlink(missing_ok=True)
        if not binary.exists():
            _c_failed.add(key)
            return None
        _installed[("c", *key)] = binary
        return binary


def _compile_c(compiler: str, source: Path, out: Path, static: bool) -> bool:
    """Build the C init and check that it runs a command and reports its status."""
    argv = [compiler, *_CFLAGS, *(["-static"] if static else []), "-o", str(out)]
    try:
        proc = subprocess.run(
            [*argv, str(source)],
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            return False
        status_r, status_w = os.pipe()
        try:
            check = subprocess.run(
                [str(out), f"status={status_w},core=0:0", "--", "true"],
                pass_fds=(status_w,),
                capture_output=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
            )
            os.close(status_w)
            status_w = -1
            record = os.read(status_r, 4096)
        finally:
            os.close(status_r)
            if status_w >= 0:
                os.close(status_w)
    except (OSError, subprocess.SubprocessError):
        return False
    return check.returncode == 0 and b'"si_code":1,"si_status":0' in record


def _install_python(settings: SandboxSettings) -> Path:
    """The Python init (a .pyc where possible) inside the state dir."""
    key = ("python", str(settings.state_dir), settings.python)
    with _lock:
        cached = _installed.get(key)
        if cached is not None and cached.exists():
            return cached
        source = Path(__file__).with_name("sandbox_init.py").read_bytes()
        digest = hashlib.sha256(source + settings.python.encode()).hexdigest()[:16]
        bin_dir = _bin_dir(settings)
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
