"""Blob stores: local files and S3 (moto's server on 127.0.0.1), one contract for both."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulease.storage.blobs import BlobNotFound, BlobStore, FsBlobStore, S3BlobStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_store(endpoint: str, bucket: str, prefix: str = "") -> S3BlobStore:
    import boto3

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_bucket(Bucket=bucket)
    return S3BlobStore(bucket, prefix=prefix, client=client)


@pytest.fixture(params=["fs", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "fs":
        return FsBlobStore(tmp_path / "blobs")
    endpoint = request.getfixturevalue("s3_endpoint")
    return s3_store(endpoint, f"b-{abs(hash(str(tmp_path))) % 10**8}", prefix="gl/")


def test_put_get_exists_delete_iterate(store: BlobStore) -> None:
    store.put("u/1/abc/0001", b"one")
    store.put("u/1/def/0002", b"two")
    store.put("m/1/2/3", b"manifest")
    store.sync()
    assert store.get("u/1/abc/0001") == b"one"
    assert store.exists("m/1/2/3") and not store.exists("m/1/2/4")
    assert sorted(store.iterate("u/")) == ["u/1/abc/0001", "u/1/def/0002"]
    assert sorted(store.iterate()) == ["m/1/2/3", "u/1/abc/0001", "u/1/def/0002"]
    assert store.read_ranges("m/1/2/3", [(0, 3), (4, 4), (8, 0)]) == [b"man", b"fest", b""]
    with pytest.raises(BlobNotFound):
        store.read_ranges("m/1/2/3", [(6, 10)])
    store.put("u/1/abc/0001", b"replaced")  # idempotent: replaced whole
    assert store.get("u/1/abc/0001") == b"replaced"
    store.delete("u/1/abc/0001")
    store.delete("u/1/abc/0001")  # deleting what is gone is fine
    assert not store.exists("u/1/abc/0001")
    with pytest.raises(BlobNotFound, match="not in the store"):
        store.get("u/1/abc/0001")


def test_keys_are_checked(store: BlobStore) -> None:
    for bad in ("", "/abs", "a//b", "a/../b", "a/./b", "a\nb"):
        with pytest.raises(ValueError, match="not a valid blob key"):
            store.put(bad, b"x")


def test_fs_writes_are_atomic_and_private(tmp_path: Path) -> None:
    store = FsBlobStore(tmp_path / "blobs")
    barrier = threading.Barrier(4)

    def writer(n: int) -> None:
        barrier.wait()
        for _ in range(50):
            store.put("same/key", bytes([n]) * 10_000)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    data = store.get("same/key")
    assert len(set(data)) == 1 and len(data) == 10_000  # one writer's bytes, whole
    path = store.path_of("same/key")
    assert path.stat().st_mode & 0o077 == 0
    assert path.relative_to(store.root).parts[0] != "same"  # fanned out
    assert not list(store.root.rglob(".*.tmp"))


def test_the_server_runs_on_s3(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings choose the store; a push and a removal go through S3."""
    from gpulease.server.services.datasets.vault import make_store
    from gpulease.server.settings import Settings

    s3_store(s3_endpoint, "gpulease-data")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    settings = Settings(
        home=tmp_path,
        blob_store="s3",
        s3_bucket="gpulease-data",
        s3_endpoint_url=s3_endpoint,
        s3_region="us-east-1",
        s3_prefix="prod",
    )
    store = make_store(settings)
    assert isinstance(store, S3BlobStore)
    store.put("k/1", b"v")
    assert list(store.iterate()) == ["k/1"]
    with pytest.raises(ValueError, match="GPULEASE_S3_BUCKET"):
        Settings(home=tmp_path, blob_store="s3")


def test_fs_sync_fsyncs_this_threads_puts_and_skips_deleted_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    store = FsBlobStore(tmp_path / "blobs")
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store.put("p/1/kept", b"kept")
    store.put("p/1/gone", b"gone")
    store.delete("p/1/gone")
    elsewhere = threading.Thread(target=store.put, args=("p/2/other", b"other thread"))
    elsewhere.start()
    elsewhere.join()
    store.sync()
    kept = store.path_of("p/1/kept")
    assert str(kept) in synced and str(kept.parent) in synced
    assert not any("gone" in path or "other" in path for path in synced)
    synced.clear()
    store.sync()  # nothing new since
    assert synced == []


