"""Materialising the datasets an instance mounts: each version once per node, read-only.

The contract with the rest of the runner: the agent calls materialise() before /ready and
keeps the mapping as `self.dataset_dirs` (name -> read-only host directory); the sandbox
binds each at /data/NAME read-only. Without the sandbox, jobs find them through
GPULEASE_DATASETS_DIR (a directory of links named after the datasets).

A version lands in <dataset_cache>/<owner>-<dataset id>-v<version>/: built in a temporary
directory beside it and renamed into place when complete, under a file lock, so instances
that start together on one node fetch it once and none ever sees half of it. Every chunk is
opened with its own key (AES-256-GCM, bound to its owner and hash) and its SHA-256 checked.
Files are not fsynced one by one: the file system is synced after the rename, in the
background, and a version the host went down on before that is fetched again
(runner/version_marks.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from gpulease.core.datasets import check_dataset_name, path_problem
from gpulease.core.errors import InvalidInput
from gpulease.runner import version_marks
from gpulease.runner.connection import Connection
from gpulease.schemas.runner import RUNNER_API, RunnerDatasetMount, RunnerDatasets, RunnerSpec
from gpulease.storage import file_lists
from gpulease.storage.chunking import CHUNK_SIZE, PackError, unpack_views, without_cyclic_gc
from gpulease.storage.crypto import IntegrityError, open_sealed

log = logging.getLogger(__name__)

API = f"{RUNNER_API}/datasets"
FETCH_CHUNKS = 1024
FETCH_BYTES = 16 * 1024 * 1024
FETCH_AHEAD = 4  # requests on their way (each decrypted and written on its thread) at once
# The first request asks for this many chunks and each next one for twice as many as the
# last, up to FETCH_CHUNKS: the first files are written while a full pack would still be
# on its way, and the four threads have work sooner.
FIRST_FETCH_CHUNKS = 128
LINKS_DIR = "data"
_PROGRESS_EVERY_S = 1.0
_LOCK_POLL_S = 0.2
_LIST_BREAKS = 5  # the file list breaking off this often in a row fails the build


class DatasetError(Exception):
    """A mounted dataset cannot be materialised; the runner fails the instance with this."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def directory_name(mount: RunnerDatasetMount) -> str:
    """The version's directory in the node's dataset cache."""
    return f"{mount.owner_id}-{mount.dataset_id}-v{mount.version}"


def cache_dir(spec: RunnerSpec) -> Path:
    return spec.dataset_cache or spec.run_dir.parent.parent / "datasets"


def links_dir(spec: RunnerSpec) -> Path:
    """GPULEASE_DATASETS_DIR for unsandboxed jobs: NAME -> the materialised version."""
    return spec.run_dir / LINKS_DIR


def chunk_aad(owner_id: int, sha256: str) -> bytes:
    """The same binding the server seals chunks with (services/datasets/vault.py)."""
    return f"gpulease/chunk/{owner_id}/{sha256}".encode()


def _json(response: Any, what: str) -> Any:
    if response.status_code != 200:
        raise DatasetError(f"{what}: the server answered HTTP {response.status_code}")
    try:
        return response.json()
    except ValueError as exc:
        raise DatasetError(f"{what}: the server's answer is not JSON") from exc


def mounted_versions(connection: Connection) -> list[RunnerDatasetMount]:
    response = connection.call("GET", API, timeout=60)
    if response.status_code == 404:
        return []  # a server from before datasets
    data = _json(response, "listing the instance's datasets")
    try:
        return RunnerDatasets.model_validate(data).datasets
    except ValidationError as exc:
        raise DatasetError(f"the server's list of datasets is malformed: {exc}") from exc


def materialise(
    spec: RunnerSpec, connection: Connection, progress: Callable[[str], None]
) -> dict[str, Path]:
    """Make every dataset the instance mounts available on this node, read-only, and return
    name -> host directory. progress(message) is told how it goes (and may raise to stop)."""
    mounts = mounted_versions(connection)
    if not mounts:
        return {}
    root = cache_dir(spec)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    found: dict[str, Path] = {}
    for mount in mounts:
        try:
            check_dataset_name(mount.name)
        except InvalidInput as exc:
            raise DatasetError(exc.message) from None
        found[mount.name] = _ensure_version(root, mount, connection, progress)
    _link(links_dir(spec), found)
    return found


def _link(directory: Path, found: dict[str, Path]) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for entry in directory.iterdir():
        if entry.is_symlink() and entry.name not in found:
            entry.unlink()
    for name, target in found.items():
        link = directory / name
        temporary = directory / f".{name}.{secrets.token_hex(4)}"
        temporary.symlink_to(target, target_is_directory=True)
        temporary.replace(link)


