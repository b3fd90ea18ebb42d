"""Move a workspace between nodes through the server: save it at stop, restore it on the next node.

On a fleet backend (Ray) a workspace lives on the node that ran the instance. At every stop
the runner saves it (`save`): it walks the workspace, cuts each file into content-addressed
chunks (gpulease.storage.chunking), asks the server which of them it lacks, sends only
those, and then the file list, which becomes the instance's snapshot (the server seals it
all with the instance's workspace key: server/services/workspaces.py). A second stop sends
only the chunks that changed since the first.

When the instance starts on another node (its own is full or gone), that node's runner
restores the snapshot before `ready` (`restore`): files whose bytes it already has (an
older copy of the workspace on this node) stay, the others are fetched and written, and
files the snapshot does not hold are deleted.

The workspace is the job's: every file in it is hostile input. Both directions go through
runner/safefs.py: the walk never follows a link and yields regular files only (links,
FIFOs, devices are not saved), a file with a second hard link is skipped (it may be
someone else's file under a second name), reads are bounded by the size fstat gave when the
file was opened, and writes replace what is there instead of writing through a link. Modes
become 0o755 or 0o644, directories 0o755. Empty directories move too, and so does the
instance's venv layer (`.gpulease/venv`, envs/layer.py): its regular files (the packages
pip installed there, their scripts) are saved like any other; its links into this node's
template environment are not, nor its pyvenv.cfg, which names this node's template Python,
so the new node's runner makes those again for its own template (envs/layer.ensure_layer
runs after the restore) and the packages stay.

A node-side index (client/push_index.py's, in the runner's directory, which no job can
see) keeps what each file hashed to by its (size, mtime, ctime, inode, device): a save
after the first reads and hashes only the files that changed. It is only a cache: a
missing or corrupt one means every file is read; the server still says which chunks it
lacks, and those are read again and checked against their hash before they are sent.

A save is also made every spec.workspace_save_interval_s while the instance runs (the
runner's own thread, at the lowest CPU and I/O priority), so that an instance whose node
dies starts elsewhere from that copy. A save cut short (the stop comes, the runner is
killed) leaves the chunks it sent on the server: the next save sends only the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import logging
import os
import platform
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulease.client.push_index import FileStat, PushIndex
from gpulease.runner import safefs
from gpulease.runner.connection import Connection
from gpulease.schemas.runner import RUNNER_API, RunnerSpec
from gpulease.storage.chunking import CHUNK_SIZE, pack, unpack

log = logging.getLogger(__name__)

API = f"{RUNNER_API}/workspace"
# made again on every node by envs/layer.ensure_layer: it names that node's template Python
SKIPPED = (".gpulease/venv/pyvenv.cfg",)
MAX_FILES = 200_000
MAX_BYTES = 1024**4  # 1 TiB: a workspace larger than this is not saved
ASK_BATCH = 20_000  # chunk ids per "which do you lack"
PACK_BYTES = 32 * 1024 * 1024  # plaintext bytes per pack sent or fetched
FETCH_IDS = 4096
# written in run_dir once the workspace was restored, so that the workdir upload is not
# extracted again over it (runner/agent.py's marker of the same name)
WORKDIR_MARKER = "workdir-extracted"
INDEX_NAME = "workspace-index.sqlite"  # in run_dir: hidden from the jobs (runner/sandbox.py)


class WorkspaceSyncError(Exception):
    """The workspace could not be saved or restored; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SaveCut(WorkspaceSyncError):
    """The save was given up halfway (the instance is stopping); what it sent stays."""


@dataclass(frozen=True)
class Listed:
    path: str
    size: int
    mode: int
    mtime: float
    chunks: tuple[str, ...]

    def wire(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "mode": self.mode,
            "mtime": self.mtime,
            "chunks": list(self.chunks),
        }


@dataclass(frozen=True)
class Outcome:
    files: int
    bytes: int
    sent_chunks: int  # save: chunks sent; restore: chunks fetched
    sent_bytes: int
    skipped: int  # save: files not saved (hard links, vanished, changing); restore: deleted
    read_files: int = 0  # save: files read and hashed (the others the index vouched for)
    dirs: int = 0  # empty directories saved or made


