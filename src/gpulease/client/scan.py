"""Scanning a directory to push: every file's path and stat, and what is refused.

The scan is all an unchanged re-push does per file, so it imports nothing of the HTTP
client or the wire models: the CLI's quick path for an unchanged push (cli/entry.py)
scans with it and compares the scan with the push index alone.
"""

from __future__ import annotations

import array
import os
import stat
import struct
from collections.abc import Sequence
from functools import partial
from itertools import chain
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import NamedTuple

from gpulease.client.errors import ClientError
from gpulease.client.push_index import STAT_FIELDS, FileStat, scan_digest
from gpulease.core.datasets import MAX_PATH_CHARS, path_problem
from gpulease.storage.chunking import without_cyclic_gc


class DatasetError(ClientError):
    """A directory that cannot be pushed as it is: a path, link or file type is refused."""


class LocalFile(NamedTuple):  # a tuple: 100,000 of them are made per scan
    path: str  # inside the dataset: relative, '/'-separated
    source: str  # where it is read from
    size: int
    stat: FileStat | None = None  # as scanned: the push index's key


def _refuse(root: Path, relative: str, why: str) -> DatasetError:
    return DatasetError(f"cannot push {root / relative}: {why}")


def scan_directory(root: Path) -> list[LocalFile]:
    """The files under root, sorted by path. Refuses (DatasetError, naming the file) paths
    with control characters or that are not UTF-8, links that lead outside root or to a
    directory, and anything that is not a regular file. A link to a file inside root is
    pushed as a copy of that file."""
    return scan_tree(root).files()


class _Directory(NamedTuple):
    """The files of one scanned directory (not those of its subdirectories)."""

    prefix: str  # inside the dataset: '' or 'a/b/'
    path: str  # where it is read from
    names: list[str]  # sorted
    # a FileStat's five fields, name after name, in one flat array of 64-bit integers (a
    # plain list where a number does not fit one): no object per file for the collector
    stats: Sequence[int]


class ScannedTree:
    """A scanned directory tree, kept as it was read: a list of names and an array of
    stats per directory, no object per file. What an unchanged re-push needs (the count,
    the size, the scan digest) comes from those; files() builds the sorted LocalFile list
    only for a push that goes on."""

    def __init__(self, directories: list[_Directory]) -> None:
        self.directories = sorted(directories, key=_first)
        self.count = sum(len(d.names) for d in self.directories)
        self.size = sum(sum(d.stats[0::STAT_FIELDS]) for d in self.directories)
        self._digest: tuple[str, int] | None = None

    def digest(self) -> tuple[str, int]:
        """scan_digest() of every path and stat, directory by directory (once)."""
        if self._digest is None:
            self._digest = scan_digest((d.prefix, d.names, d.stats) for d in self.directories)
        return self._digest

    def files(self) -> list[LocalFile]:
        """Every file, sorted by path."""
        found = []
        with without_cyclic_gc():
            for prefix, path, names, stats in self.directories:
                base = path + "/"
                for at, name in enumerate(names):
                    stat = _new(FileStat, stats[at * STAT_FIELDS : (at + 1) * STAT_FIELDS])
                    found.append(_new(LocalFile, (prefix + name, base + name, stat[0], stat)))
            found.sort(key=_first)
        return found


def scan_tree(root: Path) -> ScannedTree:
    """The files under root (see scan_directory for what is refused), directory by
    directory. An unchanged re-push is nothing but this, so the work per file is done by
    C loops (map, attrgetter) over each directory's names: the Python code runs
    once a directory, and a name is checked one by one only where its directory's names,
    checked together, are not all plain."""
    if not root.is_dir():
        raise DatasetError(f"{root} is not a directory")
    top = root.resolve()
    scanned: list[_Directory] = []
    pending = [("", os.fspath(root))]
    with without_cyclic_gc():
        while pending:
            prefix, directory = pending.pop()
            found = _scan_one(root, top, prefix, directory, pending)
            if found is not None:
                scanned.append(found)
    return ScannedTree(scanned)


# A scan handed from one step of a command to the next (hand_over, taken_over).
_handed: tuple[str, tuple[int, int], ScannedTree] | None = None


