"""JupyterLab on an origin of its own: the console sends its owner there with a one-use
ticket; that host answers only JupyterLab's paths, with its own cookie, which the API and
the console refuse."""

from __future__ import annotations

import html
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select, update
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.server.db import utcnow
from gpulease.server.orm import ApiToken, User
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.routers.ui.jupyter_proxy import JUPYTER_COOKIE, instance_of_host
from gpulease.server.runtime import Runtime
from gpulease.server.services import jupyter_access

STATUS_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"


def lab_host(instance_id: int) -> str:
    return f"http://{instance_id}.jupyter.localhost"


def answer_status(http: TestClient, runner: RunnerDouble) -> None:
    """Play JupyterLab behind the runner for one request (the start-up status check). The
    long poll may answer before the console's POST has opened the stream (a slow host):
    ask again until it is there."""
    deadline = time.monotonic() + 60
    streams: list[dict[str, Any]] = []
    while not streams and time.monotonic() < deadline:
        streams = runner.call("GET", "/commands", params={"wait": 5}).json()["streams"]
    (stream,) = streams
    with http.websocket_connect(
        f"/runner/v1/streams/{stream['id']}", headers={"Authorization": f"Bearer {runner.token}"}
    ) as pipe:
        data = b""
        while b"\r\n\r\n" not in data:
            data += pipe.receive_bytes()
        pipe.send_bytes(STATUS_ANSWER)
        pipe.close()


