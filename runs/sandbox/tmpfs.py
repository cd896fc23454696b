"""The run's /tmp and /dev/shm, and a workspace: size-limited tmpfs mounts the
runner makes (bubblewrap binds the first two in).

bubblewrap 0.8's own `--tmpfs` cannot be `noexec` (FS-3), and it vanishes with the
sandbox, so the runner could not tell afterwards whether it filled up. A tmpfs
mounted by the runner fixes both: `noexec,nosuid,nodev` carry over to the bind mount
and are locked inside the sandbox's user namespace, and after the run the runner can
read its usage and list the largest files as evidence (DK-2) before unmounting it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MNT_DETACH = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class TmpfsUsage:
    size_bytes: int
    avail_bytes: int
    largest: list[tuple[str, int]]  # (path inside /tmp, bytes), biggest first


def mount_tmpfs(
    target: Path,
    size_bytes: int,
    *,
    make_dir: bool = True,
    noexec: bool = True,
    mode: int = 0o1777,
    owner: tuple[int, int] | None = None,
) -> None:
    """Mount a `nosuid,nodev` (and by default `noexec`) tmpfs of `size_bytes` at
    `target`; `make_dir=False`: the mount point exists already (a prepared run
    directory). `owner` (uid, gid) owns its root."""
    if make_dir:
        target.mkdir(mode=0o700)
    options = f"size={size_bytes},mode={mode:o}"
    if owner is not None:
        options += f",uid={owner[0]},gid={owner[1]}"
    flags = _MS_NOSUID | _MS_NODEV | (_MS_NOEXEC if noexec else 0)
    rc = _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode())
    if rc != 0:
        err = ctypes.get_errno()
        target.rmdir()
        raise OSError(err, f"mount tmpfs: {os.strerror(err)}", str(target))


def unmount_tmpfs(target: Path) -> None:
    """Detach and remove the mount point; quiet if it is already gone."""
    detach(target)
    with contextlib.suppress(FileNotFoundError):
        target.rmdir()


def detach(target: Path) -> bool:
    """Lazily unmount `target`; False if it was not a mount point (or is gone)."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
            raise OSError(err, f"umount: {os.strerror(err)}", str(target))
        return False
    return True


def tmpfs_usage(
    target: Path,
    top: int = 5,
    *,
    walk_below: int | None = None,
    inside: str = "/tmp",
) -> TmpfsUsage:
    """Size, room left and the largest files (never following symlinks).

    With `walk_below`, the files are listed only when less than that many bytes
    are left: they are evidence for a full /tmp, not worth a walk otherwise."""
    st = os.statvfs(target)
    files: list[tuple[str, int]] = []
    if walk_below is not None and st.f_bavail * st.f_frsize >= walk_below:
        return TmpfsUsage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, [])
    for dirpath, _dirnames, filenames in os.walk(target):
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                size = os.lstat(path).st_size
            except OSError:
                continue
            files.append((f"{inside}/" + os.path.relpath(path, target), size))
    files.sort(key=lambda item: item[1], reverse=True)
    return TmpfsUsage(
        size_bytes=st.f_blocks * st.f_frsize,
        avail_bytes=st.f_bavail * st.f_frsize,
        largest=files[:top],
    )
