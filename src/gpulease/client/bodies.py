"""Large request bodies (chunk packs of tens of MB) handed to httpx in pieces.

Handed over whole, httpcore sends a body with `send()` and, after each send that the socket
took only part of, slices the unsent rest: a copy of up to the whole body into new memory
every time, which a server busy with the pack before makes happen dozens of times a pack.
In pieces of 256 KiB, the body is copied once (h11 copies each piece it frames anyway), and
a partial send leaves at most one piece to slice. The length is declared, so the body goes
out as it is, not chunked.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping

PIECE_BYTES = 256 * 1024


def as_pieces(content: bytes, headers: MutableMapping[str, str]) -> bytes | Iterator[bytes]:
    """content as httpx should get it: a body of more than PIECE_BYTES in pieces, its
    Content-Length set in headers; a smaller one as it is."""
    if len(content) <= PIECE_BYTES:
        return content
    headers["Content-Length"] = str(len(content))
    return (content[at : at + PIECE_BYTES] for at in range(0, len(content), PIECE_BYTES))
