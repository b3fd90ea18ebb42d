"""The runner's HTTP calls: token, retry with backoff, 401 and 409 (httpx MockTransport)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gpulease.runner.connection import Aborted, Connection, ServerGone, Unreachable, tls_verify

Handler = Callable[[httpx.Request], httpx.Response]


def connect(handler: Handler, stops: list[str]) -> Connection:
    return Connection(
        "http://server/prefix",
        "tok",
        on_stop=stops.append,
        transport=httpx.MockTransport(handler),
        backoff_start_s=0.01,
        backoff_max_s=0.02,
    )


def test_retries_through_outages_until_answered() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        if len(seen) < 4:
            return httpx.Response(503)
        return httpx.Response(204)

    stops: list[str] = []
    response = connect(handler, stops).call("POST", "/runner/v1/ready", json={"pid": 1})

    assert response.status_code == 204
    assert len(seen) == 4
    assert seen[-1].url == "http://server/prefix/runner/v1/ready"
    assert seen[-1].headers["authorization"] == "Bearer tok"
    assert stops == []


def test_401_means_gone_for_this_and_every_later_call() -> None:
    stops: list[str] = []
    connection = connect(lambda request: httpx.Response(401), stops)

    with pytest.raises(ServerGone):
        connection.call("POST", "/runner/v1/heartbeat", json={})
    with pytest.raises(ServerGone):
        connection.call("POST", "/runner/v1/stopped", json={})
    assert connection.gone.is_set()
    assert len(stops) == 1 and "401" in stops[0]


def test_409_asks_to_stop_and_returns() -> None:
    stops: list[str] = []
    response = connect(lambda request: httpx.Response(409), stops).call("POST", "/x", json={})

    assert response.status_code == 409
    assert len(stops) == 1 and "409" in stops[0]


def test_a_single_attempt_reports_unreachable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(Unreachable, match="ConnectError"):
        connect(handler, []).call("POST", "/x", json={}, retry=False)


def test_abort_ends_the_retries() -> None:
    abort = threading.Event()
    attempts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        if len(attempts) == 3:
            abort.set()
        return httpx.Response(502)

    with pytest.raises(Aborted):
        connect(handler, []).call("GET", "/x", abort=abort)
    assert len(attempts) == 3


def test_download_streams_to_a_file(tmp_path: Path) -> None:
    answers = iter([httpx.Response(503), httpx.Response(200, content=b"tarball")])
    target = tmp_path / "w.tar"

    response = connect(lambda request: next(answers), []).call("GET", "/w", download_to=target)

    assert response.status_code == 200
    assert target.read_bytes() == b"tarball"


class SessionServer:
    """Knows one token at a time, as the server does (POST /runner/v1/session moves it)."""

    def __init__(self, token: str = "tok") -> None:
        self.token = token
        self.lose_next_session_answer = False
        self.seen: list[tuple[str, str]] = []  # (path, bearer)
        self.on_heartbeat: Callable[[], None] = lambda: None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        bearer = request.headers["authorization"].removeprefix("Bearer ")
        path = request.url.path.removeprefix("/prefix/runner/v1/")
        self.seen.append((path, bearer))
        if bearer != self.token:
            return httpx.Response(401)
        if path == "session":
            self.token = json.loads(request.content)["token"]
            if self.lose_next_session_answer:
                self.lose_next_session_answer = False
                raise httpx.ReadError("connection reset", request=request)
            return httpx.Response(204)
        if path == "heartbeat":
            self.on_heartbeat()
        return httpx.Response(200, json={"action": "continue"})


def test_a_session_replaces_the_launch_secret_in_every_later_call() -> None:
    server = SessionServer()
    stops: list[str] = []
    conn = connect(server, stops)
    conn.open_session()

    assert conn.token != "tok" and conn.token == server.token
    assert conn.call("POST", "/runner/v1/heartbeat", json={}).status_code == 200
    assert server.seen[-1] == ("heartbeat", server.token)
    conn.open_session()  # the server came back: a new session again
    assert server.seen[-1][0] == "session" and conn.token == server.token
    assert stops == []


def test_a_lost_session_answer_is_recovered_with_the_new_token() -> None:
    server = SessionServer()
    server.lose_next_session_answer = True  # the server took it, then the answer was lost
    conn = connect(server, [])
    conn.open_session()

    assert conn.token == server.token != "tok"
    assert [bearer == "tok" for path, bearer in server.seen] == [True, True, False]
    assert conn.call("POST", "/runner/v1/heartbeat", json={}).status_code == 200


def test_a_call_out_during_a_new_session_is_asked_again_with_the_new_token() -> None:
    server = SessionServer()
    stops: list[str] = []
    conns: list[Connection] = []

    def stale_heartbeat(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/heartbeat") and server.token == "tok":
            # Another thread opens a session while this call is out: its token is retired.
            rotation = threading.Thread(target=conns[0].open_session)
            rotation.start()
            rotation.join()
            return httpx.Response(401)
        return server(request)

    conns.append(connect(stale_heartbeat, stops))
    response = conns[0].call("POST", "/runner/v1/heartbeat", json={})

    assert response.status_code == 200 and stops == [] and not conns[0].gone.is_set()
    assert server.seen[-1] == ("heartbeat", conns[0].token)


def test_a_released_instance_opens_no_session() -> None:
    server = SessionServer(token="someone-else")
    stops: list[str] = []
    conn = connect(server, stops)
    with pytest.raises(ServerGone):
        conn.open_session()
    assert conn.gone.is_set() and len(stops) == 1
    assert [path for path, _ in server.seen] == ["session", "session"]  # old, then new token


def test_only_an_https_server_is_verified_and_a_pinned_certificate_is_trusted_alone(
    tmp_path: Path,
) -> None:
    import ssl
    import subprocess

    assert tls_verify("http://127.0.0.1:8420", None) is False  # nothing to verify
    assert tls_verify("https://gpu.example.org", None) is True
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=gpu",
         "-keyout", str(key), "-out", str(cert), "-days", "1"],
        check=True, capture_output=True,
    )  # fmt: skip
    pinned = tls_verify("https://gpu.example.org", cert.read_text())
    assert isinstance(pinned, ssl.SSLContext) and pinned.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in pinned.get_ca_certs()] == [((("commonName", "gpu"),),)]


class Pieces(httpx.SyncByteStream):
    """A response body that arrives in pieces, as a socket hands it over."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces


LARGE = bytes(range(256)) * (3 * 4096)  # 3 MiB: a chunk pack's size, read into one buffer


def test_a_large_body_is_read_whole() -> None:
    pieces = [LARGE[at : at + 65536] for at in range(0, len(LARGE), 65536)]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-length": str(len(LARGE))}, stream=Pieces(pieces)
        )

    response = connect(handler, []).call("POST", "/runner/v1/datasets/1/versions/1/chunks")
    assert response.status_code == 200 and response.content == LARGE
    # The buffer it was read into is the body: no bytes copy of it is made.
    assert isinstance(response.content, bytearray)
    assert response.read() is response.content


def test_a_large_body_cut_short_or_overlong_is_asked_for_again() -> None:
    sent: list[bytes] = [LARGE[:-1], LARGE + b"x", LARGE]

    def handler(request: httpx.Request) -> httpx.Response:
        body = sent.pop(0)
        return httpx.Response(
            200, headers={"content-length": str(len(LARGE))}, stream=Pieces([body])
        )

    response = connect(handler, []).call("POST", "/runner/v1/datasets/1/versions/1/chunks")
    assert response.content == LARGE and sent == []
