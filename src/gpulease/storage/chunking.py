"""Files as content-addressed chunks, and the chunk packs that carry many chunks per request.

A file is cut into fixed CHUNK_SIZE pieces (a small file is one chunk, an empty file none);
a chunk's id is the SHA-256 of its plaintext. A pack is records of
`sha256 (32 bytes) | length (uint32, big-endian) | data`, back to back: uploads carry
plaintext, downloads to runners carry the stored (encrypted) bytes.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from gpulease.core.errors import InvalidInput

CHUNK_SIZE = 4 * 1024 * 1024
_HEADER = struct.Struct(">32sI")
HEADER_SIZE = _HEADER.size
# A record's data may be a chunk or its ciphertext (a chunk plus 29 bytes of envelope).
MAX_RECORD_BYTES = CHUNK_SIZE + 1024


class PackError(ValueError):
    """A chunk pack that is cut short, oversized or otherwise malformed."""


class ChunkRef(NamedTuple):  # a tuple: 100,000 of them are made per push
    sha256: str  # hex
    size: int


def chunk_digests(data: bytes) -> list[ChunkRef]:
    """The chunks of data (a whole file's bytes)."""
    refs = []
    for at in range(0, len(data), CHUNK_SIZE):
        block = data[at : at + CHUNK_SIZE]
        refs.append(ChunkRef(hashlib.sha256(block).hexdigest(), len(block)))
    return refs


def file_chunks(path: str | Path) -> list[ChunkRef]:
    """The chunks of a file, read CHUNK_SIZE at a time."""
    refs = []
    with open(path, "rb") as source:
        while block := source.read(CHUNK_SIZE):
            refs.append(ChunkRef(hashlib.sha256(block).hexdigest(), len(block)))
    return refs


def read_chunk(path: str | Path, index: int) -> bytes:
    """The index-th chunk of a file."""
    with open(path, "rb") as source:
        source.seek(index * CHUNK_SIZE)
        return source.read(CHUNK_SIZE)


def pack(records: Iterable[tuple[str, bytes]]) -> bytes:
    """Records (sha256 hex, data) as one pack body."""
    parts = []
    for sha, data in records:
        parts.append(_HEADER.pack(bytes.fromhex(sha), len(data)))
        parts.append(data)
    return b"".join(parts)


def unpack(
    body: bytes | bytearray | memoryview, *, max_records: int | None = None
) -> Iterator[tuple[str, bytes]]:
    """The (sha256 hex, data) records of a pack body; PackError when it is malformed."""
    for digest, data in unpack_views(body, max_records=max_records):
        yield digest.hex(), bytes(data)


def unpack_views(
    body: bytes | bytearray | memoryview, *, max_records: int | None = None
) -> Iterator[tuple[bytes, memoryview]]:
    """unpack() without a copy: each record's raw 32-byte SHA-256 and a view of its data in
    body (hashlib and AES-GCM take views: a 16 MB pack is not copied chunk by chunk)."""
    view = memoryview(body)
    at = 0
    count = 0
    while at < len(view):
        if len(view) - at < HEADER_SIZE:
            raise PackError(f"chunk pack cut short at byte {at}: a record header needs 36 bytes")
        digest, length = _HEADER.unpack_from(view, at)
        at += HEADER_SIZE
        if length > MAX_RECORD_BYTES:
            raise PackError(f"chunk pack record of {length} bytes is larger than a chunk")
        if len(view) - at < length:
            raise PackError(f"chunk pack cut short: a record needs {length} bytes")
        count += 1
        if max_records is not None and count > max_records:
            raise PackError(f"chunk pack holds more than {max_records} chunks")
        yield digest, view[at : at + length]
        at += length


def check_records(records: Sequence[tuple[bytes, memoryview | bytes]], why: str) -> None:
    """Each (raw SHA-256, data) record's data checked against its hash; the first mismatch
    is InvalidInput "chunk SHA arrived with bytes that hash to ACTUAL: WHY"."""
    sha256 = hashlib.sha256
    for digest, data in records:
        actual = sha256(data).digest()
        if actual != digest:
            raise InvalidInput(
                f"chunk {digest.hex()} arrived with bytes that hash to {actual.hex()}: {why}"
            )


def unpack_checked(
    body: bytes | bytearray | memoryview, *, max_records: int | None, why: str
) -> Iterator[tuple[str, bytes]]:
    """unpack(), each record's data checked against its SHA-256 (check_records)."""
    for digest, data in unpack_views(body, max_records=max_records):
        check_records(((digest, data),), why)
        yield digest.hex(), bytes(data)


@contextlib.contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off for a while, for the bulk work on a tree of 100,000
    files (a push's scan, a runner's or the server's manifest): it makes hundreds of
    thousands of tuples and no cycles, and the collections those set off, each going through
    every object the process holds, took longer than the work itself. The collector is a
    process's own, so threads share the pause: it is off while any thread is inside, and
    back on, if it was on when the first came in, once the last one leaves (a plain
    disable and enable per thread could leave it off for good when two overlap)."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


_gc_lock = threading.Lock()
_gc_pauses = 0  # threads inside without_cyclic_gc
_gc_was_enabled = False  # the collector's state when the first of them came in
