"""Materialising the datasets an instance mounts: each version once per node, read-only.

The contract with the rest of the runner: the agent calls materialise() before /ready and
keeps the mapping as `self.dataset_dirs` (name -> read-only host directory); the sandbox
binds each at /data/NAME read-only. Without the sandbox, jobs find them through
GPULEASE_DATASETS_DIR (a directory of links named after the datasets).

A version lands in <dataset_cache>/<owner>-<dataset id>-v<version>/: built in a temporary
directory beside it and renamed into place when complete, under a file lock, so instances
that start together on one node fetch it once and none ever sees half of it. Every chunk is
opened with its own key (AES-256-GCM, bound to its owner and hash) and its SHA-256 checked.
"""

from __future__ import annotations

import base64
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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from gpulease.core.datasets import check_dataset_name, path_problem, tree_conflict
from gpulease.core.errors import InvalidInput
from gpulease.runner.connection import Connection
from gpulease.schemas.runner import RUNNER_API, RunnerDatasetMount, RunnerDatasets, RunnerSpec
from gpulease.storage.chunking import CHUNK_SIZE, PackError, unpack, without_cyclic_gc
from gpulease.storage.crypto import IntegrityError, open_sealed

log = logging.getLogger(__name__)

API = f"{RUNNER_API}/datasets"
FETCH_CHUNKS = 1024
FETCH_BYTES = 16 * 1024 * 1024
FETCH_AHEAD = 4  # requests on their way (each decrypted and written on its thread) at once
LINKS_DIR = "data"
_PROGRESS_EVERY_S = 1.0
_LOCK_POLL_S = 0.2


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
    final = root / directory_name(mount)
    what = f"dataset {mount.name} v{mount.version}"
    if final.is_dir():
        return final
    with _locked(root / ".locks" / f"{directory_name(mount)}.lock", progress, what):
        if final.is_dir():
            return final  # another runner finished it while we waited
        building = root / f".building-{directory_name(mount)}-{secrets.token_hex(4)}"
        building.mkdir(mode=0o700)
        try:
            _build(building, mount, connection, progress, what)
            building.replace(final)
        except BaseException:
            _remove_tree(building)
            raise
    log.info("materialised %s in %s", what, final)
    return final


def _remove_tree(path: Path) -> None:
    for directory, _, _ in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)
    shutil.rmtree(path, ignore_errors=True)


class _File(NamedTuple):  # a tuple: 100,000 of them are made per manifest
    path: str
    size: int
    chunks: tuple[str, ...]


