"""The API refuses a state change carried by the console's cookie unless it came from here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.requests import HTTPConnection
from starlette.testclient import TestClient

from factories import Caller
from gpulease.server.routers.deps import SESSION_COOKIE, same_origin


@pytest.fixture
def cookie_client(http: TestClient, ann: Caller) -> Iterator[TestClient]:
    """A browser holding ann's session cookie and no bearer token."""
    client = TestClient(http.app, cookies={SESSION_COOKIE: ann.token})
    yield client
    client.close()


def test_a_cookie_state_change_without_origin_or_referer_is_refused(
    cookie_client: TestClient,
) -> None:
    r = cookie_client.post("/api/v1/teams", json={"name": "sneaky"})
    assert r.status_code == 403
    assert "neither an Origin nor a Referer" in r.json()["detail"]
    assert cookie_client.get("/api/v1/teams").json() == []


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "https://evil.example"}, {"Origin": "null"}, {"Referer": "https://evil.example/"}],
)
def test_a_cookie_state_change_from_another_site_is_refused(
    cookie_client: TestClient, headers: dict[str, str]
) -> None:
    r = cookie_client.post("/api/v1/teams", json={"name": "x"}, headers=headers)
    assert r.status_code == 403 and "another site" in r.json()["detail"]


@pytest.mark.parametrize(
    "headers", [{"Origin": "http://testserver"}, {"Referer": "http://testserver/tokens"}]
)
def test_a_cookie_state_change_from_this_site_is_accepted(
    cookie_client: TestClient, headers: dict[str, str]
) -> None:
    r = cookie_client.post("/api/v1/teams", json={"name": "ok"}, headers=headers)
    assert r.status_code == 201, r.text


def test_a_bearer_token_needs_no_origin(ann: Caller) -> None:
    assert ann.post("/api/v1/teams", json={"name": "cli"}).status_code == 201


def _connection(headers: dict[str, str], kind: str = "http") -> HTTPConnection:
    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": "gpu.example", **headers}.items()]
    return HTTPConnection({"type": kind, "headers": raw, "path": "/", "query_string": b""})


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_one_origin_check_serves_requests_and_websockets(kind: str) -> None:
    assert same_origin(_connection({"origin": "https://gpu.example"}, kind))
    assert not same_origin(_connection({"origin": "https://gpu.example.evil"}, kind))
    assert not same_origin(_connection({"origin": "null"}, kind))
    assert same_origin(_connection({}, kind))
    assert not same_origin(_connection({}, kind), require_header=True)