@dataclass
class Listing:
    """A workspace as walked: its regular files with their chunk ids, its empty directories
    (those holding no saved file or directory), and how many files were left out or read."""

    files: list[Listed] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    left_out: int = 0
    read_files: int = 0


def skipped(relative: str) -> bool:
    return any(relative == s or relative.startswith(s + "/") for s in SKIPPED)


def index_path(spec: RunnerSpec) -> Path:
    return spec.run_dir / INDEX_NAME


def open_index(path: Path, clock_ns: Callable[[], int] = time.time_ns) -> PushIndex:
    """The node's index of the workspace's files at path, readable by root only. A file
    changed less than push_index.RACY_NS before clock_ns() when it is hashed may change
    again unseen within its timestamp's tick: the index does not vouch for it."""
    index = PushIndex(path, clock_ns=clock_ns)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o600)
    return index


def _read_chunks(fd: int, size: int) -> Iterator[bytes]:
    """The CHUNK_SIZE pieces of the first size bytes of fd (fewer when it shrank)."""
    at = 0
    while at < size:
        block = safefs.read_fd(fd, min(CHUNK_SIZE, size - at), at)
        if not block:
            return
        yield block
        at += len(block)


def _mode(info: os.stat_result) -> int:
    return 0o755 if info.st_mode & 0o100 else 0o644


def _check_abort(abort: threading.Event | None) -> None:
    if abort is not None and abort.is_set():
        raise SaveCut("the workspace's save was cut short; the next save sends the rest")


def list_workspace(
    workspace: Path, index: PushIndex | None = None, abort: threading.Event | None = None
) -> Listing:
    """Every regular file of the workspace with its chunk ids (from index when it vouches
    for the file's stat, else read and hashed, and recorded there), and its empty dirs."""
    listing = Listing()
    walked: list[str] = []
    total = 0
    fresh: list[tuple[str, FileStat, list[str]]] = []
    for entry in safefs.walk(workspace, dirs=walked):
        relative = entry.relative.removeprefix("./")
        if skipped(relative):
            continue
        if len(listing.files) % 256 == 0:
            _check_abort(abort)
        known = None
        if index is not None and entry.stat.st_nlink == 1:
            known = index.lookup(relative, FileStat.of(entry.stat))
        if known is not None:
            info = entry.stat
            chunks, size = known, info.st_size
        else:
            read = _read_file(entry, relative)
            if read is None:
                listing.left_out += 1
                continue
            info, chunks, size, steady = read
            listing.read_files += 1
            if steady:  # not changed while it was read: the index may vouch for it
                fresh.append((relative, FileStat.of(info), chunks))
        total += size
        if len(listing.files) >= MAX_FILES or total > MAX_BYTES:
            raise WorkspaceSyncError(
                f"the workspace holds more than {MAX_FILES} files or {MAX_BYTES} bytes; it "
                "cannot move to another node"
            )
        listing.files.append(Listed(relative, size, _mode(info), info.st_mtime, tuple(chunks)))
    if index is not None:
        index.record(fresh)
        index.prune({f.path for f in listing.files})
    listing.dirs = _empty_dirs(
        [d.removeprefix("./") for d in walked if d != "."], [f.path for f in listing.files]
    )
    return listing


def _read_file(
    entry: safefs.Entry, relative: str
) -> tuple[os.stat_result, list[str], int, bool] | None:
    """A walked file's stat, chunk ids, size as read (at most the size its stat gave when
    it was opened), and whether it stayed the same while it was read; None when it cannot
    be saved (it became a link, a FIFO, another file, it has a second hard link)."""
    try:
        fd = safefs.open_entry(entry, single_link=True)
    except OSError as exc:
        log.warning("workspace file %s not saved: %s", relative, exc)
        return None
    chunks: list[str] = []
    size = 0
    try:
        before = os.fstat(fd)
        for block in _read_chunks(fd, before.st_size):
            chunks.append(hashlib.sha256(block).hexdigest())
            size += len(block)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return (
        before,
        chunks,
        size,
        FileStat.of(after) == FileStat.of(before) == FileStat.of(entry.stat)
        and size == before.st_size,
    )


def _parents(paths: list[str]) -> set[str]:
    """Every directory above one of paths ('a' and 'a/b' for 'a/b/c')."""
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")
        found.update("/".join(parts[:end]) for end in range(1, len(parts)))
    return found


