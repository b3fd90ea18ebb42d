"""A chunk pack's response goes to the server in pieces, and arrives whole."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from gpulease.server.routers.pieces import PIECE_BYTES, PiecesResponse

BODY = os.urandom(3 * PIECE_BYTES + 1234)


def sent_by(body: bytes) -> list[dict[str, Any]]:
    """The ASGI messages PiecesResponse(body) sends for a GET."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    asyncio.run(PiecesResponse(body, media_type="application/octet-stream")(scope, receive, send))
    return sent


def test_a_large_body_is_sent_in_pieces_none_larger_than_a_piece() -> None:
    start, *bodies = sent_by(BODY)
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-length", str(len(BODY)).encode()) in start["headers"]
    assert len(bodies) == 4
    assert all(len(m["body"]) <= PIECE_BYTES and isinstance(m["body"], bytes) for m in bodies)
    assert [m["more_body"] for m in bodies] == [True, True, True, False]
    assert b"".join(m["body"] for m in bodies) == BODY


@pytest.mark.parametrize("body", [b"", b"small", os.urandom(PIECE_BYTES)])
def test_a_body_of_a_piece_or_less_is_sent_at_once(body: bytes) -> None:
    start, *bodies = sent_by(body)
    assert (b"content-length", str(len(body)).encode()) in start["headers"]
    assert [m["body"] for m in bodies] == [body]
    assert not bodies[0].get("more_body", False)


def test_a_client_reads_the_pieces_as_one_body() -> None:
    async def pack(request: Request) -> PiecesResponse:
        return PiecesResponse(BODY, media_type="application/octet-stream")

    app = Starlette(routes=[Route("/pack", pack, methods=["POST"])])

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/pack")

    response = asyncio.run(fetch())
    assert response.status_code == 200
    assert response.headers["content-length"] == str(len(BODY))
    assert response.content == BODY
