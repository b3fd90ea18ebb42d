"""The runner's HTTP calls: token, retry with backoff, 401 and 409 (httpx MockTransport)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gpulease.runner.connection import Aborted, Connection, ServerGone, Unreachable

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
