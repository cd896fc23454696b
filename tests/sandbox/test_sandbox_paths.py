"""Path guard (T-PATH-1/2, T-RUN-5): refusals are EPATH, before anything runs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from runs.sandbox import (
    PathRefused,
    SandboxSettings,
    SandboxSpec,
    check_path,
    open_beneath,
    run_in_sandbox,
)


@pytest.fixture
def tree(workspace: Path) -> Path:
    (workspace / "a.txt").write_text("inside")
    (workspace / "sub").mkdir()
    os.symlink("/etc/passwd", workspace / "link_out")
    os.symlink("a.txt", workspace / "link_in")
    os.symlink("/proc/self/fd/0", workspace / "fd_link")
    os.symlink("../..", workspace / "sub" / "up")
    return workspace


@pytest.mark.parametrize(
    "rel",
    [
        "../outside.txt",
        "/etc/passwd",
        "link_out",
        "fd_link",
        "sub/up/etc/passwd",
        "/proc/self/fd/3",
        "sub/../../x",
        "",
        "a\x00b",
        "/workspace/a.txt",
    ],
)
def test_escapes_are_refused(tree: Path, rel: str) -> None:
    with pytest.raises(PathRefused) as info:
        check_path(tree, rel)
    assert info.value.error == "EPATH"


@pytest.mark.parametrize(
    "rel", ["a.txt", "link_in", "sub", "sub/new.txt", "new/dir/file"]
)
def test_paths_beneath_are_allowed(tree: Path, rel: str) -> None:
    check_path(tree, rel)


def test_open_beneath_reads_through_fd(tree: Path) -> None:
    fd = open_beneath(tree, "link_in")
    try:
        assert os.read(fd, 100) == b"inside"
    finally:
        os.close(fd)
    with pytest.raises(PathRefused):
        open_beneath(tree, "link_out")


def test_symlink_swapped_during_open_never_yields_outside(tree: Path) -> None:
    stop = threading.Event()
    link = tree / "race"

    def flip() -> None:
        while not stop.is_set():
            for target in ("a.txt", "/etc/passwd"):
                tmp = tree / "race.tmp"
                try:
                    os.symlink(target, tmp)
                    os.replace(tmp, link)
                except FileExistsError:
                    os.unlink(tmp)

    flipper = threading.Thread(target=flip)
    flipper.start()
    seen = set()
    try:
        for _ in range(500):
            try:
                fd = open_beneath(tree, "race")
            except (PathRefused, FileNotFoundError):
                seen.add("refused")
                continue
            try:
                seen.add(os.read(fd, 100).decode())
            finally:
                os.close(fd)
    finally:
        stop.set()
        flipper.join()
    assert seen <= {"inside", "refused"}


def test_escaping_path_refused_before_anything_runs(
    settings: SandboxSettings, tree: Path
) -> None:
    spec = SandboxSpec(
        argv=["touch", "ran.txt"], workspace=tree, paths=["a.txt", "../escape.py"]
    )
    r = run_in_sandbox(spec, settings)
    assert (r.ok, r.exit_code, r.error, r.termination_cause) == (
        False,
        None,
        "EPATH",
        "path_refused",
    )
    assert "../escape.py" in r.detail
    assert not (tree / "ran.txt").exists()  # the command never ran
