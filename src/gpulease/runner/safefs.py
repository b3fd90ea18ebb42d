"""Files beneath a directory a job can write, opened without ever following its links.

The runner (root, outside the sandbox) and the server read and write paths inside
workspaces and other job-writable directories. The job can put a symlink, a FIFO, a
device node or a huge file at any of those paths, and can swap one in between a check and
the use. So nothing here checks a path and then opens it: every path is opened one
component at a time from a trusted root directory's file descriptor with `O_NOFOLLOW`
(`openat` through `dir_fd`), and what was opened is checked with `fstat` on the open
descriptor. A link at any component, `..`, an absolute path, a file that is not regular
(opened with `O_NONBLOCK`, so a FIFO cannot block the open) or, where asked, a file with a
second hard link is refused with UnsafePath. Reads take a byte limit: a job's file sizes
are never trusted. Writes go to a new file beside the target and are renamed over it, so a
link planted at the target is replaced, never written through.

The root itself is trusted: it is a directory the runner or server chose (a workspace, a
run directory), and it may be reached through links of the operator's own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_BLOCK = 1024 * 1024


class UnsafePath(OSError):
    """A path beneath a root that is refused: a link, `..`, a non-regular file and the
    like. An OSError, so code that already copes with unreadable files copes with these."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def parts(relative: str | PurePosixPath | Path) -> list[str]:
    """The components of a relative path; UnsafePath for an absolute path or `..`."""
    text = str(relative)
    if text.startswith("/"):
        raise UnsafePath(f"{text!r} is an absolute path, not one beneath the directory")
    names = [name for name in text.split("/") if name not in ("", ".")]
    if ".." in names:
        raise UnsafePath(f"{text!r} leaves the directory with '..'")
    return names


def _open_root(root: Path | int) -> int:
    if isinstance(root, int):
        return os.dup(root)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _step(fd: int, name: str, shown: str, *, create: bool, mode: int) -> int:
    """Open directory name in the directory fd, never through a link (mkdir when create)."""
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # made meanwhile: open it then
                os.mkdir(name, mode, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePath(f"{shown} is a link or not a directory; refused") from exc
            raise
    return os.open(name, _DIR_FLAGS, dir_fd=fd)


def open_dir(
    root: Path | int,
    relative: str | PurePosixPath | Path = "",
    *,
    create: bool = False,
    mode: int = 0o755,
) -> int:
    """A descriptor of the directory root/relative, every component a real directory
    (made with mode when create). The caller closes it."""
    fd = _open_root(root)
    walked: list[str] = []
    try:
        for name in parts(relative):
            walked.append(name)
            next_fd = _step(fd, name, "/".join(walked), create=create, mode=mode)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _split(relative: str | PurePosixPath | Path) -> tuple[list[str], str]:
    names = parts(relative)
    if not names:
        raise UnsafePath("an empty path names no file")
    return names[:-1], names[-1]


def open_file(
    root: Path | int,
    relative: str | PurePosixPath | Path,
    flags: int = os.O_RDONLY,
    mode: int = 0o644,
    *,
    single_link: bool = False,
    create_dirs: bool = False,
) -> int:
    """A descriptor of the regular file root/relative opened with flags (O_CREAT allowed),
    never through a link and never blocking on a FIFO. single_link: also refuse a file
    with another hard link (one that may be someone else's file under a second name)."""
    directories, name = _split(relative)
    parent = open_dir(root, "/".join(directories), create=create_dirs)
    try:
        fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{relative} is a symbolic link; refused") from exc
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO or socket; a directory
            raise UnsafePath(f"{relative} is not a regular file; refused") from exc
        raise
    finally:
        os.close(parent)
    return _checked(fd, relative, single_link, "is not a regular file")


@contextlib.contextmanager
def opened_file(
    root: Path | int, relative: str | PurePosixPath | Path, *, single_link: bool = False
) -> Iterator[int]:
    """open_file(root, relative) for reading, closed again when the block ends."""
    fd = open_file(root, relative, single_link=single_link)
    try:
        yield fd
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int, offset: int | None = None) -> bytes:
    """At most limit bytes from fd (from offset when given, else where it stands)."""
    if offset is not None:
        os.lseek(fd, offset, os.SEEK_SET)
    chunks, left = [], limit
    while left > 0 and (block := os.read(fd, min(left, _BLOCK))):
        chunks.append(block)
        left -= len(block)
    return b"".join(chunks)


def read_bytes(
    root: Path | int,
    relative: str | PurePosixPath | Path,
    *,
    limit: int,
    offset: int = 0,
    single_link: bool = False,
) -> bytes:
    """At most limit bytes of the regular file root/relative, from offset."""
    with opened_file(root, relative, single_link=single_link) as fd:
        return read_fd(fd, limit, offset)


