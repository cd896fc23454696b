"""Open or check a tool-supplied path beneath the workspace only (FS-6..FS-10).

The kernel's resolver is the boundary:
`openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` on a directory fd of the workspace,
so check and use are the same fd and a symlink swapped in during the call cannot
redirect it. `..`, absolute paths and NUL are refused
by name first, which gives a clear detail; an escaping symlink (EXDEV) or a magic link
such as /proc/self/fd/N (ELOOP) is refused by the kernel. A refusal is `EPATH`: the
tool call ends, it is not "file not found" (which an agent would retry).
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

_SYS_OPENAT2 = 437  # x86_64 and aarch64 share this number
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08


class PathRefused(Exception):
    """The path is not beneath the workspace (error code EPATH)."""

    error = "EPATH"

    def __init__(self, given: str, reason: str, root: str) -> None:
        self.given = given
        self.reason = reason
        self.root = root
        super().__init__(f"{given} -> {reason} (outside {root})")

    @property
    def detail(self) -> str:
        return str(self)


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_openat2_missing = False


def _openat2(dirfd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    fd = int(
        _libc.syscall(
            _SYS_OPENAT2,
            ctypes.c_int(dirfd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _lexical_check(root: str, rel: str) -> None:
    if "\x00" in rel:
        raise PathRefused(rel, "contains NUL", root)
    if rel == "" or rel.startswith("/"):
        raise PathRefused(rel, "absolute or empty path", root)
    if ".." in rel.split("/"):
        raise PathRefused(rel, "'..' component", root)


def open_beneath(
    root: str | Path, rel: str, flags: int = os.O_RDONLY, mode: int = 0o644
) -> int:
    """Open `rel` beneath `root` and return the fd; raises PathRefused (EPATH)."""
    root_s = str(root)
    _lexical_check(root_s, rel)
    dirfd = os.open(root_s, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_at(dirfd, root_s, rel, flags, mode)
    finally:
        os.close(dirfd)


def _open_at(dirfd: int, root: str, rel: str, flags: int, mode: int) -> int:
    global _openat2_missing
    if not _openat2_missing:
        for _ in range(8):
            try:
                return _openat2(
                    dirfd, rel, flags, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS
                )
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    continue  # a concurrent rename raced the resolution: retry (FS-8)
                if exc.errno == errno.EXDEV:
                    raise PathRefused(
                        rel, "resolves outside the workspace", root
                    ) from None
                if exc.errno == errno.ELOOP:
                    raise PathRefused(rel, "magic link or symlink loop", root) from None
                if exc.errno == errno.ENOSYS:
                    _openat2_missing = True
                    break
                raise
        else:
            raise OSError(errno.EAGAIN, "openat2 kept racing", rel)
    return _walk_nofollow(dirfd, root, rel, flags, mode)


def _walk_nofollow(dirfd: int, root: str, rel: str, flags: int, mode: int) -> int:
    """Fallback for kernels without openat2: one component at a time, no symlinks."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    current = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(
                    part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current
                )
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathRefused(rel, "symlink in path", root) from None
                raise
            os.close(current)
            current = nxt
        try:
            return os.open(
                parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=current
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathRefused(rel, "symlink in path", root) from None
            raise
    finally:
        os.close(current)


def check_path(root: str | Path, rel: str) -> None:
    """Refuse (PathRefused) unless `rel` resolves beneath `root`; a missing path is
    judged by its deepest existing ancestor, since the command may create it."""
    root_s = str(root)
    _lexical_check(root_s, rel)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    while parts:
        try:
            os.close(open_beneath(root_s, "/".join(parts), os.O_PATH))
            return
        except FileNotFoundError:
            parts.pop()
        except NotADirectoryError:
            return  # cannot escape through a non-directory; the command will fail
