"""Pushing a directory as a dataset: scan it, hash it, send what the server lacks, commit.

Built for 100,000 small files: the file list goes in parts of a few thousand files, each
answered with the chunks the server does not have yet; those go many per request (chunk
packs), on a few threads while the next part is being hashed. Run it again after an
interruption and only what is missing is sent. A local index (client/push_index.py) keeps
what each file hashed to, so an unchanged file is neither read nor hashed again.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpulease.client.base import Resource, path_part
from gpulease.client.errors import ClientError
from gpulease.client.push_index import FileStat, PushIndex, index_path
from gpulease.core.datasets import check_dataset_name, path_problem
from gpulease.core.errors import InvalidInput
from gpulease.schemas.datasets import (
    DatasetChunksReceived,
    DatasetCommit,
    DatasetDetail,
    DatasetFileEntry,
    DatasetFilesPart,
    DatasetList,
    DatasetMissingChunks,
    DatasetPublic,
    DatasetRemoved,
    DatasetUploadCreate,
    DatasetUploadPublic,
)
from gpulease.storage.chunking import (
    CHUNK_SIZE,
    ChunkRef,
    chunk_digests,
    file_chunks,
    pack,
    read_chunk,
)

PART_FILES = 2000
PACK_BYTES = 8 * 1024 * 1024
PACK_CHUNKS = 4000
UPLOAD_THREADS = 2
HASH_THREADS = 2
# Files up to this size are kept in memory between hashing and sending (one part's worth).
_KEEP_BYTES = 64 * 1024


class DatasetError(ClientError):
    """A directory that cannot be pushed as it is: a path, link or file type is refused."""


@dataclass(frozen=True)
class LocalFile:
    path: str  # inside the dataset: relative, '/'-separated
    source: Path
    size: int
    stat: FileStat | None = None  # as scanned: the push index's key


def _refuse(root: Path, relative: str, why: str) -> DatasetError:
    return DatasetError(f"cannot push {root / relative}: {why}")


def scan_directory(root: Path) -> list[LocalFile]:
    """The files under root, sorted by path. Refuses (DatasetError, naming the file) paths
    with control characters or that are not UTF-8, links that lead outside root or to a
    directory, and anything that is not a regular file. A link to a file inside root is
    pushed as a copy of that file."""
    if not root.is_dir():
        raise DatasetError(f"{root} is not a directory")
    top = root.resolve()
    found: list[LocalFile] = []
    for directory, subdirs, names in os.walk(root):
        here = Path(directory)
        relative_dir = here.relative_to(root).as_posix()
        prefix = "" if relative_dir == "." else relative_dir + "/"
        for sub in sorted(subdirs):
            if (here / sub).is_symlink():
                raise _refuse(
                    root,
                    prefix + sub,
                    "it is a link to a directory; links to directories are not followed "
                    "(copy the directory in, or push it as a dataset of its own)",
                )
        subdirs.sort()
        for name in sorted(names):
            relative = prefix + name
            problem = path_problem(relative)
            if problem:
                raise _refuse(root, relative, problem)
            source = here / name
            info = source.lstat()
            if stat.S_ISLNK(info.st_mode):
                target = source.resolve()
                if not target.is_relative_to(top):
                    raise _refuse(
                        root, relative, f"it is a link to {target}, outside the directory"
                    )
                if not target.exists():
                    raise _refuse(root, relative, "it is a link to nothing (a broken link)")
                info = target.stat()
            if not stat.S_ISREG(info.st_mode):
                raise _refuse(root, relative, "it is not a regular file (a device, pipe or socket)")
            found.append(LocalFile(relative, source, info.st_size, FileStat.of(info)))
    found.sort(key=lambda f: f.path)
    return found


class PushProgress(Protocol):
    """What a push reports as it goes (the CLI draws a progress bar from it). A callback
    may raise (KeyboardInterrupt, say) to stop the push; pushing again resumes it."""

    def started(self, files: int, size: int) -> None: ...

    def advanced(self, files: int, size: int) -> None:
        """files and size more are done: known to the server, or sent to it."""
        ...


@dataclass
class PushResult:
    dataset: DatasetPublic
    push_id: int
    files: int
    size: int
    sent_chunks: int
    sent_bytes: int
    seconds: float
    index_hits: int = 0  # files the push index vouched for: not read, not hashed


@dataclass
class _Part:
    files: list[LocalFile]
    chunks: list[list[ChunkRef]]
    kept: dict[str, bytes] = field(default_factory=dict)
    indexed: list[bool] = field(default_factory=list)  # chunks from the index, not hashed


def _hash_file(local: LocalFile) -> tuple[list[ChunkRef], bytes | None]:
    """A file's chunks, and its bytes when it is small enough to keep until it is sent."""
    try:
        if local.size <= _KEEP_BYTES:
            data = local.source.read_bytes()
            refs, kept = chunk_digests(data), data
        else:
            refs, kept = file_chunks(local.source), None
    except OSError as exc:
        raise DatasetError(f"cannot read {local.source}: {exc.strerror or exc}") from exc
    if sum(ref.size for ref in refs) != local.size:
        raise DatasetError(f"{local.source} changed while it was being pushed; push again")
    return refs, kept


