"""Chunks and chunk packs."""

from __future__ import annotations

import gc
import hashlib
import threading
from pathlib import Path

import pytest

from gpulease.core.errors import InvalidInput
from gpulease.storage.chunking import (
    CHUNK_SIZE,
    PackError,
    check_records,
    chunk_digests,
    file_chunks,
    pack,
    read_chunk,
    unpack,
    unpack_checked,
    unpack_views,
    without_cyclic_gc,
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


def test_pack_views_without_copies_and_their_hash_check() -> None:
    records = [(hashlib.sha256(d).hexdigest(), d) for d in (b"one", b"", b"x" * 5000)]
    body = pack(records)
    views = list(unpack_views(body, max_records=3))
    assert [(digest.hex(), bytes(data)) for digest, data in views] == records
    assert all(isinstance(data, memoryview) and data.obj is body for _, data in views)
    check_records(views, "why")  # every record matches its hash
    assert list(unpack_checked(body, max_records=3, why="why")) == records
    with pytest.raises(PackError, match="more than 2 chunks"):
        list(unpack_views(body, max_records=2))
    bad = pack([(records[2][0], b"y" * 5000)])
    with pytest.raises(
        InvalidInput, match=f"chunk {records[2][0]} arrived with bytes that hash to"
    ):
        check_records(list(unpack_views(bad)), "why")
    with pytest.raises(InvalidInput, match="hash to .*: why"):
        list(unpack_checked(bad, max_records=None, why="why"))


def _two_threads_paused(first_out: int) -> None:
    inside = [threading.Event(), threading.Event()]
    leave = [threading.Event(), threading.Event()]
    seen: list[bool] = []

    def paused(me: int) -> None:
        with without_cyclic_gc():
            inside[me].set()
            leave[me].wait(5)
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=paused, args=(me,)) for me in (0, 1)]
    for me, thread in enumerate(threads):
        thread.start()
        assert inside[me].wait(5)
    assert not gc.isenabled()
    leave[first_out].set()
    threads[first_out].join(5)
    assert not gc.isenabled()  # the other one is still inside
    leave[1 - first_out].set()
    threads[1 - first_out].join(5)
    assert seen == [False, False] and gc.isenabled()


def test_threads_share_the_collectors_pause() -> None:
    """Two threads inside without_cyclic_gc at once, leaving in either order: the collector
    is off while either is inside and on again once both have left, never left off."""
    assert gc.isenabled()
    _two_threads_paused(first_out=0)
    _two_threads_paused(first_out=1)
    # and a collector that was off stays off
    gc.disable()
    try:
        with without_cyclic_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