def _pieces(total: int, seed: int) -> list[bytes]:
    """Pieces of about 10 kB (sealed chunks of a pack) adding up to total bytes."""
    import random

    rng = random.Random(seed)
    pieces, left = [], total
    while left:
        size = min(left, rng.randrange(1, 20_000))
        pieces.append(rng.randbytes(size))
        left -= size
    return pieces


@pytest.mark.parametrize(
    "sizes",
    [
        [5_000],  # small: an ordinary put
        [(3 << 20) + 123, 1 << 20],  # large and unaligned, then a smaller one in the same buffer
        [2 << 20],  # whole blocks
    ],
)
def test_put_pieces_stores_the_pieces_joined(store: BlobStore, sizes: list[int]) -> None:
    for at, size in enumerate(sizes):
        pieces = _pieces(size, at)
        store.put_pieces(f"p/1/{at}", pieces)
        store.sync()
        whole = b"".join(pieces)
        assert store.get(f"p/1/{at}") == whole
        assert store.read_ranges(f"p/1/{at}", [(size - 7, 7), (0, 3)]) == [whole[-7:], whole[:3]]


def _direct_writes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each pwrite of the test went past the page cache (O_DIRECT set on its fd)."""
    import fcntl
    import os

    seen: list[bool] = []
    pwrite = os.pwrite

    def recording_pwrite(fd: int, data: object, offset: int) -> int:
        seen.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT))
        return pwrite(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "pwrite", recording_pwrite)
    return seen


def test_large_fs_blobs_are_written_past_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FsBlobStore(tmp_path / "blobs")
    direct = _direct_writes(monkeypatch)
    store.put_pieces("p/1/small", _pieces(100_000, 1))
    assert direct and not any(direct)
    direct.clear()
    store.put_pieces("p/1/large", _pieces((2 << 20) + 5, 2))
    assert direct and all(direct)
    assert store.path_of("p/1/large").stat().st_size == (2 << 20) + 5
    assert store.path_of("p/1/large").stat().st_mode & 0o077 == 0


def test_a_file_system_without_direct_writes_gets_ordinary_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import fcntl
    import os

    asked: list[int] = []
    real = fcntl.fcntl

    def refusing(fd: int, command: int, arg: int = 0) -> int:
        if command == fcntl.F_SETFL and arg & os.O_DIRECT:
            asked.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, command, arg)

    monkeypatch.setattr(fcntl, "fcntl", refusing)
    store = FsBlobStore(tmp_path / "blobs")
    for at in range(2):
        pieces = _pieces((1 << 20) + 999, at)
        store.put_pieces(f"p/1/{at}", pieces)
        assert store.get(f"p/1/{at}") == b"".join(pieces)
    assert len(asked) == 1  # refused once: the store does not ask again


def test_a_direct_write_refused_midway_is_finished_the_ordinary_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    store = FsBlobStore(tmp_path / "blobs")
    direct = _direct_writes(monkeypatch)
    recording = os.pwrite
    calls = 0

    def short_then_refusing(fd: int, data: memoryview, offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return recording(fd, data[: 1 << 20], offset)  # a short write, whole blocks
        if calls == 2:
            raise OSError(errno.EINVAL, "Invalid argument")
        return recording(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", short_then_refusing)
    pieces = _pieces((3 << 20) + 77, 3)
    store.put_pieces("p/1/x", pieces)
    assert store.get("p/1/x") == b"".join(pieces)
    assert direct[0] and not direct[-1]


def test_a_failed_large_put_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    store = FsBlobStore(tmp_path / "blobs")
    store.put_pieces("p/1/kept", _pieces(2 << 20, 4))

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError, match="No space"):
        store.put_pieces("p/1/lost", _pieces(2 << 20, 5))
    monkeypatch.undo()
    assert not store.exists("p/1/lost") and store.exists("p/1/kept")
    assert not list(store.root.rglob(".*.tmp"))
    store.put_pieces("p/1/again", _pieces(2 << 20, 6))  # its buffer went back for reuse
    assert store.exists("p/1/again")


def test_large_puts_from_several_threads_each_get_a_buffer(tmp_path: Path) -> None:
    store = FsBlobStore(tmp_path / "blobs")
    barrier = threading.Barrier(4)
    expected = {n: _pieces((1 << 20) + n * 4_097, 10 + n) for n in range(4)}

    def writer(n: int) -> None:
        barrier.wait()
        for round_ in range(3):
            store.put_pieces(f"p/{n}/{round_}", expected[n])

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for n, pieces in expected.items():
        for round_ in range(3):
            assert store.get(f"p/{n}/{round_}") == b"".join(pieces)
