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

The launcher (`sandbox_launch.c`, see its header) is built the same way into
`bin/sandbox_launch-<digest>`; without it the runner falls back to setpriv and to
moving the starting sandbox into its cgroups itself.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .spec import SandboxSettings

_lock = threading.Lock()
_installed: dict[tuple[str, str, str], Path] = {}
_c_failed: set[tuple[str, str, str]] = set()
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
    if (
        compiler is None
        or ("sandbox_init", str(settings.state_dir), compiler) in _c_failed
    ):
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


def install_launcher(settings: SandboxSettings) -> Path | None:
    """The compiled launcher (sandbox_launch.c), or None without a C compiler.

    Without it the runner moves the starting sandbox into its cgroups itself."""
    compiler = c_compiler()
    if compiler is None:
        return None
    return _install_c(settings, compiler, "sandbox_launch", _check_launcher)


def _install_c(
    settings: SandboxSettings,
    compiler: str,
    program: str = "sandbox_init",
    check: Callable[[Path], bool] | None = None,
) -> Path | None:
    key = (str(settings.state_dir), compiler)
    with _lock:
        cached = _installed.get((program, *key))
        if cached is not None and cached.exists():
            return cached
        if (program, *key) in _c_failed:
            return None
        source_path = Path(__file__).with_name(f"{program}.c")
        source = source_path.read_bytes()
        digest = hashlib.sha256(source + b"\0" + compiler.encode()).hexdigest()[:16]
        binary = _bin_dir(settings) / f"{program}-{digest}"
        if not binary.exists():
            tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
            try:
                built = any(
                    _compile_c(compiler, source_path, tmp, static, check or _check_init)
                    for static in (True, False)
                )
                if built:
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, binary)
            finally:
                tmp.unlink(missing_ok=True)
        if not binary.exists():
            _c_failed.add((program, *key))
            return None
        _installed[(program, *key)] = binary
        return binary


def _compile_c(
    compiler: str, source: Path, out: Path, static: bool, check: Callable[[Path], bool]
) -> bool:
    """Build one C program and check that it works."""
    argv = [compiler, *_CFLAGS, *(["-static"] if static else []), "-o", str(out)]
    try:
        proc = subprocess.run(
            [*argv, str(source)],
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and check(out)


def _check_init(binary: Path) -> bool:
    """The init runs a command and reports its status."""
    return b'"si_code":1,"si_status":0' in _run_with_status_fd(
        binary, lambda fd: [f"status={fd},core=0:0", "--", "true"]
    )


def _check_launcher(binary: Path) -> bool:
    """The launcher runs a command (no cgroup here) and reports nothing."""
    return (
        _run_with_status_fd(binary, lambda fd: ["--status", str(fd), "--", "true"])
        == b""
    )


def _run_with_status_fd(binary: Path, args: Callable[[int], list[str]]) -> bytes:
    """Run `binary` with a status pipe; its record, or b"!" if it did not exit 0."""
    status_r, status_w = os.pipe()
    try:
        check = subprocess.run(
            [str(binary), *args(status_w)],
            pass_fds=(status_w,),
            capture_output=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        os.close(status_w)
        status_w = -1
        record = os.read(status_r, 4096)
    except (OSError, subprocess.SubprocessError):
        return b"!"
    finally:
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)
    return record if check.returncode == 0 else b"!"


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
