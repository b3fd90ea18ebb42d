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
from gpulease.server.routers.api.datasets import read_capped
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
