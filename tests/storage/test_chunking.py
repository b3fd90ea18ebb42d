"""Chunks and chunk packs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpulease.storage.chunking import (
    CHUNK_SIZE,
    PackError,
    chunk_digests,
    file_chunks,
    pack,
    read_chunk,
    unpack,
)


def test_files_are_cut_into_fixed_chunks(tmp_path: Path) -> None:
    data = b"a" * CHUNK_SIZE + b"b" * 10
    path = tmp_path / "f"
    path.write_bytes(data)
    refs = file_chunks(path)
    assert refs == chunk_digests(data)
    assert [r.size for r in refs] == [CHUNK_SIZE, 10]
    assert refs[1].sha256 == hashlib.sha256(b"b" * 10).hexdigest()
    assert read_chunk(path, 1) == b"b" * 10
    assert chunk_digests(b"") == []
    assert [r.size for r in chunk_digests(b"small")] == [5]


def test_packs_round_trip_and_refuse_garbage() -> None:
    records = [(hashlib.sha256(d).hexdigest(), d) for d in (b"one", b"", b"three" * 1000)]
    assert list(unpack(pack(records))) == records
    body = pack(records)
    with pytest.raises(PackError, match="cut short"):
        list(unpack(body[:-1]))
    with pytest.raises(PackError, match="header"):
        list(unpack(body + b"\x00"))
    with pytest.raises(PackError, match="more than 2"):
        list(unpack(body, max_records=2))
    with pytest.raises(PackError, match="larger than a chunk"):
        list(unpack(b"\x00" * 32 + (CHUNK_SIZE * 2).to_bytes(4, "big")))