@contextlib.contextmanager
def _locked(path: Path, progress: Callable[[str], None], what: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with path.open("a") as handle:
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    progress(f"waiting for another instance on this node to fetch {what}")
                    told = True
                time.sleep(_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ensure_version(
    root: Path, mount: RunnerDatasetMount, connection: Connection, progress: Callable[[str], None]
) -> Path:
    version = directory_name(mount)
    final = root / version
    what = f"dataset {mount.name} v{mount.version}"
    if final.is_dir() and version_marks.usable(root, version):
        return final
    with _locked(root / ".locks" / f"{version}.lock", progress, what):
        if final.is_dir():
            if version_marks.usable(root, version):
                return final  # another runner finished it while we waited
            # Built in an earlier boot whose end came before its files were known to be on
            # the disk: some may be empty or short. No instance of this boot can have it.
            progress(
                f"{what} was written shortly before this host restarted and may not have "
                "reached its disk: fetching it again"
            )
            suspect = root / f".suspect-{version}-{secrets.token_hex(4)}"
            final.rename(suspect)  # out of the way at once, whatever removing it meets
            _remove_tree(suspect)
        building = root / f".building-{version}-{secrets.token_hex(4)}"
        building.mkdir(mode=0o700)
        try:
            _build(building, mount, connection, progress, what)
            version_marks.mark_built(root, version)
            building.replace(final)
        except BaseException:
            _remove_tree(building)
            raise
    version_marks.sync_later(root, version)
    log.info("materialised %s in %s", what, final)
    return final


def _remove_tree(path: Path) -> None:
    for directory, _, _ in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)
    shutil.rmtree(path, ignore_errors=True)


_Piece = tuple[int, int, str, bytes, int]  # file index, offset, chunk sha256, its key, length
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _file_list(
    connection: Connection, path: str, what: str
) -> Generator[file_lists.Block, None, None]:
    """The version's file list, block by block as it arrives. A list that breaks off is
    asked for again from the first file not yet read (a server restarting, say)."""
    listed = 0
    total: int | None = None
    breaks = 0
    while True:
        reader = file_lists.Reader()
        asked, checked = listed, False
        try:
            with connection.stream("GET", path, params={"start": asked}, timeout=300) as answer:
                if answer.status_code != 200:
                    raise DatasetError(
                        f"fetching the file list of {what}: the server answered HTTP "
                        f"{answer.status_code}: {answer.text[:300]}"
                    )
                for data in answer.iter_bytes():
                    blocks = reader.feed(data)
                    if reader.total is not None and not checked:  # its header is in
                        if reader.start != asked or total not in (None, reader.total):
                            raise file_lists.FileListError("it does not go on where it broke off")
                        total, checked = reader.total, True
                    for block in blocks:
                        listed += len(block.paths)
                        breaks = 0
                        yield block
                    if reader.ended:
                        if listed != total:
                            raise file_lists.FileListError(f"{listed} files, not {total}")
                        return
            problem = "the answer ended early"
        except file_lists.FileListError as exc:
            raise DatasetError(f"the file list of {what} is malformed: {exc}") from None
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        breaks += 1
        if breaks > _LIST_BREAKS:
            raise DatasetError(f"fetching the file list of {what} broke off: {problem}")
        log.warning("the file list of %s broke off after %d files (%s)", what, listed, problem)
        time.sleep(_LOCK_POLL_S * breaks)


class _Tree:
    """The version's tree being written: its directories made as the file list names them
    (before any batch that writes in them is fetched), then each batch's files written by
    the thread that fetched it (os.open and os.pwrite let go of the GIL, so batches are
    written side by side). A file is created read-only (0444): writing through the
    descriptor that made it still works. A file whose chunks come in several batches is
    opened by whichever batch reaches it first and closed by the last. Paths are opened
    beneath the tree's own descriptor; the tree is fresh and only this runner writes in it,
    so nothing there is followed or reused (O_EXCL, O_NOFOLLOW)."""

    def __init__(self, root: Path) -> None:
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.paths: list[str] = []  # by file index; appended to as the list arrives
        self.directories: list[str] = []  # made, parents first
        self._left: dict[int, int] = {}  # batches still to write into each shared file
        self._shared: dict[int, int] = {}  # file index -> its open descriptor
        self._lock = threading.Lock()

    def make_directory(self, path: str) -> None:
        os.mkdir(path, 0o700, dir_fd=self.fd)
        self.directories.append(path)

    def share(self, index: int, batches: int) -> None:
        """File index is written by that many batches (told before any of them is sent)."""
        with self._lock:
            self._left[index] = batches

    def _open(self, index: int) -> int:
        if index not in self._left:
            return os.open(self.paths[index], _CREATE, 0o444, dir_fd=self.fd)
        with self._lock:
            fd = self._shared.get(index)
            if fd is None:
                fd = os.open(self.paths[index], _CREATE, 0o444, dir_fd=self.fd)
                self._shared[index] = fd
            return fd

    def _close(self, index: int, fd: int) -> None:
        if index not in self._left:
            os.close(fd)
            return
        with self._lock:
            self._left[index] -= 1
            if self._left[index] == 0:
                del self._shared[index]
                os.close(fd)

    def write(self, batch: list[_Piece], plain: dict[str, bytes]) -> None:
        """Writes a batch's pieces; plain maps their chunks to their checked plaintext."""
        index, fd = -1, -1
        try:
            for piece_index, offset, sha, _, length in batch:
                if piece_index != index:
                    if fd >= 0:
                        self._close(index, fd)
                        fd = -1
                    index = piece_index
                    fd = self._open(index)
                if length:
                    view = memoryview(plain[sha])
                    while view:
                        written = os.pwrite(fd, view, offset)
                        view, offset = view[written:], offset + written
        finally:
            if fd >= 0:
                self._close(index, fd)

    def make_read_only(self) -> None:
        """The tree and the directories it made become read-only, deepest first (its files
        were made read-only as they were created). Only its own: the tree is not walked."""
        for directory in reversed(self.directories):
            os.chmod(directory, 0o555, dir_fd=self.fd)
        os.fchmod(self.fd, 0o555)

    def close(self) -> None:
        with self._lock:
            for fd in self._shared.values():
                os.close(fd)
            self._shared.clear()
        os.close(self.fd)


class _Listing:
    """The file list as it arrives, on the main thread: each file's path checked, with the
    tree so far (a path listed twice, or a file that is also a directory, is refused), its
    directories made, and its chunks cut into batches of a request's worth (an empty file is
    a piece of length 0, created by the batch that reaches it)."""

    def __init__(self, tree: _Tree, what: str) -> None:
        self.tree = tree
        self.what = what
        self._files: set[str] = set()
        self._directories: set[str] = set()
        self._batch: list[_Piece] = []
        self._bytes = 0
        self._limit = min(FIRST_FETCH_CHUNKS, FETCH_CHUNKS)  # chunks in the batch filling, at most

    def add(self, block: file_lists.Block) -> list[list[_Piece]]:
        """The block's files; returns the batches it filled, each file that spans several
        of them told to the tree first."""
        what, tree, files, directories = self.what, self.tree, self._files, self._directories
        full: list[list[_Piece]] = []
        hexes = block.digests.hex()
        digest_chars = 2 * file_lists.DIGEST_BYTES
        at = 0  # the block's chunks used so far
        for path, size, count in zip(block.paths, block.sizes, block.counts, strict=True):
            problem = path_problem(path)
            if problem:
                raise DatasetError(f"{what} lists the path {path!r}, which is refused: {problem}")
            if count != -(-size // CHUNK_SIZE):
                raise DatasetError(f"{what}: {path!r} has the wrong number of chunks")
            if path in files or path in directories:
                raise DatasetError(
                    f"{what}: its files do not make a directory tree: {path!r} "
                    "is listed twice, or as a file and a directory"
                )
            parent = path.rpartition("/")[0]
            if parent and parent not in directories:
                self._make_directories(parent, path)
            files.add(path)
            index = len(tree.paths)
            tree.paths.append(path)
            batch = self._batch
            if not count:
                batch.append((index, 0, "", b"", 0))
                continue
            first = len(full)  # the batch its first piece goes to
            for number in range(count):
                offset = number * CHUNK_SIZE
                length = min(CHUNK_SIZE, size - offset)
                if batch and (len(batch) >= self._limit or self._bytes + length > FETCH_BYTES):
                    full.append(batch)
                    batch = self._batch = []
                    self._bytes = 0
                    self._limit = min(2 * self._limit, FETCH_CHUNKS)
                if number == 0:
                    first = len(full)
                sha = hexes[at * digest_chars : (at + 1) * digest_chars]
                key = block.keys[at * file_lists.KEY_BYTES : (at + 1) * file_lists.KEY_BYTES]
                batch.append((index, offset, sha, key, length))
                self._bytes += length
                at += 1
            if len(full) > first:  # its last piece went to a later batch than its first
                tree.share(index, len(full) - first + 1)
        return full

    def _make_directories(self, directory: str, path: str) -> None:
        parts = directory.split("/")
        for end in range(1, len(parts) + 1):
            made = "/".join(parts[:end])
            if made in self._directories:
                continue
            if made in self._files:
                raise DatasetError(
                    f"{self.what}: its files do not make a directory tree: {made!r} is a file "
                    f"and also a directory holding {path!r}"
                )
            self.tree.make_directory(made)
            self._directories.add(made)

    def finish(self) -> list[list[_Piece]]:
        """The last batch, once the list has ended."""
        batch, self._batch = self._batch, []
        return [batch] if batch else []


def _build(
    target: Path,
    mount: RunnerDatasetMount,
    connection: Connection,
    progress: Callable[[str], None],
    what: str,
) -> None:
    progress(f"fetching {what}: the file list")
    tree = _Tree(target)
    listing = _Listing(tree, what)
    path = f"{API}/{mount.dataset_id}/versions/{mount.version}"
    done = 0
    started = last = time.monotonic()

    def fetch_and_write(batch: list[_Piece]) -> int:
        """One request's chunks, decrypted, checked and written, on a worker thread
        (AES-GCM, SHA-256 and the file calls let go of the GIL, so batches overlap)."""
        keys = {sha: key for _, _, sha, key, _ in batch if sha}
        plain: dict[str, bytes] = {}
        if keys:
            response = connection.call(
                "POST", f"{path}/chunks", json={"chunks": list(keys)}, timeout=300
            )
            if response.status_code != 200:
                raise DatasetError(
                    f"fetching {what}: the server answered HTTP {response.status_code}: "
                    f"{response.text[:300]}"
                )
            plain = _open_chunks(response.content, keys, mount.owner_id, what)
        for _, _, sha, _, length in batch:
            if length and len(plain[sha]) != length:
                raise DatasetError(f"{what}: chunk {sha} has {len(plain[sha])} bytes, not {length}")
        tree.write(batch, plain)
        return sum(length for _, _, _, _, length in batch)

    def collect(wait: bool) -> None:
        """Takes in the batches done (in order; all of them when wait), telling how it goes."""
        nonlocal done, last
        while coming and (wait or coming[0].done()):
            done += coming.popleft().result()
            now = time.monotonic()
            if now - last >= _PROGRESS_EVERY_S:
                last = now
                rate = done / max(now - started, 1e-6) / 1e6
                share = done * 100 // max(mount.size_bytes, 1)
                progress(f"fetching {what}: {share}% ({rate:.0f} MB/s)")

    workers = ThreadPoolExecutor(max_workers=FETCH_AHEAD, thread_name_prefix="dataset-fetch")
    coming: deque[Future[int]] = deque()
    try:
        # The list's 100,000 entries make no cycles: collections would go through them all.
        with (
            without_cyclic_gc(),
            contextlib.closing(_file_list(connection, f"{path}/manifest", what)) as blocks,
        ):
            for block in blocks:
                coming.extend(workers.submit(fetch_and_write, b) for b in listing.add(block))
                collect(wait=False)
            coming.extend(workers.submit(fetch_and_write, b) for b in listing.finish())
        collect(wait=True)
        tree.make_read_only()
    finally:
        workers.shutdown(wait=True, cancel_futures=True)
        tree.close()


def _open_chunks(
    body: bytes | bytearray, keys: dict[str, bytes], owner_id: int, what: str
) -> dict[str, bytes]:
    """The plaintext of each chunk of a pack, by sha256; keys: the chunks asked for. Each
    sealed chunk is opened where it lies in the body (a view, no copy of it first)."""
    plain: dict[str, bytes] = {}
    try:
        for digest, sealed in unpack_views(body):
            sha = digest.hex()
            if sha not in keys:
                raise DatasetError(f"{what}: the server sent chunk {sha}, which was not asked for")
            try:
                data = open_sealed(keys[sha], sealed, chunk_aad(owner_id, sha), f"chunk {sha}")
            except IntegrityError as exc:
                raise DatasetError(f"{what}: {exc.message}") from exc
            if hashlib.sha256(data).hexdigest() != sha:
                raise DatasetError(f"{what}: chunk {sha} does not match its SHA-256")
            plain[sha] = data
    except PackError as exc:
        raise DatasetError(f"{what}: a malformed chunk pack from the server: {exc}") from exc
    lacking = [sha for sha in keys if sha not in plain]
    if lacking:
        raise DatasetError(f"{what}: the server did not send chunk {lacking[0]}")
    return plain