def _empty_dirs(dirs: list[str], files: list[str]) -> list[str]:
    """Of dirs, those that hold none of files and none of the other dirs."""
    holding = _parents([*files, *dirs])
    return sorted(d for d in dirs if d not in holding and not skipped(d))


def save(
    spec: RunnerSpec,
    connection: Connection,
    *,
    abort: threading.Event | None = None,
    use_index: bool = True,
    clock_ns: Callable[[], int] = time.time_ns,
) -> Outcome | None:
    """Save the workspace to the server as the instance's snapshot (spec.workspace_save).

    Files the node's index vouches for are neither read nor hashed. A file that changes
    while it is saved (a job writes it) is left out of this snapshot and saved by the next
    one. With abort set meanwhile it stops between files and packs (SaveCut)."""
    if not spec.workspace_save or not spec.workspace.is_dir():
        return None
    index = open_index(index_path(spec), clock_ns) if use_index else None
    try:
        return _save(spec.workspace, connection, index, abort)
    finally:
        if index is not None:
            index.close()


def _save(
    workspace: Path,
    connection: Connection,
    index: PushIndex | None,
    abort: threading.Event | None,
) -> Outcome:
    listing = list_workspace(workspace, index, abort)
    files = listing.files
    digest = _digest(files, listing.dirs)
    if index is not None and _unchanged(connection, index.tree_manifest(digest, 0)):
        outcome = Outcome(
            len(files), sum(f.size for f in files), 0, 0, listing.left_out, listing.read_files,
            len(listing.dirs),
        )  # fmt: skip
        log.info(
            "the workspace is as last saved: %d files (%d read)", len(files), outcome.read_files
        )
        return outcome
    sizes: dict[str, int] = {}
    where: dict[str, list[tuple[str, int]]] = {}  # sha -> (path, chunk index)s holding it
    for f in files:
        for number, sha in enumerate(f.chunks):
            sizes.setdefault(sha, min(CHUNK_SIZE, f.size - number * CHUNK_SIZE))
            where.setdefault(sha, []).append((f.path, number))
    ordered = list(sizes)
    missing: list[str] = []
    for start in range(0, len(ordered), ASK_BATCH):
        batch = [[sha, sizes[sha]] for sha in ordered[start : start + ASK_BATCH]]
        answer = _ok(connection.call("POST", f"{API}/missing", json={"chunks": batch}), "missing")
        missing.extend(answer.json()["missing"])
    sent = sent_bytes = 0
    lost: set[str] = set()  # chunks no file holds now: their files changed since listed
    records: list[tuple[str, bytes]] = []
    size = 0
    for sha in missing:
        data = _chunk(workspace, sha, sizes[sha], where[sha])
        if data is None:
            lost.add(sha)
            continue
        records.append((sha, data))
        size += len(data)
        if size >= PACK_BYTES:
            _check_abort(abort)
            sent += _send(connection, records)
            sent_bytes += size
            records, size = [], 0
    if records:
        _check_abort(abort)
        sent += _send(connection, records)
        sent_bytes += size
    changed = 0
    if lost:
        kept = [f for f in files if lost.isdisjoint(f.chunks)]
        changed, files = len(files) - len(kept), kept
        if index is not None:
            index.prune({f.path for f in files})
    _check_abort(abort)
    body = {"files": [f.wire() for f in files], "dirs": listing.dirs}
    answer = _ok(connection.call("PUT", f"{API}/snapshot", json=body, timeout=300), "snapshot")
    if index is not None and not changed:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            index.record_tree(digest, 0, str(answer.json()["snapshot"]))
    outcome = Outcome(
        len(files), sum(f.size for f in files), sent, sent_bytes,
        listing.left_out + changed, listing.read_files, len(listing.dirs),
    )  # fmt: skip
    log.info(
        "saved the workspace: %d files (%d read), %d empty directories, %d bytes; sent %d "
        "chunks (%d bytes)",
        outcome.files, outcome.read_files, outcome.dirs, outcome.bytes, outcome.sent_chunks,
        outcome.sent_bytes,
    )  # fmt: skip
    return outcome


