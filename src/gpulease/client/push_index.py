"""The local push index: what each file of a pushed directory hashed to, by its stat.

Like git's index and restic's cache: a file whose (size, mtime, ctime, inode, device) are
those recorded is taken to hold the recorded chunks, so pushing an unchanged tree again
reads and hashes nothing. It is only a cache: the server still says which chunks it lacks,
and those are read again and checked against their hash before they are sent; a missing,
unreadable or corrupt index just means every file is hashed.

Beside the per-file entries it keeps one record of the whole tree as last pushed: a digest
of every path and stat, and the digest of the manifest they made (core/datasets.py). A tree
whose scan gives the same digest is, without looking at a single entry, the manifest the
server may already hold; the push is then one comparison with the server.

One SQLite file per server and dataset, under `$XDG_CACHE_HOME/gpulease/push-index/`
(`~/.cache` without it).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

# A file modified this soon before it was hashed may change again within the same timestamp
# tick (the racy-git problem): its entry is not trusted until it is hashed again later.
RACY_NS = 2_000_000_000
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    device INTEGER NOT NULL,
    hashed_ns INTEGER NOT NULL,
    chunks TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tree (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    scan TEXT NOT NULL,
    manifest TEXT NOT NULL,
    newest_ns INTEGER NOT NULL,
    hashed_ns INTEGER NOT NULL
);
"""


STAT_FIELDS = 5  # a FileStat's


class FileStat(NamedTuple):  # a tuple: 100,000 of them are made per scan
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, info: os.stat_result) -> FileStat:
        return cls(info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)

    @property
    def changed_ns(self) -> int:
        return max(self.mtime_ns, self.ctime_ns)


def scan_digest(directories: Iterable[tuple[str, Sequence[str], Sequence[int]]]) -> tuple[str, int]:
    """A digest of every path and stat of a scanned tree, and the newest change time among
    them. directories: (prefix, names, stats) for each directory, in the order given; stats
    are the FileStat fields of each name in turn, STAT_FIELDS a name, flat. A directory is
    hashed as its prefix, its names NUL-separated and its stats as one array of 64-bit
    integers: no per-file formatting, which at 100,000 files cost more than the scan's
    lstat calls. Names are never empty and hold no NUL, so a directory's names end
    unambiguously at two NULs, and its stats are 40 bytes a name."""
    digest = hashlib.sha256(b"gpulease/scan/2\0")
    newest = 0
    for prefix, names, stats in directories:
        if len(stats) != len(names) * STAT_FIELDS:
            raise ValueError(f"{len(names)} names with {len(stats)} stat fields")
        joined = "\0".join(names)
        digest.update(f"{prefix}\0{joined}\0\0".encode("utf-8", "surrogateescape"))
        if isinstance(stats, array.array) and stats.typecode == "q":
            packed = stats
        else:
            try:
                packed = array.array("q", stats)
            except OverflowError:  # an inode or device past 2**63: hashed as unsigned
                packed = array.array("Q", [n % 2**64 for n in stats])
        digest.update(packed)
        newest = max(
            newest, max(stats[1::STAT_FIELDS], default=0), max(stats[2::STAT_FIELDS], default=0)
        )
    return digest.hexdigest(), newest


def cache_home() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"


def index_path(server_url: str, dataset: str) -> Path:
    """Where the index of dataset on server_url lives."""
    server = re.sub(r"[^A-Za-z0-9.-]+", "_", server_url.split("://", 1)[-1]).strip("_")
    return cache_home() / "gpulease" / "push-index" / (server or "server") / f"{dataset}.sqlite"


