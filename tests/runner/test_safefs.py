"""Opening files beneath a job-writable directory: links, `..`, FIFOs, hard links, huge
files and a link swapped in after a check are refused, and nothing outside changes."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path

import pytest

from gpulease.runner import safefs
from gpulease.runner.safefs import UnsafePath


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A file outside the workspace that no operation may read or change."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("the master key\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def untouched(canary: Path) -> bool:
    info = canary.lstat()
    return canary.read_text() == "the master key\n" and info.st_mtime_ns == 1_000_000_000


def test_a_regular_file_is_read_with_a_bound(workspace: Path) -> None:
    (workspace / "dir").mkdir()
    (workspace / "dir" / "log").write_bytes(b"0123456789")
    assert safefs.read_bytes(workspace, "dir/log", limit=4) == b"0123"
    assert safefs.read_bytes(workspace, "dir/log", limit=4, offset=8) == b"89"
    assert safefs.read_tail(workspace, "dir/log", limit=3) == b"789"
    assert safefs.read_bytes(workspace, "./dir//log", limit=100) == b"0123456789"


def test_a_huge_sparse_file_is_read_only_up_to_the_limit(workspace: Path) -> None:
    with open(workspace / "huge", "wb") as out:
        out.truncate(1 << 40)  # 1 TiB, sparse
    assert len(safefs.read_bytes(workspace, "huge", limit=1024)) == 1024
    assert len(safefs.read_tail(workspace, "huge", limit=1024)) == 1024


@pytest.mark.parametrize("relative", ["../outside/secret.txt", "/etc/passwd", "a/../../x", ""])
def test_dot_dot_absolute_and_empty_paths_are_refused(workspace: Path, relative: str) -> None:
    with pytest.raises(UnsafePath):
        safefs.read_bytes(workspace, relative, limit=100)


def test_a_link_at_the_last_component_is_refused(workspace: Path, canary: Path) -> None:
    (workspace / "log").symlink_to(canary)
    with pytest.raises(UnsafePath, match="symbolic link"):
        safefs.read_bytes(workspace, "log", limit=100)
    with pytest.raises(UnsafePath):
        safefs.open_append(workspace, "log")
    assert untouched(canary)


def test_a_link_at_a_directory_component_is_refused(workspace: Path, canary: Path) -> None:
    (workspace / "dir").symlink_to(canary.parent)
    with pytest.raises(UnsafePath, match="dir is a link"):
        safefs.read_bytes(workspace, "dir/secret.txt", limit=100)
    with pytest.raises(UnsafePath):
        safefs.write_replace(workspace, "dir/secret.txt", b"owned")
    with pytest.raises(UnsafePath):
        safefs.makedirs(workspace, "dir/new")
    assert untouched(canary)
    assert not (canary.parent / "new").exists()


def test_a_fifo_is_refused_without_blocking(workspace: Path) -> None:
    os.mkfifo(workspace / "fifo")
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.read_bytes(workspace, "fifo", limit=100)
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.open_append(workspace, "fifo")


def test_a_directory_is_not_a_file(workspace: Path) -> None:
    (workspace / "dir").mkdir()
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.read_bytes(workspace, "dir", limit=100)


def test_a_second_hard_link_is_refused_when_asked(workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-file"
    other.write_text("someone else's")
    os.link(other, workspace / "linked")
    assert safefs.read_bytes(workspace, "linked", limit=100) == b"someone else's"
    with pytest.raises(UnsafePath, match="2 hard links"):
        safefs.read_bytes(workspace, "linked", limit=100, single_link=True)


def test_write_replace_replaces_a_planted_link_instead_of_following_it(
    workspace: Path, canary: Path
) -> None:
    (workspace / "cfg").symlink_to(canary)
    safefs.write_replace(workspace, "cfg", b"mine\n", 0o600)
    assert not (workspace / "cfg").is_symlink()
    assert (workspace / "cfg").read_bytes() == b"mine\n"
    assert (workspace / "cfg").stat().st_mode & 0o777 == 0o600
    assert untouched(canary)
    assert [p.name for p in workspace.iterdir()] == ["cfg"]  # no temporary left behind


def test_write_replace_and_makedirs_create_directories(workspace: Path) -> None:
    safefs.write_replace(workspace, "a/b/c.txt", b"x")
    safefs.makedirs(workspace, "a/d/e", 0o700)
    assert (workspace / "a" / "b" / "c.txt").read_bytes() == b"x"
    assert (workspace / "a" / "d" / "e").is_dir()
    fd = safefs.open_append(workspace, "a/log")
    try:
        os.write(fd, b"one\n")
    finally:
        os.close(fd)
    assert (workspace / "a" / "log").read_bytes() == b"one\n"


def test_lstat_does_not_follow(workspace: Path, canary: Path) -> None:
    (workspace / "link").symlink_to(canary)
    info = safefs.lstat(workspace, "link")
    assert info is not None and os.path.stat.S_ISLNK(info.st_mode)
    assert safefs.lstat(workspace, "missing") is None


def test_walk_yields_regular_files_only_and_never_leaves(workspace: Path, canary: Path) -> None:
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "b" / "f").write_text("f")
    (workspace / "top").write_text("t")
    (workspace / "a" / "outside").symlink_to(canary.parent)
    (workspace / "a" / "file-link").symlink_to(canary)
    os.mkfifo(workspace / "a" / "fifo")
    found = sorted(entry.relative for entry in safefs.walk(workspace))
    assert found == ["a/b/f", "top"]


def test_a_link_swapped_in_after_the_walk_listed_a_file_is_refused(
    workspace: Path, canary: Path
) -> None:
    (workspace / "f").write_text("mine")
    for entry in safefs.walk(workspace):
        (workspace / "f").unlink()
        (workspace / "f").symlink_to(canary)
        with pytest.raises(UnsafePath):
            safefs.open_entry(entry)
    assert untouched(canary)


def test_another_file_swapped_in_after_the_walk_listed_one_is_refused(workspace: Path) -> None:
    (workspace / "f").write_text("mine")
    for entry in safefs.walk(workspace):
        (workspace / "g").write_text("other")
        os.replace(workspace / "g", workspace / "f")
        with pytest.raises(UnsafePath, match="changed"):
            safefs.open_entry(entry)


def test_racing_directory_swaps_never_reach_outside(workspace: Path, canary: Path) -> None:
    """A job swaps a real directory and a link to outside as fast as it can while the
    runner reads through it: every read either finds the job's file or is refused."""
    real = workspace / "real"
    real.mkdir()
    (real / "secret.txt").write_text("job's own\n")
    (workspace / "evil").symlink_to(canary.parent)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(workspace / "real", workspace / "tmp")
            os.rename(workspace / "evil", workspace / "real")
            os.rename(workspace / "real", workspace / "evil")
            os.rename(workspace / "tmp", workspace / "real")

    thread = threading.Thread(target=swap)
    thread.start()
    seen = set()
    try:
        for _ in range(2000):
            try:
                seen.add(safefs.read_bytes(workspace, "real/secret.txt", limit=100))
            except (UnsafePath, FileNotFoundError):
                seen.add(b"refused")
            with contextlib.suppress(UnsafePath, FileNotFoundError):
                safefs.write_replace(
                    workspace, "real/secret.txt", b"job's own\n", create_dirs=False
                )
    finally:
        stop.set()
        thread.join()
    assert seen <= {b"job's own\n", b"refused"}
    assert untouched(canary)


def test_connect_unix_refuses_a_link_to_another_socket(tmp_path: Path) -> None:
    """JupyterLab's socket lies in a directory the job writes: a link there to another
    instance's socket must not be connected to; a real socket is, however long its path."""
    other = tmp_path / "o"
    other.mkdir()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(other / "lab.sock"))
        server.listen()
        deep = tmp_path / ("d" * 120)
        deep.mkdir()
        (deep / "lab.sock").symlink_to(other / "lab.sock")
        with socket.socket(socket.AF_UNIX) as client, pytest.raises(UnsafePath):
            safefs.connect_unix(client, deep / "lab.sock")
        (deep / "lab.sock").unlink()
        (deep / "lab.sock").write_text("not a socket")
        with socket.socket(socket.AF_UNIX) as client, pytest.raises(UnsafePath):
            safefs.connect_unix(client, deep / "lab.sock")
        (deep / "lab.sock").unlink()
        os.link(other / "lab.sock", deep / "lab.sock")  # the same socket, a long path
        with socket.socket(socket.AF_UNIX) as client:
            safefs.connect_unix(client, deep / "lab.sock")