def _indexed_chunks(local: LocalFile, hashes: list[str]) -> list[ChunkRef] | None:
    """The chunk refs the index recorded for local, or None when they cannot be its."""
    if len(hashes) != -(-local.size // CHUNK_SIZE):
        return None
    last = local.size - CHUNK_SIZE * (len(hashes) - 1)
    return [
        ChunkRef(sha, CHUNK_SIZE if i < len(hashes) - 1 else last) for i, sha in enumerate(hashes)
    ]


def _hash_part(
    files: list[LocalFile], readers: ThreadPoolExecutor, index: PushIndex | None = None
) -> _Part:
    part = _Part(files, [])
    known: dict[int, list[ChunkRef]] = {}
    if index is not None:
        for at, local in enumerate(files):
            hashes = index.lookup(local.path, local.stat) if local.stat else None
            refs = None if hashes is None else _indexed_chunks(local, hashes)
            if refs is not None:
                known[at] = refs
    unknown = [local for at, local in enumerate(files) if at not in known]
    hashed = iter(readers.map(_hash_file, unknown, chunksize=64))
    fresh: list[tuple[str, FileStat, list[str]]] = []
    for at, local in enumerate(files):
        if at in known:
            part.chunks.append(known[at])
            part.indexed.append(True)
            continue
        refs, kept = next(hashed)
        part.chunks.append(refs)
        part.indexed.append(False)
        if kept and refs:
            part.kept[refs[0].sha256] = kept
        if local.stat is not None:
            fresh.append((local.path, local.stat, [ref.sha256 for ref in refs]))
    if index is not None:
        index.record(fresh)
    return part


def _parts(files: list[LocalFile], size: int) -> Iterator[list[LocalFile]]:
    for start in range(0, len(files), size):
        yield files[start : start + size]


def push_directory(
    datasets: DatasetsAPI,
    root: Path,
    name: str,
    *,
    progress: PushProgress | None = None,
    part_files: int = PART_FILES,
    pack_bytes: int = PACK_BYTES,
    threads: int = UPLOAD_THREADS,
    index: PushIndex | None = None,
) -> PushResult:
    """Push root as a new version of dataset `name` and return what happened. index: what
    earlier pushes hashed (client/push_index.py); files it vouches for are not hashed, and
    it learns the files hashed now."""
    try:
        check_dataset_name(name)
    except InvalidInput as exc:
        raise DatasetError(exc.message) from None
    started = time.monotonic()
    files = scan_directory(root)
    total = sum(f.size for f in files)
    if progress is not None:
        progress.started(len(files), total)
    push = datasets.start_push(DatasetUploadCreate(name=name, files=len(files), bytes=total))
    queued: set[str] = set()  # chunks on their way in this push: send each once
    sent = [0, 0]
    in_flight: set[Future[DatasetChunksReceived]] = set()
    hits = 0

    def send(records: list[tuple[str, bytes]]) -> DatasetChunksReceived:
        return datasets.push_chunks(name, push.id, pack(records))

    def settle(block: bool) -> None:
        while in_flight and (block or len(in_flight) >= threads * 2):
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                in_flight.discard(future)
                received = future.result()
                sent[0] += received.chunks
                sent[1] += received.bytes
                if progress is not None:
                    progress.advanced(0, received.bytes)

    pool = ThreadPoolExecutor(max_workers=max(threads, 1), thread_name_prefix="push")
    readers = ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="hash")
    ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hash-ahead")
    try:
        part_count = 0
        batches = list(_parts(files, part_files))
        coming = ahead.submit(_hash_part, batches[0], readers, index) if batches else None
        for number, batch in enumerate(batches):
            assert coming is not None
            part = coming.result()
            if number + 1 < len(batches):  # hash the next part while this one is sent
                coming = ahead.submit(_hash_part, batches[number + 1], readers, index)
            hits += sum(part.indexed)
            entries = [
                DatasetFileEntry(path=f.path, size=f.size, chunks=[r.sha256 for r in refs])
                for f, refs in zip(part.files, part.chunks, strict=True)
            ]
            answer = datasets.push_files(name, push.id, number, DatasetFilesPart(files=entries))
            part_count = number + 1
            missing = set(answer.missing) - queued
            queued |= missing
            records: list[tuple[str, bytes]] = []
            records_size = 0
            known = 0
            for local, refs, indexed in zip(part.files, part.chunks, part.indexed, strict=True):
                for number_in_file, ref in enumerate(refs):
                    if ref.sha256 not in missing:
                        known += ref.size
                        continue
                    missing.discard(ref.sha256)
                    data = part.kept.get(ref.sha256)
                    if data is None:
                        data = read_chunk(local.source, number_in_file)
                    if len(data) != ref.size or (
                        indexed and hashlib.sha256(data).hexdigest() != ref.sha256
                    ):
                        if index is not None:
                            index.forget(local.path)
                        raise DatasetError(
                            f"{local.source} changed while it was being pushed; push again"
                        )
                    records.append((ref.sha256, data))
                    records_size += len(data)
                    if records_size >= pack_bytes or len(records) >= PACK_CHUNKS:
                        settle(block=False)
                        in_flight.add(pool.submit(send, records))
                        records, records_size = [], 0
            if records:
                settle(block=False)
                in_flight.add(pool.submit(send, records))
            if progress is not None:
                progress.advanced(len(batch), known)
        settle(block=True)
        commit = DatasetCommit(parts=part_count, files=len(files), bytes=total)
        dataset = datasets.commit_push(name, push.id, commit)
        if index is not None:
            index.prune({f.path for f in files})
    finally:
        ahead.shutdown(wait=True, cancel_futures=True)
        readers.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
    return PushResult(
        dataset=dataset,
        push_id=push.id,
        files=len(files),
        size=total,
        sent_chunks=sent[0],
        sent_bytes=sent[1],
        seconds=time.monotonic() - started,
        index_hits=hits,
    )


