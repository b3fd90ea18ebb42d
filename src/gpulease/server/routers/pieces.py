"""A response with a large body (a chunk pack: up to tens of MB) sent in pieces."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

# About what a local socket takes in one send: a piece is written out whole, or nearly.
PIECE_BYTES = 256 * 1024


class PiecesResponse(Response):
    """Response(body) that hands its body to the server PIECE_BYTES at a time (its
    Content-Length set as for any body). Handed over whole, asyncio's socket transport
    keeps what the socket did not take at once (nearly all of 10 MB) by copying it twice,
    a slice and then its buffer, each a fresh allocation the size of the body; that was a
    quarter of the server's time while a runner fetched a dataset. In pieces, uvicorn waits
    for the socket to drain before writing the next one, so at most a piece is kept."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or len(self.body) <= PIECE_BYTES:
            await super().__call__(scope, receive, send)
            return
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        body = memoryview(self.body)
        for at in range(0, len(body), PIECE_BYTES):
            piece = bytes(body[at : at + PIECE_BYTES])
            more = at + PIECE_BYTES < len(body)
            await send({"type": "http.response.body", "body": piece, "more_body": more})
        if self.background is not None:
            await self.background()