def hand_over(root: Path, tree: ScannedTree) -> None:
    """Keep tree, just scanned from root, for this process's next taken_over(root). The
    CLI's quick path for an unchanged push scans the tree; when the tree has changed, the
    full push that follows in the same command takes that scan instead of scanning again
    (at 100,000 files a scan is about 0.4 s). Only the latest scan is kept."""
    global _handed
    _handed = (os.fspath(root), _identity(root), tree)


def taken_over(root: Path) -> ScannedTree | None:
    """The scan handed over for root, once; None when there is none, or root is now
    another directory than the one scanned (moved or replaced meanwhile)."""
    global _handed
    handed, _handed = _handed, None
    if handed is None or handed[0] != os.fspath(root):
        return None
    try:
        same = _identity(root) == handed[1]
    except OSError:
        return None
    return handed[2] if same else None


def _identity(root: Path) -> tuple[int, int]:
    info = os.stat(root)
    return info.st_dev, info.st_ino


def _scan_one(
    root: Path, top: Path, prefix: str, directory: str, pending: list[tuple[str, str]]
) -> _Directory | None:
    """The files of one directory; its subdirectories are added to pending. Its names are
    listed (os.listdir: no object per entry) and each lstat'ed once, which also says which
    are directories; a directory of nothing but regular files is never looped over in
    Python."""
    # names and stats through one descriptor of the directory: each lstat looks its name up
    # there, not the whole path from the root again
    fd = os.open(directory, _DIRECTORY_FLAGS)
    try:
        names = os.listdir(fd)
        names.sort()
        infos = list(map(partial(os.lstat, dir_fd=fd), names))
    finally:
        os.close(fd)
    base = directory + "/"
    linked = False
    if not all(map(S_ISREG, map(_mode, infos))):
        kept = []
        for name, info in zip(names, infos, strict=True):
            if S_ISDIR(info.st_mode):
                pending.append((prefix + name + "/", base + name))
            else:
                kept.append((name, info))
                linked = linked or S_ISLNK(info.st_mode)
        names = [name for name, _ in kept]
        infos = [info for _, info in kept]
    if not names:
        return None
    together = prefix + "".join(names)
    longest = len(prefix) + max(map(len, names))
    if not (together.isascii() and together.isprintable() and "\\" not in together) or (
        longest > MAX_PATH_CHARS
    ):
        for name in names:
            problem = path_problem(prefix + name)
            if problem:
                raise _refuse(root, prefix + name, problem)
    if linked:
        infos = [
            _linked_stat(root, top, prefix + name, base + name) if S_ISLNK(info.st_mode) else info
            for name, info in zip(names, infos, strict=True)
        ]
    if not all(map(S_ISREG, map(_mode, infos))):
        for name, info in zip(names, infos, strict=True):
            if not S_ISREG(info.st_mode):
                raise _refuse(
                    root, prefix + name, "it is not a regular file (a device, pipe or socket)"
                )
    flat = list(chain.from_iterable(map(_stat_key, infos)))
    numbers: Sequence[int]
    try:  # packed in one call: array() of an iterator appends number by number
        numbers = array.array("q", struct.pack(f"={len(flat)}q", *flat))
    except struct.error:  # an inode or device past 2**63
        numbers = flat
    return _Directory(prefix, directory, names, numbers)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_new = tuple.__new__  # NamedTuple's own __new__ is a Python function: twice a file
_first = itemgetter(0)  # a LocalFile's path, a _Directory's prefix
_mode = attrgetter("st_mode")
_stat_key = attrgetter("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")
S_ISREG = stat.S_ISREG
S_ISDIR = stat.S_ISDIR
S_ISLNK = stat.S_ISLNK


def _linked_stat(root: Path, top: Path, relative: str, path: str) -> os.stat_result:
    """The stat of the file a link inside root leads to; refuses a link to a directory,
    outside root or to nothing."""
    if os.path.isdir(path):
        raise _refuse(
            root,
            relative,
            "it is a link to a directory; links to directories are not followed "
            "(copy the directory in, or push it as a dataset of its own)",
        )
    target = Path(path).resolve()
    if not target.is_relative_to(top):
        raise _refuse(root, relative, f"it is a link to {target}, outside the directory")
    if not target.exists():
        raise _refuse(root, relative, "it is a link to nothing (a broken link)")
    return target.stat()