def read_tail(
    root: Path | int,
    relative: str | PurePosixPath | Path,
    *,
    limit: int,
    single_link: bool = False,
) -> bytes:
    """The last limit bytes (or fewer) of the regular file root/relative."""
    with opened_file(root, relative, single_link=single_link) as fd:
        size = os.fstat(fd).st_size
        return read_fd(fd, limit, max(0, size - limit))


def write_replace(
    root: Path | int,
    relative: str | PurePosixPath | Path,
    data: bytes | IO[bytes],
    mode: int = 0o644,
    *,
    create_dirs: bool = True,
    mtime: float | None = None,
) -> None:
    """Make root/relative a regular file holding data (bytes, or a stream read to its end),
    modified at mtime when given: written to a fresh file beside it, then renamed over it
    (a link or FIFO there is replaced, never followed)."""
    directories, name = _split(relative)
    parent = open_dir(root, "/".join(directories), create=create_dirs)
    try:
        temporary = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, mode, dir_fd=parent
        )
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                if isinstance(data, bytes):
                    out.write(data)
                else:
                    shutil.copyfileobj(data, out, _BLOCK)
            os.fchmod(fd, mode)
            if mtime is not None:
                os.utime(fd, (mtime, mtime))
        except BaseException:
            os.unlink(temporary, dir_fd=parent)
            raise
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        os.close(parent)


def open_append(root: Path | int, relative: str | PurePosixPath | Path, mode: int = 0o600) -> int:
    """A descriptor appending to the regular file root/relative (created when absent)."""
    return open_file(root, relative, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)


def makedirs(root: Path | int, relative: str | PurePosixPath | Path, mode: int = 0o755) -> None:
    """Make root/relative and the directories above it, refusing any link on the way."""
    os.close(open_dir(root, relative, create=True, mode=mode))


def lstat(root: Path | int, relative: str | PurePosixPath | Path) -> os.stat_result | None:
    """What is at root/relative, the last component not followed; None when nothing is.
    The directories above it must be real directories (UnsafePath otherwise)."""
    directories, name = _split(relative)
    try:
        parent = open_dir(root, "/".join(directories))
    except FileNotFoundError:
        return None
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)


@dataclass(frozen=True)
class Entry:
    """A regular file found by walk(): its path relative to the walk's root, the open
    descriptor of its directory (valid during that step of the walk only) and its name
    in there, and its lstat."""

    relative: str
    dir_fd: int
    name: str
    stat: os.stat_result


def walk(
    root: Path | int, relative: str | PurePosixPath | Path = "", *, dirs: list[str] | None = None
) -> Iterator[Entry]:
    """Every regular file beneath root/relative, never descending through a link (a
    directory swapped for a link while walking is skipped: os.fwalk compares what it
    opened with what it listed). Links, FIFOs and other special files are not yielded.
    With dirs, the relative path of every directory walked into ('.' first) is appended."""
    top = open_dir(root, relative)
    try:
        for directory, _dirs, files, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            base = PurePosixPath(directory)
            if dirs is not None:
                dirs.append(directory)
            for name in sorted(files):
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    yield Entry(str(base / name), dir_fd, name, info)
    finally:
        os.close(top)


def open_entry(entry: Entry, *, single_link: bool = False) -> int:
    """Open a file walk() yielded for reading; UnsafePath when it is no longer the regular
    file that was listed (swapped for a link, a FIFO or another file since)."""
    try:
        fd = os.open(entry.name, os.O_RDONLY | _FILE_FLAGS, dir_fd=entry.dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{entry.relative} became a symbolic link; refused") from exc
        raise
    listed = (entry.stat.st_dev, entry.stat.st_ino)
    return _checked(fd, entry.relative, single_link, "changed while it was read", listed)


def _checked(
    fd: int,
    relative: object,
    single_link: bool,
    refusal: str,
    same_as: tuple[int, int] | None = None,
) -> int:
    """fd when it is a regular file (the one at same_as = (st_dev, st_ino), if given) with a
    single link where single_link asks for it; else fd is closed and UnsafePath says why."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (
            same_as is not None and (info.st_dev, info.st_ino) != same_as
        ):
            raise UnsafePath(f"{relative} {refusal}; refused")
        if single_link and info.st_nlink > 1:
            raise UnsafePath(f"{relative} has {info.st_nlink} hard links; refused")
    except BaseException:
        os.close(fd)
        raise
    return fd


def connect_unix(sock: socket.socket, path: str | Path) -> None:
    """Connect sock to the unix socket at path, whose last component lies in a directory
    the job can write (JupyterLab's): a link there would make the runner connect wherever
    it points (another instance's socket), so the socket itself is opened O_PATH without
    following it, checked to be a socket, and connected to through its descriptor (which
    also lifts sun_path's 108-byte limit on the path)."""
    directory, name = os.path.split(str(path))
    parent = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise UnsafePath(f"{path} is not a socket (a link or another file); refused")
        sock.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
