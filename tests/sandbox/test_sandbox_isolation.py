"""Identity, filesystem, fds and environment inside (FS-*, T-FD-1, OBS-2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runs.sandbox import Limits, SandboxSettings, SandboxSpec, run_in_sandbox

from .conftest import run_python


def test_inherited_fd_is_not_visible_inside(
    settings: SandboxSettings, workspace: Path
) -> None:
    fd = os.open("/etc/hostname", os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        code = "import os; print(sorted(int(x) for x in os.listdir('/proc/self/fd')))"
        r = run_python(settings, workspace, code)
    finally:
        os.close(fd)
    # 0-2 plus the fd of listdir itself
    assert r.ok and r.stdout.strip() in ("[0, 1, 2]", "[0, 1, 2, 3]")
    assert "/etc/hostname" not in r.stdout


def test_environment_holds_no_secret(
    settings: SandboxSettings, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_KEY", "django-insecure-xyz")
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db/x")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    r = run_in_sandbox(SandboxSpec(argv=["env"], workspace=workspace), settings)
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
    assert names == {"PATH", "HOME", "LANG", "TMPDIR", "PWD"}  # PWD: bwrap --chdir
    for secret in ("django-insecure-xyz", "postgres://", "sk-test"):
        assert secret not in r.stdout


def test_identity_is_unprivileged(settings: SandboxSettings, workspace: Path) -> None:
    r = run_in_sandbox(
        SandboxSpec(argv=["cat", "/proc/self/status"], workspace=workspace), settings
    )
    fields = dict(line.split(":", 1) for line in r.stdout.splitlines() if ":" in line)
    assert fields["Uid"].split() == ["65534"] * 4
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, cap
    assert fields["NoNewPrivs"].strip() == "1"


def test_system_is_read_only_and_workspace_writable(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = """
import os
for path in ("/usr/x", "/etc/x"):
    try:
        open(path, "w")
        print("wrote", path)
    except OSError as exc:
        print(path, exc.errno)
open("/workspace/ok", "w").write("1")
open("/tmp/ok", "w").write("1")
print("cwd", os.getcwd())
"""
    r = run_python(settings, workspace, code)
    assert r.ok, r.stderr
    assert "wrote" not in r.stdout
    assert "/usr/x 30" in r.stdout  # EROFS
    assert "cwd /workspace" in r.stdout
    assert (workspace / "ok").exists()


WRITE_AND_EXEC = """
import os, shutil, subprocess
for d in ("/", "/run", "/run/sandbox", "/dev", "/dev/shm", "/tmp", "/workspace"):
    path = os.path.join(d, "probe")
    try:
        shutil.copy("/usr/bin/true", path)
        os.chmod(path, 0o755)
    except OSError as exc:
        print(d, "write", exc.errno)
        continue
    try:
        print(d, "exec", subprocess.run([path]).returncode)
    except OSError as exc:
        print(d, "exec", exc.errno)
"""


def test_only_the_mapped_paths_are_writable_and_tmp_is_noexec(
    settings: SandboxSettings, workspace: Path
) -> None:
    # bubblewrap's own / (with /run) and /dev (with /dev/shm) were writable and
    # executable while the map said readonly_root and tmp_noexec.
    r = run_python(settings, workspace, WRITE_AND_EXEC)
    assert r.ok, r.stderr
    seen = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for d in ("/", "/run", "/run/sandbox", "/dev"):
        assert seen[d] == "write 30", (d, r.stdout)  # EROFS
    for d in ("/tmp", "/dev/shm"):
        assert seen[d] == "exec 13", (d, r.stdout)  # written, not executable
    assert seen["/workspace"] == "exec 0"
    e = r.enforcement
    assert e["readonly_root"] is True and e["tmp_noexec"] is True
    # The map names exactly the writable mounts (/dev/pts, /proc aside).
    assert e["writable_paths"] == ["/workspace", "/tmp", "/dev/shm"]
    assert e["noexec_paths"] == ["/tmp", "/dev/shm"]
    assert sorted(p.name for p in workspace.iterdir()) == ["probe"]


def test_dev_shm_is_a_bounded_tmpfs_for_posix_shared_memory(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = """
import multiprocessing, sys
lock = multiprocessing.Lock()  # a POSIX semaphore in /dev/shm
with lock:
    print("locked")
try:
    with open("/dev/shm/fill", "wb") as f:
        while True:
            f.write(b"x" * 65536)
except OSError as exc:
    print("full", exc.errno)
    sys.exit(0)
"""
    r = run_python(settings, workspace, code, Limits(shm_mb=4))
    assert r.stdout == "locked\nfull 28\n", r.stderr
    assert r.error == "EDISK" and "/dev/shm" in (r.detail or "")
    assert r.ok is False


def test_host_secrets_and_homes_are_absent(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = """
import os
for path in ("/root", "/work", "/home", "/var/lib/agent-sandbox-test",
             "/sys/fs/cgroup"):
    print(path, os.path.exists(path))
try:
    open("/etc/shadow").read()
    print("shadow readable")
except OSError as exc:
    print("shadow", exc.errno)
"""
    r = run_python(settings, workspace, code)
    assert "True" not in r.stdout, r.stdout
    assert "shadow 13" in r.stdout  # EACCES: the uid drop is real, not a mapped root


def test_only_the_sandbox_processes_are_visible(
    settings: SandboxSettings, workspace: Path
) -> None:
    code = (
        "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    r = run_python(settings, workspace, code)
    assert r.stdout.strip() == "[1, 2]"  # the init and the workload


def test_argv_is_not_a_shell(settings: SandboxSettings, workspace: Path) -> None:
    r = run_in_sandbox(
        SandboxSpec(argv=["echo", "a; touch pwned $(id)"], workspace=workspace),
        settings,
    )
    assert r.stdout == "a; touch pwned $(id)\n"
    assert not (workspace / "pwned").exists()


ORPHANS = """
import os, time
if os.fork() == 0:           # child: forks a grandchild and exits at once
    if os.fork() == 0:
        time.sleep(0.1)
        os._exit(7)          # the orphan is now a child of the init (pid 1)
    os._exit(0)
os.wait()
time.sleep(0.4)
states = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        stat = open(f"/proc/{pid}/stat").read()
        states.append(stat[stat.rindex(")") + 2])
print("".join(sorted(states)))
"""


def test_orphans_are_reaped_by_the_init(
    settings: SandboxSettings, workspace: Path
) -> None:
    r = run_python(settings, workspace, ORPHANS)
    assert r.ok, r.stderr
    assert "Z" not in r.stdout  # no zombie: the init reaped the re-parented orphan


def test_tmp_is_noexec(settings: SandboxSettings, workspace: Path) -> None:
    script = "cp /usr/bin/true /tmp/t && /tmp/t; echo rc=$?"
    r = run_in_sandbox(
        SandboxSpec(argv=["sh", "-c", script], workspace=workspace), settings
    )
    assert r.stdout == "rc=126\n" and "Permission denied" in r.stderr
