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
file was opened, and writes replace what is there instead of writing through a link.
Empty directories and the instance's own venv layer (`.gpulease/venv`, whose links point
into this node's template environment) are not moved: that layer is made again on the new
node, without the packages installed into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulease.runner import safefs
from gpulease.runner.connection import Connection
from gpulease.schemas.runner import RUNNER_API, RunnerSpec
from gpulease.storage.chunking import CHUNK_SIZE, pack, unpack

log = logging.getLogger(__name__)

API = f"{RUNNER_API}/workspace"
SKIPPED = (".gpulease/venv",)
MAX_FILES = 200_000
MAX_BYTES = 1024**4  # 1 TiB: a workspace larger than this is not saved
ASK_BATCH = 20_000  # chunk ids per "which do you lack"
PACK_BYTES = 32 * 1024 * 1024  # plaintext bytes per pack sent or fetched
FETCH_IDS = 4096
# written in run_dir once the workspace was restored, so that the workdir upload is not
# extracted again over it (runner/agent.py's marker of the same name)
WORKDIR_MARKER = "workdir-extracted"


class WorkspaceSyncError(Exception):
    """The workspace could not be saved or restored; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
    skipped: int  # save: files not saved (hard links, vanished); restore: files deleted


def skipped(relative: str) -> bool:
    return any(relative == s or relative.startswith(s + "/") for s in SKIPPED)


def _read_chunks(fd: int, size: int) -> Iterator[bytes]:
    """The CHUNK_SIZE pieces of the first size bytes of fd (fewer when it shrank)."""
    at = 0
    while at < size:
        block = safefs.read_fd(fd, min(CHUNK_SIZE, size - at), at)
        if not block:
            return
        yield block
        at += len(block)


def list_workspace(workspace: Path) -> tuple[list[Listed], int]:
    """Every regular file of the workspace with its chunk ids, and how many were skipped."""
    files: list[Listed] = []
    left_out = 0
    total = 0
    for entry in safefs.walk(workspace):
        relative = entry.relative.removeprefix("./")
        if skipped(relative):
            continue
        try:
            fd = safefs.open_entry(entry, single_link=True)
        except OSError as exc:
            log.warning("workspace file %s not saved: %s", relative, exc)
            left_out += 1
            continue
        chunks: list[str] = []
        size = 0
        try:
            info = os.fstat(fd)
            for block in _read_chunks(fd, info.st_size):
                chunks.append(hashlib.sha256(block).hexdigest())
                size += len(block)
        finally:
            os.close(fd)
        total += size
        if len(files) >= MAX_FILES or total > MAX_BYTES:
            raise WorkspaceSyncError(
                f"the workspace holds more than {MAX_FILES} files or {MAX_BYTES} bytes; it "
                "cannot move to another node"
            )
        mode = 0o755 if info.st_mode & 0o100 else 0o644
        files.append(Listed(relative, size, mode, info.st_mtime, tuple(chunks)))
    return files, left_out


def save(spec: RunnerSpec, connection: Connection) -> Outcome | None:
    """Save the workspace to the server as the instance's snapshot (spec.workspace_save)."""
    if not spec.workspace_save or not spec.workspace.is_dir():
        return None
    files, left_out = list_workspace(spec.workspace)
    sizes: dict[str, int] = {}
    where: dict[str, tuple[str, int]] = {}  # sha -> (path, chunk index): where to read it
    for f in files:
        for index, sha in enumerate(f.chunks):
            sizes.setdefault(sha, min(CHUNK_SIZE, f.size - index * CHUNK_SIZE))
            where.setdefault(sha, (f.path, index))
    ordered = list(sizes)
    missing: list[str] = []
    for start in range(0, len(ordered), ASK_BATCH):
        batch = [[sha, sizes[sha]] for sha in ordered[start : start + ASK_BATCH]]
        answer = _ok(connection.call("POST", f"{API}/missing", json={"chunks": batch}), "missing")
        missing.extend(answer.json()["missing"])
    sent = 0
    records: list[tuple[str, bytes]] = []
    size = 0
    for sha in missing:
        path, index = where[sha]
        data = safefs.read_bytes(
            spec.workspace, path, limit=CHUNK_SIZE, offset=index * CHUNK_SIZE, single_link=True
        )
        if hashlib.sha256(data).hexdigest() != sha:
            raise WorkspaceSyncError(f"{path} changed while the workspace was saved")
        records.append((sha, data))
        size += len(data)
        if size >= PACK_BYTES:
            sent += _send(connection, records)
            records, size = [], 0
    if records:
        sent += _send(connection, records)
    _ok(
        connection.call(
            "PUT", f"{API}/snapshot", json={"files": [f.wire() for f in files]}, timeout=300
        ),
        "snapshot",
    )
    outcome = Outcome(
        len(files), sum(f.size for f in files), len(missing), sum(sizes[s] for s in missing),
        left_out,
    )  # fmt: skip
    log.info(
        "saved the workspace: %d files, %d bytes; sent %d chunks (%d bytes)",
        outcome.files, outcome.bytes, outcome.sent_chunks, outcome.sent_bytes,
    )  # fmt: skip
    return outcome


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
        Listed(f["path"], int(f["size"]), int(f["mode"]), float(f["mtime"]), tuple(f["chunks"]))
        for f in response.json()["files"]
    ]
    workspace = spec.workspace
    workspace.mkdir(parents=True, exist_ok=True)
    wanted = {f.path for f in files}
    stale = [
        e.relative.removeprefix("./")
        for e in safefs.walk(workspace)
        if e.relative.removeprefix("./") not in wanted
        and not skipped(e.relative.removeprefix("./"))
    ]
    for relative in stale:
        _unlink(workspace, relative)
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
    except OSError as exc:  # a link or a directory in the way (UnsafePath), a full disk
        raise WorkspaceSyncError(
            f"the workspace could not be restored: {exc}; release the instance or remove "
            "what is in the way"
        ) from exc
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    (spec.run_dir / WORKDIR_MARKER).write_text("")
    outcome = Outcome(
        len(files), sum(f.size for f in files), fetched, sum(f.size for f in todo), len(stale)
    )
    log.info(
        "restored the workspace: %d files, %d fetched (%d chunks), %d deleted",
        outcome.files, len(todo), fetched, outcome.skipped,
    )  # fmt: skip
    return outcome


def _unlink(workspace: Path, relative: str) -> None:
    directory, _, name = relative.rpartition("/")
    with contextlib.suppress(FileNotFoundError):
        parent = safefs.open_dir(workspace, directory)
        try:
            os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)