def _digest(files: list[Listed], dirs: list[str]) -> str:
    """A digest of a snapshot's file list and empty directories."""
    listed = [(f.path, f.size, f.mode, f.mtime, f.chunks) for f in files]
    return hashlib.sha256(json.dumps([listed, dirs]).encode("utf-8", "surrogateescape")).hexdigest()


def _unchanged(connection: Connection, snapshot: str | None) -> bool:
    """Whether the server took snapshot, the one this node last saved with these very files,
    as saved again now (False: there is none, or the server's copy is another one now)."""
    if snapshot is None:
        return False
    response = connection.call("POST", f"{API}/unchanged", json={"snapshot": snapshot})
    if response.status_code in (404, 409, 422):  # another copy, or an older server
        return False
    _ok(response, "unchanged snapshot")
    return True


def _chunk(workspace: Path, sha: str, size: int, places: list[tuple[str, int]]) -> bytes | None:
    """Chunk sha (of size bytes) read from the first of its places (path, chunk index) that
    still holds it; None when none does (each changed since it was listed, or is no longer
    a file)."""
    for path, number in places:
        try:
            data = safefs.read_bytes(
                workspace, path, limit=size, offset=number * CHUNK_SIZE, single_link=True
            )
        except OSError as exc:  # gone, or a link or another file now (UnsafePath)
            log.warning("workspace file %s not saved: %s", path, exc)
            continue
        if hashlib.sha256(data).hexdigest() == sha:
            return data
        log.info("workspace file %s changed while it was saved; the next save has it", path)
    return None


def saving(connection: Connection) -> None:
    """Tell the server that the stopping instance's jobs have ended and its workspace is
    being saved: billing ends now, and the save has its own time limit, not the stop's
    grace. An older server that lacks the call is not told."""
    response = connection.call("POST", f"{API}/saving", json={}, give_up_after=30)
    if not response.is_success and response.status_code != 404:
        log.warning("the server refused the save's start: HTTP %s", response.status_code)


