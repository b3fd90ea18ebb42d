"""The file list a runner materialises a dataset version from: blocks of files and chunk keys.

The server streams it (GET .../manifest) and the runner reads it block by block as it
arrives, fetching the chunks of the first files while the rest of the list is still on its
way. Everything is big-endian:

    list   = header block* end
    header = b"GLF1" | total files (uint64) | index of the first file sent (uint64)
    block  = files n (uint32) | chunks m (uint32) | path bytes p (uint32)
             | n sizes (uint64) | n chunk counts (uint32)
             | p bytes: the n UTF-8 paths, each followed by a NUL
             | m SHA-256 digests (32 bytes each) | m chunk keys (32 bytes each)
    end    = a block of 0 files, 0 chunks and 0 path bytes

A block's columns are read as a whole (struct and bytes.split do the per-file work in C).
Its chunks are its files' chunks in order, each beside its own AES-256 key.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

MEDIA_TYPE = "application/vnd.gpulease.file-list"
MAGIC = b"GLF1"
DIGEST_BYTES = 32
KEY_BYTES = 32
_HEADER = struct.Struct(">4sQQ")
_BLOCK = struct.Struct(">III")
END = _BLOCK.pack(0, 0, 0)
# Bounds a reader holds a block to before buffering it (a block is far smaller).
MAX_BLOCK_FILES = 1 << 16
MAX_BLOCK_CHUNKS = 1 << 20
MAX_PATH_BYTES = 4096


class FileListError(ValueError):
    """A file list that is cut short, oversized or otherwise malformed."""


class Block(NamedTuple):
    paths: list[str]
    sizes: tuple[int, ...]
    counts: tuple[int, ...]  # chunks of each file
    digests: bytes  # the block's chunks, DIGEST_BYTES each, file by file
    keys: bytes  # their keys, KEY_BYTES each, in the same order


def header(total: int, start: int) -> bytes:
    return _HEADER.pack(MAGIC, total, start)


def block(
    paths: Sequence[str], sizes: Sequence[int], counts: Sequence[int], digests: bytes, keys: bytes
) -> bytes:
    """One block of files; digests and keys hold sum(counts) chunks each."""
    names = "".join(path + "\0" for path in paths).encode()
    n, m = len(paths), len(digests) // DIGEST_BYTES
    return b"".join(
        (
            _BLOCK.pack(n, m, len(names)),
            struct.pack(f">{n}Q", *sizes),
            struct.pack(f">{n}I", *counts),
            names,
            digests,
            keys,
        )
    )


class Reader:
    """Reads a file list from the pieces of its body as they come (feed), handing out each
    block once it is whole. `files` counts the files of the blocks handed out: a list
    that broke off can be asked for again from there."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.total: int | None = None
        self.start = 0
        self.files = 0
        self.ended = False

    def feed(self, data: bytes) -> list[Block]:
        """The blocks that data completes; FileListError when the list is malformed."""
        if self.ended and data:
            raise FileListError("bytes after the end of the file list")
        self._buffer += data
        at = 0
        buffer = self._buffer
        found: list[Block] = []
        try:
            if self.total is None:
                if len(buffer) < _HEADER.size:
                    return found
                magic, self.total, self.start = _HEADER.unpack_from(buffer)
                if magic != MAGIC:
                    raise FileListError("not a gpulease file list (wrong format)")
                at = _HEADER.size
            while not self.ended and len(buffer) - at >= _BLOCK.size:
                n, m, p = _BLOCK.unpack_from(buffer, at)
                if n > MAX_BLOCK_FILES or m > MAX_BLOCK_CHUNKS or p > n * (MAX_PATH_BYTES + 1):
                    raise FileListError(f"a block of {n} files, {m} chunks is out of bounds")
                size = _BLOCK.size + 12 * n + p + (DIGEST_BYTES + KEY_BYTES) * m
                if len(buffer) - at < size:
                    break
                if n == 0:
                    if m or p:
                        raise FileListError("the end of the file list holds data")
                    self.ended = True
                    at += size
                    break
                found.append(_read_block(bytes(buffer[at : at + size]), n, m, p))
                at += size
                self.files += n
            if self.ended and len(buffer) > at:
                raise FileListError("bytes after the end of the file list")
        finally:
            del buffer[:at]
        return found


def _read_block(data: bytes, n: int, m: int, p: int) -> Block:
    at = _BLOCK.size
    sizes = struct.unpack_from(f">{n}Q", data, at)
    at += 8 * n
    counts = struct.unpack_from(f">{n}I", data, at)
    at += 4 * n
    if sum(counts) != m:
        raise FileListError(f"a block's files have {sum(counts)} chunks, not {m}")
    names = data[at : at + p]
    at += p
    if not names.endswith(b"\0"):
        raise FileListError("a block's paths do not end with a NUL")
    try:
        paths = names[:-1].decode().split("\0")
    except UnicodeDecodeError as exc:
        raise FileListError(f"a path is not UTF-8: {exc}") from None
    if len(paths) != n:
        raise FileListError(f"a block of {n} files names {len(paths)}")
    digests = data[at : at + DIGEST_BYTES * m]
    keys = data[at + DIGEST_BYTES * m :]
    return Block(paths, sizes, counts, digests, keys)