def open_jupyterlab(http: TestClient, owner: Caller, instance_id: int, runner: RunnerDouble) -> str:
    """The console's "Open JupyterLab": where it sends the browser."""
    thread = threading.Thread(target=answer_status, args=(http, runner))
    thread.start()
    r = http.post(
        f"/instances/{instance_id}/jupyterlab",
        headers={"Cookie": f"{SESSION_COOKIE}={owner.token}", "Origin": "http://testserver"},
        follow_redirects=False,
    )
    thread.join(timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    (refresh,) = re.findall(r'http-equiv="refresh" content="0;url=([^"]+)"', r.text)
    (link,) = re.findall(r'<a href="([^"]+)" data-testid="jupyterlab-link"', r.text)
    assert refresh == link
    return html.unescape(link)


def enter(http: TestClient, instance_id: int, ticket: str) -> Any:
    r = http.get(
        f"{lab_host(instance_id)}/_gpulease/jupyter/enter",
        params={"ticket": ticket},
        follow_redirects=False,
    )
    http.cookies.clear()
    return r


@pytest.fixture
def ann_instance(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> tuple[int, RunnerDouble]:
    return make_running_instance(ann, tick, runner_for, "box")


def test_open_jupyterlab_hands_a_one_use_ticket_for_the_instances_own_origin(
    http: TestClient, ann: Caller, ann_instance: tuple[int, RunnerDouble]
) -> None:
    instance_id, runner = ann_instance
    location = open_jupyterlab(http, ann, instance_id, runner)
    parts = urlsplit(location)
    assert f"{parts.scheme}://{parts.netloc}" == lab_host(instance_id)
    assert parts.path == "/_gpulease/jupyter/enter"
    (ticket,) = parse_qs(parts.query)["ticket"]
    assert ticket.startswith("glj_")

    r = enter(http, 999, ticket)  # another instance's host
    assert r.status_code == 403
    r = enter(http, instance_id, ticket)
    assert r.status_code == 303 and r.headers["location"] == f"/instances/{instance_id}/jupyter/lab"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{JUPYTER_COOKIE}=glj_")
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert "Domain" not in cookie  # this host only, never its parent or siblings
    assert "frame-ancestors 'self'" in r.headers["content-security-policy"]
    again = enter(http, instance_id, ticket)
    assert again.status_code == 403 and "used already or has expired" in again.text


def test_an_expired_ticket_is_refused(http: TestClient, rt: Runtime, ann: Caller) -> None:
    with rt.sessions.begin() as session:
        user = session.scalars(select(User).where(User.name == "ann")).one()
        ticket = jupyter_access.mint_ticket(session, user, 7)
        session.execute(
            update(ApiToken)
            .where(ApiToken.kind == jupyter_access.TICKET_KIND)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    assert enter(http, 7, ticket).status_code == 403


def access_cookie(http: TestClient, rt: Runtime, name: str, instance_id: int) -> str:
    with rt.sessions.begin() as session:
        user = session.scalars(select(User).where(User.name == name)).one()
        ticket = jupyter_access.mint_ticket(session, user, instance_id)
    r = enter(http, instance_id, ticket)
    assert r.status_code == 303
    return str(r.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1])


def test_the_jupyter_host_serves_jupyterlab_only_and_only_with_its_cookie(
    http: TestClient, rt: Runtime, ann: Caller, ann_instance: tuple[int, RunnerDouble]
) -> None:
    instance_id, _runner = ann_instance
    host = lab_host(instance_id)
    console = {"Cookie": f"{SESSION_COOKIE}={ann.token}"}
    # no console page, API route or static file exists on that origin
    for path in ("/", "/login", "/api/v1/me", "/api/v1/tokens", "/static/css/console.css"):
        r = http.get(f"{host}{path}", headers=console, follow_redirects=False)
        assert r.status_code == 404, path
    r = http.post(f"{host}/api/v1/tokens", json={"name": "x"}, headers=console)
    assert r.status_code == 404
    # the console's cookie (were a browser to send it) opens nothing here
    r = http.get(f"{host}/instances/{instance_id}/jupyter/lab", headers=console)
    assert r.status_code == 401 and "open JupyterLab from your instance's page" in r.text
    assert "frame-ancestors" in r.headers["content-security-policy"]
    # the cookie of this instance's host does not open another instance's
    access = access_cookie(http, rt, "ann", instance_id)
    other = instance_id + 1
    r = http.get(
        f"{lab_host(other)}/instances/{other}/jupyter/lab",
        headers={"Cookie": f"{JUPYTER_COOKIE}={access}"},
    )
    assert r.status_code == 401
    r = http.get(
        f"{host}/instances/{other}/jupyter/lab", headers={"Cookie": f"{JUPYTER_COOKIE}={access}"}
    )
    assert r.status_code == 404


def test_the_api_and_the_console_refuse_jupyter_tickets_and_cookies(
    http: TestClient, rt: Runtime, ann: Caller, ann_instance: tuple[int, RunnerDouble]
) -> None:
    instance_id, _runner = ann_instance
    access = access_cookie(http, rt, "ann", instance_id)
    with rt.sessions.begin() as session:
        user = session.scalars(select(User).where(User.name == "ann")).one()
        ticket = jupyter_access.mint_ticket(session, user, instance_id)
    for secret in (access, ticket):
        r = http.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 401
        r = http.post(
            "/api/v1/tokens",
            json={"name": "stolen"},
            headers={"Cookie": f"{SESSION_COOKIE}={secret}", "Origin": "http://testserver"},
        )
        assert r.status_code == 401
        r = http.get("/", headers={"Cookie": f"{SESSION_COOKIE}={secret}"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
    assert [t["name"] for t in ann.get("/api/v1/tokens").json()] == ["registration"]


def test_another_user_cannot_open_the_owners_jupyterlab(
    http: TestClient, ann: Caller, bob: Caller, ann_instance: tuple[int, RunnerDouble]
) -> None:
    instance_id, runner = ann_instance
    r = http.post(
        f"/instances/{instance_id}/jupyterlab",
        headers={"Cookie": f"{SESSION_COOKIE}={bob.token}", "Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 404
    # nor from the Jupyter host
    r = http.post(
        f"{lab_host(instance_id)}/instances/{instance_id}/jupyterlab",
        headers={"Cookie": f"{SESSION_COOKIE}={ann.token}"},
    )
    assert r.status_code == 404
    r = runner.call("GET", "/commands", params={"wait": 0})
    assert r.json()["streams"] == []


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("12.jupyter.localhost", 12),
        ("12.jupyter.localhost:8420", 12),
        ("12.JUPYTER.localhost", 12),
        ("jupyter.localhost", None),
        ("x.jupyter.localhost", None),
        ("012.jupyter.localhost", None),
        ("1.2.jupyter.localhost", None),
        ("12.jupyter.localhost.evil.example", None),
        ("12.evil-jupyter.localhost", None),
        ("127.0.0.1:8420", None),
        ("[::1]:8420", None),
        ("", None),
    ],
)
def test_jupyter_hosts_are_recognised_exactly(host: str, expected: int | None) -> None:
    assert instance_of_host(host, "jupyter.localhost") == expected