def lower_priority() -> None:
    """The calling thread at the lowest CPU priority and in the idle I/O class (Linux), so
    that a save while the jobs run takes only what they leave."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    number = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
    if number is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(number, 1, tid, 3 << 13)  # ioprio_set(IOPRIO_WHO_PROCESS, IDLE)


def _send(connection: Connection, records: list[tuple[str, bytes]]) -> int:
    _ok(connection.call("POST", f"{API}/chunks", content=pack(records), timeout=300), "chunks")
    return len(records)


def _ok(response: Any, what: str) -> Any:
    if not response.is_success:
        raise WorkspaceSyncError(
            f"the server refused the workspace's {what} with HTTP {response.status_code}: "
            f"{response.text[:300]}"
        )
    return response


# -- restore -------------------------------------------------------------------------------------


def _same(workspace: Path, f: Listed) -> bool:
    """True when the workspace already holds f's bytes at f's path."""
    try:
        info = safefs.lstat(workspace, f.path)  # UnsafePath for a link on the way
        if info is None or not _regular(info) or info.st_size != f.size:
            return False
        with safefs.opened_file(workspace, f.path, single_link=True) as fd:
            got = [hashlib.sha256(b).hexdigest() for b in _read_chunks(fd, f.size)]
    except OSError:
        return False
    return tuple(got) == f.chunks


def _regular(info: os.stat_result) -> bool:
    return stat.S_ISREG(info.st_mode)


class _Fetched(io.RawIOBase):
    """A file's bytes as a stream, fetched from the server a pack at a time."""

    def __init__(self, connection: Connection, chunks: tuple[str, ...], size: int) -> None:
        self._connection = connection
        self._todo = list(chunks)
        self._size = size
        self._buffer = b""
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        if not self._buffer and self._todo:
            count = min(FETCH_IDS, max(1, PACK_BYTES // CHUNK_SIZE), len(self._todo))
            batch, self._todo = self._todo[:count], self._todo[count:]
            self._buffer = b"".join(fetch(self._connection, batch))
            self.fetched += len(batch)
        n = min(len(out), len(self._buffer))
        out[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def fetch(connection: Connection, shas: list[str]) -> list[bytes]:
    """The plaintext of chunks shas, checked against their ids."""
    body = _ok(
        connection.call("POST", f"{API}/chunks/fetch", json={"chunks": shas}, timeout=300),
        "chunks",
    ).content
    got = dict(unpack(body, max_records=len(shas)))
    out = []
    for sha in shas:
        data = got.get(sha)
        if data is None or hashlib.sha256(data).hexdigest() != sha:
            raise WorkspaceSyncError(f"the server sent a wrong or no chunk {sha}")
        out.append(data)
    return out


def restore(
    spec: RunnerSpec, connection: Connection, status: Callable[[str], None] = lambda _: None
) -> Outcome | None:
    """Make the workspace the server's snapshot of it (spec.workspace_restore)."""
    if not spec.workspace_restore:
        return None
    response = _ok(connection.call("GET", f"{API}/snapshot", timeout=300), "snapshot")
    if response.status_code == 204:
        log.warning("the instance moved but the server holds no snapshot of its workspace")
        return None
    files = [
        Listed(
            f["path"],
            int(f["size"]),
            int(f["mode"]) & 0o777,
            float(f["mtime"]),
            tuple(f["chunks"]),
        )  # fmt: skip
        for f in response.json()["files"]
    ]
    dirs = [str(d) for d in response.json().get("dirs", [])]
    workspace = spec.workspace
    workspace.mkdir(parents=True, exist_ok=True)
    wanted = {f.path for f in files}
    walked: list[str] = []
    stale = [
        e.relative.removeprefix("./")
        for e in safefs.walk(workspace, dirs=walked)
        if e.relative.removeprefix("./") not in wanted
        and not skipped(e.relative.removeprefix("./"))
    ]
    for relative in stale:
        _unlink(workspace, relative)
    _remove_stale_dirs(workspace, [d.removeprefix("./") for d in walked if d != "."], files, dirs)
    todo = [f for f in files if not _same(workspace, f)]
    status(
        f"restoring the workspace from the server: {len(todo)} of {len(files)} files "
        f"({sum(f.size for f in todo) // 2**20} MiB) to fetch"
    )
    fetched = 0
    try:
        for f in todo:
            stream = _Fetched(connection, f.chunks, f.size)
            with io.BufferedReader(stream, CHUNK_SIZE) as data:
                safefs.write_replace(workspace, f.path, data, f.mode, mtime=f.mtime)
            fetched += stream.fetched
        for directory in dirs:
            safefs.makedirs(workspace, directory)
    except OSError as exc:  # a link or a directory in the way (UnsafePath), a full disk
        raise WorkspaceSyncError(
            f"the workspace could not be restored: {exc}; release the instance or remove "
            "what is in the way"
        ) from exc
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    (spec.run_dir / WORKDIR_MARKER).write_text("")
    outcome = Outcome(
        len(files), sum(f.size for f in files), fetched, sum(f.size for f in todo), len(stale),
        dirs=len(dirs),
    )  # fmt: skip
    log.info(
        "restored the workspace: %d files, %d fetched (%d chunks), %d deleted, %d empty "
        "directories",
        outcome.files, len(todo), fetched, outcome.skipped, outcome.dirs,
    )  # fmt: skip
    return outcome


def _unlink(
    workspace: Path,
    relative: str,
    remove: Callable[..., None] = os.unlink,
    missing: type[OSError] = FileNotFoundError,
) -> None:
    """Remove workspace/relative (os.unlink, or os.rmdir) through its real parent
    directory; an error of the class missing is let go."""
    directory, _, name = relative.rpartition("/")
    with contextlib.suppress(missing):
        parent = safefs.open_dir(workspace, directory)
        try:
            remove(name, dir_fd=parent)
        finally:
            os.close(parent)


def _remove_stale_dirs(
    workspace: Path, walked: list[str], files: list[Listed], dirs: list[str]
) -> None:
    """Remove the directories the node's older copy has and the snapshot does not, where
    they are empty now (deepest first; one the job filled again stays)."""
    wanted = set(dirs) | _parents([*(f.path for f in files), *dirs])
    for relative in sorted(walked, key=lambda d: d.count("/"), reverse=True):
        if relative in wanted or skipped(relative) or relative.startswith(".gpulease"):
            continue
        _unlink(workspace, relative, os.rmdir, OSError)  # not empty: it stays