class DatasetsAPI(Resource):
    """`client.datasets`: your datasets, and the push protocol that push() drives."""

    def list(self) -> DatasetList:
        """Your datasets, and your storage use against your quota."""
        return self._api.one(DatasetList, "GET", "/datasets")

    def get(self, name: str) -> DatasetDetail:
        """A dataset with its versions, its recent pushes and the instances mounting it."""
        return self._api.one(DatasetDetail, "GET", f"/datasets/{path_part(name)}")

    def remove(self, name: str) -> DatasetRemoved:
        return self._api.one(DatasetRemoved, "DELETE", f"/datasets/{path_part(name)}")

    def push(
        self,
        directory: Path,
        name: str,
        *,
        progress: PushProgress | None = None,
        use_index: bool = True,
    ) -> PushResult:
        """Push a directory as a new version of dataset `name` (see push_directory), with
        the push index of this server and dataset unless use_index is False."""
        if not use_index:
            return push_directory(self, directory, name, progress=progress)
        try:
            check_dataset_name(name)
        except InvalidInput as exc:
            raise DatasetError(exc.message) from None
        index = PushIndex(index_path(self._api.server_url, name))
        try:
            return push_directory(self, directory, name, progress=progress, index=index)
        finally:
            index.close()

    # The push protocol, step by step.

    def start_push(self, body: DatasetUploadCreate) -> DatasetUploadPublic:
        path = f"/datasets/{path_part(body.name)}/pushes"
        return self._api.one(DatasetUploadPublic, "POST", path, body=body)

    def get_push(self, name: str, push_id: int) -> DatasetUploadPublic:
        path = f"/datasets/{path_part(name)}/pushes/{int(push_id)}"
        return self._api.one(DatasetUploadPublic, "GET", path)

    def push_files(
        self, name: str, push_id: int, part: int, body: DatasetFilesPart
    ) -> DatasetMissingChunks:
        """Send part `part` of the file list; the answer names the chunks to send."""
        path = f"/datasets/{path_part(name)}/pushes/{int(push_id)}/files/{int(part)}"
        return self._api.one(DatasetMissingChunks, "PUT", path, body=body)

    def push_chunks(self, name: str, push_id: int, packed: bytes) -> DatasetChunksReceived:
        """Send a chunk pack (gpulease.storage.chunking.pack) of plaintext chunks."""
        path = f"/datasets/{path_part(name)}/pushes/{int(push_id)}/chunks"
        headers = {"Content-Type": "application/octet-stream"}
        return self._api.one(DatasetChunksReceived, "POST", path, content=packed, headers=headers)

    def commit_push(self, name: str, push_id: int, body: DatasetCommit) -> DatasetPublic:
        path = f"/datasets/{path_part(name)}/pushes/{int(push_id)}/commit"
        return self._api.one(DatasetPublic, "POST", path, body=body)

    def abandon_push(self, name: str, push_id: int) -> None:
        self._api.send("DELETE", f"/datasets/{path_part(name)}/pushes/{int(push_id)}")
