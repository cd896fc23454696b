"""The per-run cgroup: aggregate memory, pids and CPU limits, whole-tree kill, counters.

Two layouts are handled (spec §6):
- v2-unified: one directory under /sys/fs/cgroup with memory/pids/cpu controllers;
- hybrid (this host): the v1 `pids`, `memory` and `cpu` hierarchies for the limits, plus
  a directory in the cgroup2 mount at /sys/fs/cgroup/unified whose core files give
  `cgroup.kill` and `cgroup.events populated` even though no v2 controller is there.

The runner creates every directory before the workload starts; the launcher
(sandbox_launch.c) clones the sandbox into the cgroup2 directory and has it join each
v1 hierarchy before it execs bubblewrap, so nothing the workload forks can be born
outside the cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

CgroupMode = Literal["v2-unified", "hybrid", "v1", "none"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("pids", "memory", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLayout:
    """Where the cgroup hierarchies of this host are mounted."""

    mode: CgroupMode
    v2_root: Path | None = None  # /sys/fs/cgroup or /sys/fs/cgroup/unified
    v2_controllers: frozenset[str] = frozenset()
    v1_roots: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT) -> CgroupLayout:
        if (root / "cgroup.controllers").exists():
            controllers = frozenset((root / "cgroup.controllers").read_text().split())
            return cls(mode="v2-unified", v2_root=root, v2_controllers=controllers)
        v1 = {
            c: root / c for c in V1_CONTROLLERS if (root / c / "cgroup.procs").exists()
        }
        unified = root / "unified"
        if (unified / "cgroup.procs").exists():
            controllers = frozenset(
                (unified / "cgroup.controllers").read_text().split()
            )
            return cls(
                mode="hybrid", v2_root=unified, v2_controllers=controllers, v1_roots=v1
            )
        if v1:
            return cls(mode="v1", v1_roots=v1)
        return cls(mode="none")

    def group_dirs(self, group: str) -> list[Path]:
        dirs = [self.v1_roots[c] / group for c in sorted(self.v1_roots)]
        if self.v2_root is not None:
            dirs.append(self.v2_root / group)
        return dirs


@dataclass
class RunCgroup:
    """The cgroup directories of one run (one per hierarchy) and what they enforce."""

    layout: CgroupLayout
    name: str
    dirs: dict[str, Path]  # "v2" or a v1 controller name -> directory
    applied: dict[str, bool]
    # pids.events, kept open while the run is watched: re-read every tick.
    _pids_events: int | None = field(default=None, init=False, repr=False)

    @classmethod
    def create(
        cls,
        layout: CgroupLayout,
        group: str,
        name: str,
        *,
        memory_bytes: int | None,
        pids: int | None,
        cpu_quota: float | None,
    ) -> RunCgroup:
        run = cls.make(layout, group, name)
        try:
            run.apply_limits(memory_bytes, pids, cpu_quota)
        except BaseException:
            run.remove(timeout=1.0)
            raise
        return run

    @classmethod
    def make(cls, layout: CgroupLayout, group: str, name: str) -> RunCgroup:
        """The run's directories, one per hierarchy, still without limits."""
        dirs: dict[str, Path] = {}
        applied = {
            "cgroup_kill": False,
            "memory_limit": False,
            "oom_group": False,
            "pids_limit": False,
            "cpu_quota": False,
        }
        run = cls(layout=layout, name=name, dirs=dirs, applied=applied)
        try:
            if layout.v2_root is not None:
                base = layout.v2_root / group
                if layout.mode == "v2-unified":
                    base.mkdir(exist_ok=True)
                    _enable_subtree(layout.v2_root, base, layout.v2_controllers)
                dirs["v2"] = _mkdir_in(base, name)
                applied["cgroup_kill"] = (dirs["v2"] / "cgroup.kill").exists()
            for controller in V1_CONTROLLERS:
                if (
                    controller in layout.v2_controllers
                    or controller not in layout.v1_roots
                ):
                    continue
                base = layout.v1_roots[controller] / group
                dirs[controller] = _mkdir_in(base, name)
        except BaseException:
            run.remove(timeout=1.0)
            raise
        return run

    def _dir_for(self, controller: str) -> Path | None:
        if controller in self.layout.v2_controllers and "v2" in self.dirs:
            return self.dirs["v2"]
        return self.dirs.get(controller)

    def _is_v2(self, controller: str) -> bool:
        return controller in self.layout.v2_controllers and "v2" in self.dirs

    def apply_limits(
        self, memory_bytes: int | None, pids: int | None, cpu_quota: float | None
    ) -> None:
        mem = self._dir_for("memory")
        if memory_bytes is not None and mem is not None:
            if self._is_v2("memory"):
                _write(f"{mem}/memory.max", str(memory_bytes))
                _write_optional(f"{mem}/memory.swap.max", "0")
                self.applied["oom_group"] = _write_optional(
                    f"{mem}/memory.oom.group", "1"
                )
            else:
                _write(f"{mem}/memory.limit_in_bytes", str(memory_bytes))
                # memsw bounds memory+swap so a hog cannot spill into swap.
                _write_optional(f"{mem}/memory.memsw.limit_in_bytes", str(memory_bytes))
            self.applied["memory_limit"] = True
        pids_dir = self._dir_for("pids")
        if pids is not None and pids_dir is not None:
            _write(f"{pids_dir}/pids.max", str(pids))
            self.applied["pids_limit"] = True
        cpu = self._dir_for("cpu")
        if cpu_quota is not None and cpu is not None:
            quota = max(1000, int(cpu_quota * CPU_PERIOD_US))
            if self._is_v2("cpu"):
                _write(f"{cpu}/cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                _write(f"{cpu}/cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(f"{cpu}/cpu.cfs_quota_us", str(quota))
            self.applied["cpu_quota"] = True

    def attach(self, pid: int) -> None:
        """Move one process into every hierarchy of the run (v1 first, v2 last)."""
        for path in self.procs_files:
            _write(path, str(pid))

    def holds(self, pids: list[int]) -> bool:
        """True if every hierarchy of the run lists every one of `pids`."""
        wanted = set(pids)
        return all(wanted <= set(_procs(d)) for d in self.dirs.values())

    @property
    def procs_files(self) -> list[str]:
        """Every cgroup.procs the launcher must join, v1 first, v2 last."""
        order = sorted(k for k in self.dirs if k != "v2") + (
            ["v2"] if "v2" in self.dirs else []
        )
        return [f"{self.dirs[k]}/cgroup.procs" for k in order]

    @property
    def v2_dir(self) -> Path | None:
        """The run's cgroup2 directory, which the launcher clones the sandbox into."""
        return self.dirs.get("v2")

    @property
    def tasks_files(self) -> list[str]:
        """The v1 `tasks` files the launcher's child writes "0" to (itself)."""
        return [f"{self.dirs[k]}/tasks" for k in sorted(self.dirs) if k != "v2"]

    def pids_limit_hit(self) -> bool:
        """True once the pids controller has refused a fork (cheap; polled)."""
        pids_dir = self._dir_for("pids")
        if pids_dir is None:
            return False
        try:
            if self._pids_events is None:
                self._pids_events = os.open(
                    f"{pids_dir}/pids.events", os.O_RDONLY | os.O_CLOEXEC
                )
            text = os.pread(self._pids_events, 4096, 0).decode()
        except OSError:
            return False
        return _parse_keyed(text).get("max", 0) > 0

    def counters(self) -> dict[str, int]:
        """Event counters first, then current values (CG-R1)."""
        out: dict[str, int] = {}
        mem = self._dir_for("memory")
        if mem is not None:
            if self._is_v2("memory"):
                events = _keyed(f"{mem}/memory.events")
                out["oom_kill"] = events.get("oom_kill", 0)
                out["memory_max_events"] = events.get("max", 0)
                peak = _read_int(f"{mem}/memory.peak")
            else:
                out["oom_kill"] = _keyed(f"{mem}/memory.oom_control").get("oom_kill", 0)
                out["memory_max_events"] = _read_int(f"{mem}/memory.failcnt") or 0
                peak = _read_int(f"{mem}/memory.max_usage_in_bytes")
            if peak is not None:
                out["memory_peak_bytes"] = peak
        pids_dir = self._dir_for("pids")
        if pids_dir is not None:
            out["pids_max_events"] = _keyed(f"{pids_dir}/pids.events").get("max", 0)
            peak = _read_int(f"{pids_dir}/pids.peak")
            if peak is not None:
                out["pids_peak"] = peak
        cpu = self._dir_for("cpu")
        if cpu is not None:
            out["cpu_nr_throttled"] = _keyed(f"{cpu}/cpu.stat").get("nr_throttled", 0)
        if "v2" in self.dirs:
            usage = _keyed(f"{self.dirs['v2']}/cpu.stat").get("usage_usec")
            if usage is not None:
                out["cpu_usage_usec"] = usage
        return out

    def populated(self) -> bool:
        if "v2" in self.dirs:
            return _keyed(f"{self.dirs['v2']}/cgroup.events").get("populated", 0) == 1
        return any(_procs(d) for d in self.dirs.values())

    def kill(self) -> str:
        """Kill every process of the run, setsid escapees too; return the method."""
        if "v2" in self.dirs and _write_optional(f"{self.dirs['v2']}/cgroup.kill", "1"):
            return "cgroup.kill"
        # No cgroup.kill: SIGKILL everything listed, repeatedly, until nothing is left;
        # a pid namespace under bubblewrap means nothing can fork faster than we kill.
        for _ in range(50):
            pids = {p for d in self.dirs.values() for p in _procs(d)}
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        return "procs-sigkill"

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while self.populated():
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def remove(self, timeout: float = 2.0) -> bool:
        """rmdir every directory, retrying EBUSY while v1 counters lag (§6.3 #7)."""
        if self._pids_events is not None:
            os.close(self._pids_events)
            self._pids_events = None
        deadline = time.monotonic() + timeout
        ok = True
        for key in list(self.dirs):
            path = self.dirs[key]
            delay = 0.0002
            while True:
                try:
                    path.rmdir()
                    del self.dirs[key]
                    break
                except FileNotFoundError:
                    del self.dirs[key]
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                        ok = False
                        break
                    time.sleep(delay)
                    delay = min(delay * 2, 0.02)
        return ok


def remove_cgroup_dir(path: Path, timeout: float = 2.0) -> bool:
    """Kill and remove one stray cgroup directory (used by the janitor)."""
    kill_file = path / "cgroup.kill"
    if kill_file.exists():
        _write_optional(kill_file, "1")
    else:
        for pid in _procs(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
            for pid in _procs(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)


def _enable_subtree(root: Path, base: Path, controllers: frozenset[str]) -> None:
    wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in controllers)
    if wanted:
        _write_optional(root / "cgroup.subtree_control", wanted)
        _write_optional(base / "cgroup.subtree_control", wanted)


def _mkdir_in(base: Path, name: str) -> Path:
    """mkdir base/name, creating the group directory `base` only when missing (a
    run pays one mkdir, not an EEXIST probe per hierarchy)."""
    path = base / name
    try:
        path.mkdir()
    except FileNotFoundError:
        base.mkdir(exist_ok=True)
        path.mkdir()
    return path


# Control files are read and written with bare os calls on string paths: they are
# tiny, and a run touches a dozen of them, where open()'s buffered text layer and
# pathlib's joins cost more than the kernel does.
def _write(path: str | Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str | Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _write_optional(path: str | Path, value: str) -> bool:
    try:
        _write(path, value)
        return True
    except OSError:
        return False


def _read_int(path: str | Path) -> int | None:
    try:
        return int(_read(path).strip())
    except (OSError, ValueError):
        return None


def _keyed(path: str | Path) -> dict[str, int]:
    try:
        return _parse_keyed(_read(path))
    except OSError:
        return {}


def _parse_keyed(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def _procs(path: str | Path) -> list[int]:
    try:
        return [int(x) for x in _read(f"{path}/cgroup.procs").split()]
    except OSError:
        return []