def _manifest(
    connection: Connection, mount: RunnerDatasetMount, what: str
) -> tuple[list[_File], dict[str, bytes]]:
    path = f"{API}/{mount.dataset_id}/versions/{mount.version}/manifest"
    data = _json(connection.call("GET", path, timeout=300), f"fetching the file list of {what}")
    try:
        files = [_File(str(p), int(s), tuple(str(c) for c in cs)) for p, s, cs in data["files"]]
        keys = {str(sha): base64.b64decode(key) for sha, key in data["keys"].items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"the file list of {what} is malformed: {exc}") from exc
    for f in files:
        problem = path_problem(f.path)
        if problem:
            raise DatasetError(f"{what} lists the path {f.path!r}, which is refused: {problem}")
        if len(f.chunks) != -(-f.size // CHUNK_SIZE):
            raise DatasetError(f"{what}: {f.path!r} has the wrong number of chunks")
        missing = [sha for sha in f.chunks if sha not in keys]
        if missing:
            raise DatasetError(f"{what}: the server sent no key for chunk {missing[0]}")
    conflict = tree_conflict([f.path for f in files])
    if conflict:
        raise DatasetError(f"{what}: its files do not make a directory tree: {conflict}")
    return files, keys


_Piece = tuple[int, int, str, int]  # file index, offset in the file, chunk sha256, length
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _batches(files: list[_File]) -> tuple[list[list[_Piece]], dict[int, int]]:
    """The manifest's pieces in file order, a request's worth a batch (an empty file is a
    piece of length 0, created by the batch that reaches it), and for every file whose
    pieces lie in more than one batch, how many batches hold them."""
    batches: list[list[_Piece]] = []
    batch: list[_Piece] = []
    size = 0
    spans: dict[int, int] = {}
    for index, f in enumerate(files):
        if not f.chunks:
            batch.append((index, 0, "", 0))
            continue
        first = len(batches)  # the batch its first piece goes to
        for number, sha in enumerate(f.chunks):
            offset = number * CHUNK_SIZE
            length = min(CHUNK_SIZE, f.size - offset)
            if batch and (len(batch) >= FETCH_CHUNKS or size + length > FETCH_BYTES):
                batches.append(batch)
                batch, size = [], 0
            if number == 0:
                first = len(batches)
            batch.append((index, offset, sha, length))
            size += length
        if len(batches) > first:  # its last piece went to a later batch than its first
            spans[index] = len(batches) - first + 1
    if batch:
        batches.append(batch)
    return batches, spans


class _Tree:
    """The version's tree being written: its directories made once, up front, then each
    batch's files written by the thread that fetched it (os.open and os.pwrite let go of
    the GIL, so batches are written side by side). A file is created read-only (0444):
    writing through the descriptor that made it still works. A file whose chunks come in
    several batches is opened by whichever batch reaches it first and closed by the last.
    Paths are opened beneath the tree's own descriptor; the tree is fresh and only this
    runner writes in it, so nothing there is followed or reused (O_EXCL, O_NOFOLLOW)."""

    def __init__(self, root: Path, files: list[_File], spans: dict[int, int]) -> None:
        self.files = files
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._left = dict(spans)  # batches still to write into each shared file
        self._shared: dict[int, int] = {}  # file index -> its open descriptor
        self._lock = threading.Lock()
        self.directories = sorted({f.path.rsplit("/", 1)[0] for f in files if "/" in f.path})

    def make_directories(self) -> None:
        made: set[str] = set()
        for directory in self.directories:  # sorted: a parent comes before its children
            parts = directory.split("/")
            for end in range(1, len(parts) + 1):
                path = "/".join(parts[:end])
                if path not in made:
                    os.mkdir(path, 0o700, dir_fd=self.fd)
                    made.add(path)
        self.directories = sorted(made)

    def _open(self, index: int) -> int:
        if index not in self._left:
            return os.open(self.files[index].path, _CREATE, 0o444, dir_fd=self.fd)
        with self._lock:
            fd = self._shared.get(index)
            if fd is None:
                fd = os.open(self.files[index].path, _CREATE, 0o444, dir_fd=self.fd)
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
            for piece_index, offset, sha, length in batch:
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
        for directory in sorted(self.directories, key=len, reverse=True):
            os.chmod(directory, 0o555, dir_fd=self.fd)
        os.fchmod(self.fd, 0o555)

    def close(self) -> None:
        with self._lock:
            for fd in self._shared.values():
                os.close(fd)
            self._shared.clear()
        os.close(self.fd)


def _build(
    target: Path,
    mount: RunnerDatasetMount,
    connection: Connection,
    progress: Callable[[str], None],
    what: str,
) -> None:
    progress(f"fetching {what}: the file list")
    with without_cyclic_gc():  # 100,000 entries and no cycles
        files, keys = _manifest(connection, mount, what)
        batches, spans = _batches(files)
    total = sum(f.size for f in files)
    tree = _Tree(target, files, spans)
    done = 0
    started = last = time.monotonic()
    path = f"{API}/{mount.dataset_id}/versions/{mount.version}/chunks"

    def fetch_and_write(batch: list[_Piece]) -> int:
        """One request's chunks, decrypted, checked and written, on a worker thread
        (AES-GCM, SHA-256 and the file calls let go of the GIL, so batches overlap)."""
        wanted = list(dict.fromkeys(sha for _, _, sha, _ in batch if sha))
        plain: dict[str, bytes] = {}
        if wanted:
            response = connection.call("POST", path, json={"chunks": wanted}, timeout=300)
            if response.status_code != 200:
                raise DatasetError(
                    f"fetching {what}: the server answered HTTP {response.status_code}: "
                    f"{response.text[:300]}"
                )
            plain = _open_chunks(response.content, keys, mount.owner_id, wanted, what)
        for _, _, sha, length in batch:
            if length and len(plain[sha]) != length:
                raise DatasetError(f"{what}: chunk {sha} has {len(plain[sha])} bytes, not {length}")
        tree.write(batch, plain)
        return sum(length for _, _, _, length in batch)

    workers = ThreadPoolExecutor(max_workers=FETCH_AHEAD, thread_name_prefix="dataset-fetch")
    try:
        tree.make_directories()
        coming = deque(workers.submit(fetch_and_write, b) for b in batches[:FETCH_AHEAD])
        for number in range(len(batches)):
            done += coming.popleft().result()
            if number + FETCH_AHEAD < len(batches):  # keep FETCH_AHEAD requests on their way
                coming.append(workers.submit(fetch_and_write, batches[number + FETCH_AHEAD]))
            now = time.monotonic()
            if now - last >= _PROGRESS_EVERY_S:
                last = now
                rate = done / max(now - started, 1e-6) / 1e6
                progress(f"fetching {what}: {done * 100 // max(total, 1)}% ({rate:.0f} MB/s)")
        tree.make_read_only()
    finally:
        workers.shutdown(wait=True, cancel_futures=True)
        tree.close()


def _open_chunks(
    body: bytes, keys: dict[str, bytes], owner_id: int, wanted: list[str], what: str
) -> dict[str, bytes]:
    plain: dict[str, bytes] = {}
    try:
        for sha, sealed in unpack(body):
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
    lacking = [sha for sha in wanted if sha not in plain]
    if lacking:
        raise DatasetError(f"{what}: the server did not send chunk {lacking[0]}")
    return plain
