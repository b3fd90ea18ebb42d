"""Pushing a directory as a dataset: scan it, hash it, send what the server lacks, commit.

Built for 100,000 small files: the file list goes in parts of a few thousand files, each
answered with the chunks the server does not have yet; those go many per request (chunk
packs), on a few threads while the next part is being hashed (on a thread per core:
hashlib lets go of the GIL). Run it again after an interruption and only what is missing
is sent. A local index (client/push_index.py) keeps what each file hashed to, so an
unchanged file is neither read nor hashed again, and what the whole tree made: a tree the
server holds as its current version already is settled by comparing two manifest digests
(docs/datasets.md), without a push.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Protocol

from gpulease.client.base import Resource, path_part
from gpulease.client.errors import ApiError
from gpulease.client.push_index import FileStat, PushIndex, index_path
from gpulease.client.scan import DatasetError, LocalFile, ScannedTree, scan_tree, taken_over
from gpulease.core.datasets import (
    check_dataset_name,
    manifest_digest,
)
from gpulease.core.errors import InvalidInput
from gpulease.schemas.datasets import (
    MAX_REMOVED,
    DatasetChunksReceived,
    DatasetCommit,
    DatasetCurrent,
    DatasetDetail,
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

PART_FILES = 5000
PACK_BYTES = 16 * 1024 * 1024
PACK_CHUNKS = 4000
UPLOAD_THREADS = 2
HASH_THREADS = min(8, max(2, os.cpu_count() or 2))
HASH_BATCH = 64  # files a hashing thread takes at once
# Files up to this size are kept in memory between hashing and sending (one part's worth).
_KEEP_BYTES = 64 * 1024


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
    push_id: int | None  # None when nothing was pushed: the server held the tree already
    files: int
    size: int
    sent_chunks: int
    sent_bytes: int
    seconds: float
    index_hits: int = 0  # files the push index vouched for: not read, not hashed
    unchanged: bool = False  # the tree is the dataset's current version: no new version


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
            data = _read_small(local.source, local.size)
            refs, kept = chunk_digests(data), data
        else:
            refs, kept = file_chunks(local.source), None
    except OSError as exc:
        raise DatasetError(f"cannot read {local.source}: {exc.strerror or exc}") from exc
    if sum(ref.size for ref in refs) != local.size:
        raise DatasetError(f"{local.source} changed while it was being pushed; push again")
    return refs, kept


def _hash_files(batch: list[LocalFile]) -> list[tuple[list[ChunkRef], bytes | None]]:
    return list(map(_hash_file, batch))


def _batches(files: list[LocalFile], most: int) -> Iterator[list[LocalFile]]:
    """files in order, in batches of at most `most` files and about CHUNK_SIZE bytes (a large
    file is a batch of its own, so that large files are still hashed side by side)."""
    batch: list[LocalFile] = []
    size = 0
    for local in files:
        batch.append(local)
        size += local.size
        if len(batch) >= most or size >= CHUNK_SIZE:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _read_small(source: str, size: int) -> bytes:
    """The bytes of a small file, read without a buffered file object (tens of thousands
    of files a push); one byte more than size is asked for, so that growth shows."""
    fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pieces = []
        while piece := os.read(fd, size + 1):
            pieces.append(piece)
            size -= len(piece)
            if size < 0:
                break
        return b"".join(pieces)
    finally:
        os.close(fd)


def _indexed_chunks(local: LocalFile, hashes: list[str]) -> list[ChunkRef] | None:
    """The chunk refs the index recorded for local, or None when they cannot be its."""
    if len(hashes) != -(-local.size // CHUNK_SIZE):
        return None
    last = local.size - CHUNK_SIZE * (len(hashes) - 1)
    return [
        ChunkRef(sha, CHUNK_SIZE if i < len(hashes) - 1 else last) for i, sha in enumerate(hashes)
    ]


def _from_index(local: LocalFile, index: PushIndex) -> list[ChunkRef] | None:
    hashes = index.lookup(local.path, local.stat) if local.stat else None
    return None if hashes is None else _indexed_chunks(local, hashes)


def _hash_part(
    files: list[LocalFile], readers: ThreadPoolExecutor, index: PushIndex | None = None
) -> _Part:
    part = _Part(files, [])
    known: dict[int, list[ChunkRef]] = {}
    if index is not None:
        for at, local in enumerate(files):
            refs = _from_index(local, index)
            if refs is not None:
                known[at] = refs
    unknown = [local for at, local in enumerate(files) if at not in known]
    # Files go to the hashing threads in batches: a thread pool's map() makes a future per
    # item (its chunksize is for process pools only), and at tens of thousands of small files
    # those futures, and the threads taking the GIL in turns for each, cost more than the
    # hashing.
    hashed = chain.from_iterable(readers.map(_hash_files, _batches(unknown, HASH_BATCH)))
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
    """files in parts of `size`, but for a first one a tenth as large: its chunks start on
    their way after a few hundred files are hashed and listed, not a few thousand."""
    start = 0
    first = max(1, size // 10)
    while start < len(files):
        step = first if start == 0 else size
        yield files[start : start + step]
        start += step


def _digest_of(files: list[LocalFile], chunks: list[list[ChunkRef]]) -> str:
    return manifest_digest(
        (f.path, f.size, [r.sha256 for r in refs]) for f, refs in zip(files, chunks, strict=True)
    )


@dataclass
class _Before:
    """What the server holds as the dataset's current version, as the push starts."""

    version: int | None = None
    settled: DatasetPublic | None = None  # that version is this very tree: nothing to push
    scan: tuple[str, int] | None = None  # the tree's scan digest, to record after the push