class PushIndex:
    """Thread-safe. lookup() answers from memory (the entries are loaded at its first call,
    so a push that the tree record settles never loads them); record() and prune() write
    through, so an interrupted push keeps what it hashed."""

    def __init__(self, path: Path, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.path = path
        self._clock = clock_ns
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[FileStat, int, list[str]]] = {}
        self._loaded = False
        self._db: sqlite3.Connection | None = None
        try:
            self._db = self._open()
        except (sqlite3.Error, OSError, ValueError) as exc:
            log.warning("push index %s unusable (%s); starting it afresh", path, exc)
            self._entries.clear()
            for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                with contextlib.suppress(OSError):
                    stale.unlink(missing_ok=True)
            try:
                self._db = self._open()
            except (sqlite3.Error, OSError) as again:
                log.warning("push index %s cannot be written (%s); hashing all", path, again)
                self._db = None

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            # A cache: a write need not reach the disk before the push goes on (WAL keeps
            # the file whole if the machine stops; what is lost is hashed again).
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        return db

    def _load(self) -> None:
        """Read every entry into memory (once; called under the lock)."""
        if self._loaded:
            return
        self._loaded = True
        if self._db is None:
            return
        try:
            for path, size, mtime, ctime, inode, device, hashed, chunks in self._db.execute(
                "SELECT path, size, mtime_ns, ctime_ns, inode, device, hashed_ns, chunks FROM files"
            ):
                stat = FileStat(size, mtime, ctime, inode, device)
                self._entries.setdefault(path, (stat, hashed, chunks.split(",") if chunks else []))
        except sqlite3.Error as exc:
            log.warning(
                "push index %s unreadable (%s); hashing what it cannot vouch for", self.path, exc
            )

    def tree_manifest(self, scan: str, newest_ns: int) -> str | None:
        """The manifest digest of the tree last recorded with this scan digest, or None (a
        different tree, or one changed too close to when it was recorded to be trusted)."""
        if self._db is None:
            return None
        with self._lock:
            try:
                row = self._db.execute(
                    "SELECT scan, manifest, newest_ns, hashed_ns FROM tree WHERE id = 1"
                ).fetchone()
            except sqlite3.Error:
                return None
        if row is None or row[0] != scan or row[2] != newest_ns or newest_ns > row[3] - RACY_NS:
            return None
        return str(row[1])

    def record_tree(self, scan: str, newest_ns: int, manifest: str) -> None:
        """Remember that the tree with this scan digest made this manifest, as of now."""
        with self._lock:
            self._write(
                "INSERT OR REPLACE INTO tree VALUES (1, ?, ?, ?, ?)",
                [(scan, manifest, newest_ns, self._clock())],
            )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def paths(self) -> set[str]:
        """The paths it has an entry for."""
        with self._lock:
            self._load()
            return set(self._entries)

    def listing(self) -> dict[str, tuple[int, list[str]]]:
        """Each path it has an entry for: its size and chunk hashes as last hashed."""
        with self._lock:
            self._load()
            return {path: (stat.size, chunks) for path, (stat, _, chunks) in self._entries.items()}

    def lookup(self, path: str, stat: FileStat) -> list[str] | None:
        """The chunk hashes path held when it had stat, or None (hash it)."""
        if not self._loaded:
            with self._lock:
                self._load()
        entry = self._entries.get(path)
        if entry is None:
            return None
        recorded, hashed_ns, chunks = entry
        if recorded != stat or stat.changed_ns > hashed_ns - RACY_NS:
            return None
        return chunks

    def record(self, rows: Iterable[tuple[str, FileStat, list[str]]]) -> None:
        """Remember that each path, with its stat, was just hashed to these chunks."""
        now = self._clock()
        fresh = [(path, stat, now, list(chunks)) for path, stat, chunks in rows]
        with self._lock:
            for path, stat, hashed, chunks in fresh:
                self._entries[path] = (stat, hashed, chunks)
            self._write(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (p, s.size, s.mtime_ns, s.ctime_ns, s.inode, s.device, h, ",".join(c))
                    for p, s, h, c in fresh
                ],
            )

    def forget(self, path: str) -> None:
        with self._lock:
            self._entries.pop(path, None)
            self._write("DELETE FROM files WHERE path = ?", [(path,)])
            self._write("DELETE FROM tree", [()])

    def prune(self, keep: set[str]) -> None:
        """Forget every path not in keep (files gone from the tree)."""
        with self._lock:
            self._load()
            gone = [path for path in self._entries if path not in keep]
            for path in gone:
                del self._entries[path]
            self._write("DELETE FROM files WHERE path = ?", [(path,) for path in gone])

    def _write(self, sql: str, rows: list[tuple[object, ...]]) -> None:
        if self._db is None or not rows:
            return
        try:
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                self._db.executemany(sql, rows)
        except sqlite3.Error as exc:
            log.warning("push index %s not updated (%s); it is only a cache", self.path, exc)
