"""The push client's file reading: chunks as scanned, and a file that changed size since
its scan refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpulease.client.datasets import DatasetError, _hash_file, scan_directory
from gpulease.storage.chunking import CHUNK_SIZE

KEPT = 64 * 1024  # files up to this size are kept in memory until they are sent


@pytest.mark.parametrize("size", [0, 1, 10_000, KEPT, KEPT + 1, CHUNK_SIZE + 17])
def test_a_file_is_cut_into_its_chunks(tmp_path: Path, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    (tmp_path / "f.bin").write_bytes(data)
    [local] = scan_directory(tmp_path)
    refs, kept = _hash_file(local)
    pieces = [data[at : at + CHUNK_SIZE] for at in range(0, size, CHUNK_SIZE)]
    assert [(r.sha256, r.size) for r in refs] == [
        (hashlib.sha256(p).hexdigest(), len(p)) for p in pieces
    ]
    assert kept == (data if size <= KEPT else None)


@pytest.mark.parametrize("now", [b"01234", b"0123456789 and more"])
def test_a_file_that_changed_size_since_the_scan_is_refused(tmp_path: Path, now: bytes) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    [local] = scan_directory(tmp_path)
    path.write_bytes(now)
    with pytest.raises(DatasetError, match="changed while it was being pushed"):
        _hash_file(local)