def _before(
    tree: ScannedTree, current: DatasetCurrent | None, index: PushIndex
) -> tuple[_Before, list[LocalFile] | None]:
    """Compare the tree with the current version, by the push index alone (no file read);
    and the tree's files when they had to be listed for that."""
    scan = tree.digest()
    if current is None:
        return _Before(scan=scan), None
    before = _Before(current.dataset.current_version, None, scan)
    if current.manifest_sha256 is None:
        return before, None
    if index.tree_manifest(*scan) == current.manifest_sha256:
        before.settled = current.dataset
        return before, None
    files = tree.files()
    chunks = []
    for local in files:  # every file vouched for, each by its own entry
        refs = _from_index(local, index)
        if refs is None:
            return before, files
        chunks.append(refs)
    if _digest_of(files, chunks) == current.manifest_sha256:
        index.record_tree(*scan, current.manifest_sha256)
        before.settled = current.dataset
    return before, files


Listing = dict[str, tuple[int, list[str]]]  # path: (size, chunk hashes)


def _base(current: DatasetCurrent | None, index: PushIndex) -> tuple[int, Listing] | None:
    """The current version's number and files, when the push index holds exactly that
    version (the manifest digest of its entries is the version's): the base a push then
    changes, sending only the files that differ from it. None otherwise."""
    if current is None or current.manifest_sha256 is None or not current.changes_taken:
        return None  # (a server from before such pushes: the tree goes whole)
    number = current.dataset.current_version
    listing = index.listing()
    if number is None or not listing:
        return None
    if manifest_digest((p, *listing[p]) for p in sorted(listing)) != current.manifest_sha256:
        return None
    return number, listing


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
    earlier pushes hashed (client/push_index.py); files it vouches for are not hashed, it
    learns the files hashed now, and a tree it knows to be the dataset's current version is
    not pushed at all (PushResult.unchanged)."""
    try:
        check_dataset_name(name)
    except InvalidInput as exc:
        raise DatasetError(exc.message) from None
    started = time.monotonic()
    before, files = _Before(), None
    handed = taken_over(root)  # scanned moments ago by the CLI's quick path
    if index is None:
        tree = handed or scan_tree(root)
    else:
        # the server's current version is asked for while the tree is scanned
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="current") as asking:
            asked = asking.submit(datasets.current, name)
            tree = handed or scan_tree(root)  # a refused tree's error wins over the answer's
            current = asked.result()
    total = tree.size
    if progress is not None:
        progress.started(tree.count, total)
    if index is not None:
        before, files = _before(tree, current, index)
        if before.settled is not None:
            if progress is not None:
                progress.advanced(tree.count, total)
            return PushResult(
                dataset=before.settled,
                push_id=None,
                files=tree.count,
                size=total,
                sent_chunks=0,
                sent_bytes=0,
                seconds=time.monotonic() - started,
                index_hits=tree.count,
                unchanged=True,
            )
    if files is None:
        files = tree.files()
    paths = {f.path for f in files} if index is not None else set()
    base = _base(current, index) if index is not None else None
    removed: list[str] = []
    if base is not None:
        removed = sorted(base[1].keys() - paths)
        if len(removed) > MAX_REMOVED:
            base, removed = None, []  # most of it is gone: push the tree whole
    push = datasets.start_push(DatasetUploadCreate(name=name, files=len(files), bytes=total))
    queued: set[str] = set()  # chunks on their way in this push: send each once
    sent = [0, 0]
    in_flight: set[Future[DatasetChunksReceived]] = set()
    hits = 0
    all_chunks: list[list[ChunkRef]] = []

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
            all_chunks.extend(part.chunks)
            entries = [
                (f.path, f.size, [r.sha256 for r in refs])
                for f, refs in zip(part.files, part.chunks, strict=True)
            ]
            if base is not None:  # only what differs from the base version
                listed = base[1]
                entries = [e for e in entries if listed.get(e[0]) != (e[1], e[2])]
            missing = set()
            if entries:
                answer = datasets.push_files(name, push.id, part_count, entries)
                part_count += 1
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
        commit = DatasetCommit(
            parts=part_count,
            files=len(files),
            bytes=total,
            base_version=None if base is None else base[0],
            removed=removed,
        )
        dataset = datasets.commit_push(name, push.id, commit)
        if index is not None:
            index.prune(paths)
            if before.scan is not None:
                index.record_tree(*before.scan, _digest_of(files, all_chunks))
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
        unchanged=before.version is not None and dataset.current_version == before.version,
    )


class DatasetsAPI(Resource):
    """`client.datasets`: your datasets, and the push protocol that push() drives."""

    def list(self) -> DatasetList:
        """Your datasets, and your storage use against your quota."""
        return self._api.one(DatasetList, "GET", "/datasets")

    def get(self, name: str) -> DatasetDetail:
        """A dataset with its versions, its recent pushes and the instances mounting it."""
        return self._api.one(DatasetDetail, "GET", f"/datasets/{path_part(name)}")

    def current(self, name: str) -> DatasetCurrent | None:
        """The dataset's current version and its manifest digest; None when you have no
        version of it yet."""
        try:
            return self._api.one(DatasetCurrent, "GET", f"/datasets/{path_part(name)}/current")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

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

    # The push protocol, step by step (docs/datasets.md).

    def start_push(self, body: DatasetUploadCreate) -> DatasetUploadPublic:
        path = f"/datasets/{path_part(body.name)}/pushes"
        return self._api.one(DatasetUploadPublic, "POST", path, body=body)

    def get_push(self, name: str, push_id: int) -> DatasetUploadPublic:
        path = f"/datasets/{path_part(name)}/pushes/{int(push_id)}"
        return self._api.one(DatasetUploadPublic, "GET", path)

    def push_files(
        self, name: str, push_id: int, part: int, files: Sequence[tuple[str, int, Sequence[str]]]
    ) -> DatasetMissingChunks:
        """Send part `part` of the file list, (path, size, chunk hashes) for each file; the
        answer names the chunks to send."""
        path = f"/datasets/{path_part(name)}/pushes/{int(push_id)}/files/{int(part)}"
        body = json.dumps(
            {"files": [{"path": p, "size": n, "chunks": list(c)} for p, n, c in files]},
            separators=(",", ":"),
        ).encode()
        headers = {"Content-Type": "application/json"}
        return self._api.one(DatasetMissingChunks, "PUT", path, content=body, headers=headers)

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
