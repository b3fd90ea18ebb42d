"""Large request bodies go to httpx in pieces, their length declared."""

from __future__ import annotations

import os
import socket
import threading

from gpulease.client.bodies import PIECE_BYTES, as_pieces
from gpulease.runner.connection import Connection


def test_a_small_body_is_sent_as_it_is() -> None:
    headers: dict[str, str] = {}
    body = b"x" * PIECE_BYTES
    assert as_pieces(body, headers) is body
    assert headers == {}


def test_a_large_body_goes_in_pieces_and_declares_its_length() -> None:
    headers = {"Authorization": "Bearer t"}
    body = os.urandom(3 * PIECE_BYTES + 17)
    pieces = list(as_pieces(body, headers))
    assert headers == {"Authorization": "Bearer t", "Content-Length": str(len(body))}
    assert [len(piece) for piece in pieces] == [PIECE_BYTES] * 3 + [17]
    assert b"".join(pieces) == body


class _SlowReader:
    """A real HTTP/1.1 server on loopback that reads each request through a small receive
    buffer, 64 KiB at a time (the client's sends of 256 KiB pieces come back partial), and
    records the request's head and body."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[tuple[bytes, bytes]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 128 * 1024)
                stream = client.makefile("rb")
                while (head := self._head(stream)) is not None:
                    length = int(_header(head, b"content-length") or b"0")
                    body = bytearray()
                    while len(body) < length:
                        body += stream.read1(min(64 * 1024, length - len(body)))
                    self.requests.append((head, bytes(body)))
                    client.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")

    @staticmethod
    def _head(stream: object) -> bytes | None:
        lines = []
        while (line := stream.readline()) not in (b"\r\n", b""):  # type: ignore[attr-defined]
            lines.append(line)
        return b"".join(lines) if lines else None

    def close(self) -> None:
        self.listener.close()


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def test_the_sdk_and_the_runner_send_large_bodies_whole_and_unchunked() -> None:
    server = _SlowReader()
    body = os.urandom(2 * 1024 * 1024 + 3)
    try:
        from gpulease.client.base import Transport

        sdk = Transport(f"http://127.0.0.1:{server.port}", "glp_token")
        try:
            sdk.send("POST", "/datasets/cats/pushes/1/chunks", content=body)
        finally:
            sdk.close()
        runner = Connection(f"http://127.0.0.1:{server.port}", "glr_token", on_stop=print)
        try:
            answer = runner.call("POST", "/runner/v1/workspace/chunks", content=body, retry=False)
            assert answer.status_code == 200
        finally:
            runner.close()
    finally:
        server.close()
    assert len(server.requests) == 2
    for head, received in server.requests:
        assert _header(head, b"content-length") == str(len(body)).encode()
        assert _header(head, b"transfer-encoding") is None
        assert received == body
