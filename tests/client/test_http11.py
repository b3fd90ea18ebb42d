"""The quick path's HTTP/1.1 client (client/http11.py) against answers written byte by byte:
each framing of a body, the answers it must refuse, and what it sends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from gpulease.client.http11 import MAX_HEADERS, Answer, HttpError, exchange


class Peer:
    """The server's end of a socket pair: it reads the request's head, then sends `answer`
    in the pieces given (each its own send), then closes unless told to stay open."""

    def __init__(self, *pieces: bytes, stay_open: bool = False) -> None:
        self.client, self.server = socket.socketpair()
        self.client.settimeout(10)
        self.request = b""
        self._pieces = pieces
        self._stay_open = stay_open
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while b"\r\n\r\n" not in self.request:
            data = self.server.recv(65536)
            if not data:
                return
            self.request += data
        for piece in self._pieces:
            self.server.sendall(piece)
        if not self._stay_open:
            self.server.close()

    def ask(self, method: str = "GET", body: bytes | None = None) -> Answer:
        return exchange(self.client, method, "box:8420", "/api/v1/x", {"Accept": "*/*"}, body)


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    made: list[Peer] = []
    yield made
    for peer in made:
        peer.client.close()
        peer.server.close()


def peer(peers: list[Peer], *pieces: bytes, stay_open: bool = False) -> Peer:
    made = Peer(*pieces, stay_open=stay_open)
    peers.append(made)
    return made


def test_the_request_is_one_http11_head_with_its_body(peers: list[Peer]) -> None:
    p = peer(peers, b"HTTP/1.1 204 No Content\r\n\r\n")
    answer = p.ask("POST", b'{"a": 1}')
    assert (answer.status, answer.reason, answer.read()) == (204, "No Content", b"")
    p.thread.join(5)
    head, _, body = p.request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /api/v1/x HTTP/1.1"
    assert {"Host: box:8420", "Connection: close", "Accept: */*", "Content-Length: 8"} <= set(lines)
    assert body == b'{"a": 1}'


def test_a_body_of_a_content_length(peers: list[Peer]) -> None:
    p = peer(
        peers, b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nX-A: 1\r\nx-a: 2\r\n\r\n", b"hello world"
    )
    answer = p.ask()
    assert answer.headers == {"content-length": "11", "x-a": "1, 2"}
    assert answer.read() == b"hello world" and answer.read() == b""


def test_a_chunked_body_is_read_line_by_line_as_it_comes(peers: list[Peer]) -> None:
    p = peer(
        peers,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"7;ext=1\r\nevent: \r\n",
        b"5\r\nrun\nd\r\n",
        b"4\r\nata:\r\n3\r\n 1\n\r\n0\r\nTrailer: x\r\n\r\n",
        stay_open=True,  # the end is the last chunk, not the connection's close
    )
    answer = p.ask()
    lines = [answer.readline() for _ in range(4)]
    assert lines == [b"event: run\n", b"data: 1\n", b"", b""]


def test_a_body_until_the_connection_closes(peers: list[Peer]) -> None:
    p = peer(peers, b"HTTP/1.0 200 OK\r\n\r\n", b"line 1\n", b"line 2")
    answer = p.ask()
    assert [answer.readline(), answer.readline(), answer.readline()] == [
        b"line 1\n",
        b"line 2",
        b"",
    ]


def test_interim_answers_are_skipped_and_folded_fields_joined(peers: list[Peer]) -> None:
    p = peer(
        peers,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
        b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\nX-Why: one\r\n two\r\n\r\n{}",
    )
    answer = p.ask()
    assert (answer.status, answer.headers["x-why"], answer.read()) == (409, "one two", b"{}")


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "a malformed header field"),
        (b"HTTP/1.1 200 OK\r\nX : spaced\r\n\r\n", "a malformed header field"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * (MAX_HEADERS + 1) + b"\r\n", "more than"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "longer than"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "transfer coding"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", "closed before the answer's head ended"),
        (b"", "closed before the answer's head ended"),
    ],
)
def test_a_head_that_is_not_http11_is_refused(
    peers: list[Peer], answer: bytes, problem: str
) -> None:
    with pytest.raises(HttpError, match=problem):
        peer(peers, answer).ask()


@pytest.mark.parametrize(
    ("head", "body", "problem"),
    [
        (b"Content-Length: 10", b"short", "ended 5 bytes early"),
        (b"Transfer-Encoding: chunked", b"zz\r\nhello\r\n0\r\n\r\n", "malformed chunk size"),
        (b"Transfer-Encoding: chunked", b"a\r\nhello", "ended inside a chunk"),
        (b"Transfer-Encoding: chunked", b"3\r\nhello\r\n0\r\n\r\n", "does not end where"),
        (b"Transfer-Encoding: chunked", b"5\r\nhello", "before the answer's body ended"),
    ],
)
def test_a_body_cut_short_or_misframed_is_refused(
    peers: list[Peer], head: bytes, body: bytes, problem: str
) -> None:
    answer = peer(peers, b"HTTP/1.1 200 OK\r\n" + head + b"\r\n\r\n" + body).ask()
    with pytest.raises(HttpError, match=problem):
        answer.read()


def test_a_line_break_in_the_request_head_is_refused_before_anything_is_sent() -> None:
    client, server = socket.socketpair()
    with client, server:
        for headers, target in (({"Authorization": "Bearer x\r\nX-Evil: 1"}, "/a"), ({}, "/a\n")):
            with pytest.raises(ValueError, match="line break"):
                exchange(client, "GET", "box", target, headers)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.recv(1)
