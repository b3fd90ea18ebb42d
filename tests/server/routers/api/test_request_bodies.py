"""Large request bodies (chunk packs, file list parts): read whole, capped, and refused in
words when they are too large or do not match their declared length."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator

import pytest
from starlette.requests import Request
from starlette.types import Message

from factories import Caller
from gpulease.core.errors import InvalidInput
from gpulease.server.routers.api import datasets
from gpulease.server.routers.api.datasets import pack_body, read_capped
from gpulease.storage.buffers import BufferPool
from gpulease.storage.chunking import pack


def _request(pieces: list[bytes], length: int | None) -> Request:
    """A Starlette request whose body arrives as the ASGI server hands it over: in pieces."""
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    messages = [
        {"type": "http.request", "body": piece, "more_body": at < len(pieces) - 1}
        for at, piece in enumerate(pieces)
    ] or [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Message:
        return messages.pop(0)

    return Request(scope, receive)


def _read(pieces: list[bytes], length: int | None, limit: int = 100) -> bytes:
    return bytes(asyncio.run(read_capped(_request(pieces, length), limit, "a chunk pack")))


@pytest.mark.parametrize("length", [None, 11])
def test_a_body_in_pieces_is_read_whole(length: int | None) -> None:
    assert _read([b"hello", b" ", b"world"], length) == b"hello world"
    assert _read([], 0 if length else None) == b""


def test_a_body_over_the_cap_is_refused_before_it_is_read() -> None:
    with pytest.raises(InvalidInput, match="at most 100 bytes; send smaller ones"):
        _read([b"x" * 200], 200)
    with pytest.raises(InvalidInput, match="at most 100 bytes"):  # no length declared
        _read([b"x" * 60, b"x" * 60], None)


def test_a_body_that_does_not_match_its_length_is_refused() -> None:
    with pytest.raises(InvalidInput, match="longer than its Content-Length of 5 bytes"):
        _read([b"abc", b"def"], 5)
    with pytest.raises(InvalidInput, match="ended after 3 of its 5 bytes; send it again"):
        _read([b"abc"], 5)


def _read_pack(pieces: list[bytes], length: int | None, limit: int = 100) -> bytes:
    async def read() -> bytes:
        async with pack_body(_request(pieces, length), limit, "a chunk pack") as view:
            assert isinstance(view, memoryview)
            return bytes(view)

    return asyncio.run(read())


def test_a_pack_is_read_into_a_kept_buffer_and_a_smaller_one_sees_only_its_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = BufferPool(keep=1, keep_bytes=16 << 20)
    monkeypatch.setattr(datasets, "_PACK_BODIES", pool)
    assert _read_pack([b"hello", b" ", b"world"], 11) == b"hello world"
    assert pool.kept() == 1
    assert _read_pack([b"abc"], 3) == b"abc"  # the same buffer, "hello world" still in it
    assert _read_pack([], 0) == b""
    assert _read_pack([b"no", b" length"], None) == b"no length"
    with pytest.raises(InvalidInput, match="at most 100 bytes"):
        _read_pack([b"x" * 200], 200)
    with pytest.raises(InvalidInput, match="ended after 3 of its 5 bytes"):
        _read_pack([b"abc"], 5)
    with pytest.raises(InvalidInput, match="longer than its Content-Length of 5 bytes"):
        _read_pack([b"abc", b"def"], 5)
    assert pool.kept() == 1  # a refused body gives its buffer back too


def test_a_view_kept_past_the_block_keeps_its_buffer_out_of_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = BufferPool(keep=2, keep_bytes=16 << 20)
    monkeypatch.setattr(datasets, "_PACK_BODIES", pool)

    async def keep_a_view() -> memoryview:
        async with pack_body(_request([b"secret"], 6), 100, "a chunk pack") as view:
            return view[1:4]  # a slice outlives the block, as a traceback's frame may

    kept = asyncio.run(keep_a_view())
    assert pool.kept() == 0
    assert _read_pack([b"xxxxxx"], 6) == b"xxxxxx"
    assert bytes(kept) == b"ecr"


def test_a_pack_sent_in_chunked_encoding_is_taken_as_one_with_a_length(ann: Caller) -> None:
    """The same pack with a Content-Length and without one (a streamed upload)."""
    data = [b"abc", b"defg"]
    files = [
        {"path": f"f{i}", "size": len(d), "chunks": [hashlib.sha256(d).hexdigest()]}
        for i, d in enumerate(data)
    ]
    push = ann.post("/api/v1/datasets/set/pushes", json={"name": "set", "files": 2, "bytes": 7})
    url = f"/api/v1/datasets/set/pushes/{push.json()['id']}"
    assert ann.put(f"{url}/files/0", json={"files": files}).status_code == 200
    body = pack([(hashlib.sha256(d).hexdigest(), d) for d in data])

    def streamed() -> Iterator[bytes]:
        yield body[:10]
        yield body[10:]

    r = ann.post(f"{url}/chunks", content=streamed())
    assert r.status_code == 200 and r.json() == {"chunks": 2, "bytes": 7, "new_chunks": 2}
    r = ann.post(f"{url}/chunks", content=body)
    assert r.status_code == 200 and r.json() == {"chunks": 2, "bytes": 7, "new_chunks": 0}
    r = ann.post(f"{url}/commit", json={"parts": 1, "files": 2, "bytes": 7})
    assert r.status_code == 201, r.text


def test_packs_of_several_sizes_one_after_another_are_each_checked_and_stored(
    ann: Caller,
) -> None:
    """Each pack lands in a buffer a larger one used before it: every chunk's SHA-256 is
    checked on the bytes the server took, so a stale byte would be refused."""
    data = [bytes([n]) * size for n, size in enumerate((300_000, 5, 120_000, 1))]
    files = [
        {"path": f"f{i}", "size": len(d), "chunks": [hashlib.sha256(d).hexdigest()]}
        for i, d in enumerate(data)
    ]
    total = sum(len(d) for d in data)
    push = ann.post("/api/v1/datasets/mix/pushes", json={"name": "mix", "files": 4, "bytes": total})
    url = f"/api/v1/datasets/mix/pushes/{push.json()['id']}"
    assert ann.put(f"{url}/files/0", json={"files": files}).status_code == 200
    for d in data:
        r = ann.post(f"{url}/chunks", content=pack([(hashlib.sha256(d).hexdigest(), d)]))
        assert r.status_code == 200, r.text
        assert r.json() == {"chunks": 1, "bytes": len(d), "new_chunks": 1}
    bad = pack([(hashlib.sha256(data[1]).hexdigest(), b"\x07" * 5)])
    r = ann.post(f"{url}/chunks", content=bad)
    assert r.status_code == 422 and "hash to" in r.text
    r = ann.post(f"{url}/commit", json={"parts": 1, "files": 4, "bytes": total})
    assert r.status_code == 201, r.text
