"""Terminal and Jupyter streams in process: pairing, owner-only access, Origin, runner tokens."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from factories import Caller, RunnerDouble, console_client, make_running_instance
from gpulease.server.orm import Instance
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.runtime import Runtime


def cookie(caller: Caller, origin: str | None = "http://testserver") -> dict[str, str]:
    headers = {"Cookie": f"{SESSION_COOKIE}={caller.token}"}
    if origin is not None:
        headers["Origin"] = origin
    return headers


def jupyter_host(instance_id: int) -> str:
    """The instance's JupyterLab origin (GPULEASE_JUPYTER_DOMAIN, by default
    jupyter.localhost)."""
    return f"http://{instance_id}.jupyter.localhost"


def jupyter_cookie(rt: Runtime, http: TestClient, caller: Caller, instance_id: int) -> str:
    """The Jupyter host's cookie for caller, as "Open JupyterLab" hands it out: a ticket
    minted for the owner, redeemed on the instance's Jupyter host."""
    from gpulease.server.orm import User
    from gpulease.server.services import jupyter_access

    with rt.sessions.begin() as session:
        user = session.scalars(select(User).where(User.name == caller.name)).one()
        ticket = jupyter_access.mint_ticket(session, user, instance_id)
    r = http.get(
        f"{jupyter_host(instance_id)}/_gpulease/jupyter/enter",
        params={"ticket": ticket},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    value = r.cookies.get("gpulease_jupyter")
    assert value
    http.cookies.clear()
    return str(value)


def refusal(session: Any) -> int:
    """The HTTP status a WebSocket handshake was refused with."""
    with pytest.raises(WebSocketDenialResponse) as denied, session:
        pass
    return int(denied.value.status_code)


def activity_recorded(rt: Runtime, instance_id: int) -> bool:
    """Whether terminal/notebook activity of the instance reached the database; waits for
    the write, which runs beside the connection (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        with rt.sessions() as session:
            touched = session.scalar(
                select(Instance.last_activity_at).where(Instance.id == instance_id)
            )
        if touched is not None or time.monotonic() > deadline:
            return touched is not None
        time.sleep(0.02)


def wanted_streams(runner: RunnerDouble) -> list[dict[str, Any]]:
    r = runner.call("GET", "/commands", params={"wait": 5})
    assert r.status_code == 200, r.text
    return list(r.json()["streams"])


def runner_socket(http: TestClient, runner: RunnerDouble, stream_id: str) -> Any:
    return http.websocket_connect(
        f"/runner/v1/streams/{stream_id}", headers={"Authorization": f"Bearer {runner.token}"}
    )


@pytest.fixture
def ann_instance(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> tuple[int, RunnerDouble]:
    return make_running_instance(ann, tick, runner_for, "box")


def test_terminal_relays_bytes_resize_and_exit_and_records_activity(
    http: TestClient, ann: Caller, ann_instance: tuple[int, RunnerDouble], rt: Runtime
) -> None:
    instance_id, runner = ann_instance
    r = http.get(f"/instances/{instance_id}", headers=cookie(ann))  # the console's page
    assert r.status_code == 200 and 'data-testid="terminal"' in r.text, r.text[-2000:]
    r = http.get(f"/instances/{instance_id}/terminal", headers=cookie(ann))
    assert r.status_code == 200
    assert f'data-terminal-ws="/instances/{instance_id}/terminal/ws"' in r.text
    assert "/static/js/terminal.js" in r.text and "vendor/xterm/xterm.js" in r.text
    assert f'action="/instances/{instance_id}/jupyterlab"' in r.text
    r = http.get("/instances/nope/terminal", headers=cookie(ann))
    assert r.status_code == 404 and "you have no instance &#39;nope&#39;" in r.text
    assert (
        refusal(
            http.websocket_connect("/instances/" + "x" * 100 + "/terminal/ws", headers=cookie(ann))
        )
        == 404
    )
    url = f"/instances/{instance_id}/terminal/ws?cols=100&rows=30"
    with http.websocket_connect(url, headers=cookie(ann)) as browser:
        (stream,) = wanted_streams(runner)
        assert stream["kind"] == "terminal" and stream["cols"] == 100 and stream["rows"] == 30
        with runner_socket(http, runner, str(stream["id"])) as shell:
            # the runner has it: the next poll does not hand it out again
            assert wanted_streams_now(runner) == []
            shell.send_bytes(b"$ ")
            assert browser.receive_bytes() == b"$ "
            browser.send_bytes(b"echo hello\r")
            assert shell.receive_bytes() == b"echo hello\r"
            browser.send_text(json.dumps({"type": "resize", "cols": 5000, "rows": "x"}))
            assert json.loads(shell.receive_text()) == {"type": "resize", "cols": 1000, "rows": 24}
            browser.send_text("not json")  # ignored
            shell.send_text(json.dumps({"type": "exit", "code": 0}))
            assert json.loads(browser.receive_text()) == {"type": "exit", "code": 0}
            shell.close()
            with pytest.raises(WebSocketDisconnect):
                browser.receive_bytes()
    with rt.sessions() as session:
        touched = session.scalar(
            select(Instance.last_activity_at).where(Instance.id == instance_id)
        )
    assert touched is not None


def wanted_streams_now(runner: RunnerDouble) -> list[dict[str, Any]]:
    r = runner.call("GET", "/commands", params={"wait": 0})
    assert r.status_code == 200, r.text
    return list(r.json()["streams"])


def test_another_user_gets_404_anonymous_must_log_in_and_other_sites_are_refused(
    http: TestClient, ann: Caller, ann_instance: tuple[int, RunnerDouble], bob: Caller
) -> None:
    instance_id, runner = ann_instance
    base = f"/instances/{instance_id}"
    bob_client = console_client(http.app, cookies={SESSION_COOKIE: bob.token})
    anonymous = console_client(http.app)
    with bob_client, anonymous:
        assert bob_client.get(f"{base}/terminal").status_code == 404
        assert bob_client.get(f"{base}/jupyter/lab").status_code == 404
        assert bob_client.get("/instances/box/jupyter/lab").status_code == 404
        r = bob_client.post(f"{base}/jupyterlab", headers={"Origin": "http://testserver"})
        assert r.status_code == 404
        assert refusal(http.websocket_connect(f"{base}/terminal/ws", headers=cookie(bob))) == 404
        assert (
            refusal(
                http.websocket_connect(
                    f"{base}/jupyter/api/kernels/x/channels", headers=cookie(bob)
                )
            )
            == 404
        )

        r = anonymous.get(f"{base}/terminal")
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
        r = anonymous.get(f"{base}/jupyter/lab")
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next=")
        assert anonymous.post(f"{base}/jupyter/api/contents").status_code == 401
        assert (
            refusal(
                http.websocket_connect(
                    f"{base}/terminal/ws", headers={"Origin": "http://testserver"}
                )
            )
            == 401
        )

    # another site, with ann's cookie
    assert (
        refusal(
            http.websocket_connect(
                f"/instances/{instance_id}/terminal/ws", headers=cookie(ann, "http://evil.example")
            )
        )
        == 403
    )
    assert (
        refusal(
            http.websocket_connect(
                f"/instances/{instance_id}/jupyter/api/events/subscribe",
                headers=cookie(ann, "null"),
            )
        )
        == 403
    )
    r = http.post(
        f"/instances/{instance_id}/jupyterlab", headers=cookie(ann, "http://evil.example")
    )
    assert r.status_code == 403
    r = http.post(
        f"/instances/{instance_id}/jupyter/api/contents", headers=cookie(ann, "http://evil.example")
    )
    assert r.status_code == 403
    assert wanted_streams_now(runner) == []
    # nothing was asked of ann's runner by any of these


def test_a_runner_cannot_attach_to_another_instances_stream(
    http: TestClient,
    ann: Caller,
    ann_instance: tuple[int, RunnerDouble],
    bob: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, runner = ann_instance
    _, bobs_runner = make_running_instance(bob, tick, runner_for, "other")
    with http.websocket_connect(
        f"/instances/{instance_id}/terminal/ws", headers=cookie(ann)
    ) as browser:
        (stream,) = wanted_streams(runner)
        assert wanted_streams_now(bobs_runner) == []
        for token, stream_id, status in (
            (bobs_runner.token, stream["id"], 404),  # ann's stream, bob's runner
            (runner.token, "made-up", 404),
            ("not-a-token", stream["id"], 401),
        ):
            assert (
                refusal(
                    http.websocket_connect(
                        f"/runner/v1/streams/{stream_id}",
                        headers={"Authorization": f"Bearer {token}"},
                    )
                )
                == status
            )
        assert refusal(http.websocket_connect(f"/runner/v1/streams/{stream['id']}")) == 401
        # the refusals did not use the stream up: ann's runner still gets it
        with runner_socket(http, runner, str(stream["id"])) as shell:
            browser.send_bytes(b"ls\r")
            assert shell.receive_bytes() == b"ls\r"
            assert activity_recorded(rt, instance_id)
            # a stream is claimed once
            assert refusal(runner_socket(http, runner, str(stream["id"]))) == 404


def test_a_stopped_instance_has_no_terminal(
    http: TestClient,
    ann: Caller,
    ann_instance: tuple[int, RunnerDouble],
    tick: Callable[[], None],
) -> None:
    instance_id, runner = ann_instance
    assert ann.post(f"/api/v1/instances/{instance_id}/stop").status_code in (200, 202)
    tick()
    with http.websocket_connect(f"/instances/{instance_id}/terminal/ws", headers=cookie(ann)) as ws:
        message = json.loads(ws.receive_text())
        assert message["type"] == "error" and "start it" in message["message"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 4409
    r = http.get(f"/instances/{instance_id}/jupyter/lab", headers=cookie(ann))
    assert r.status_code == 409 and "start it" in r.text


def serve_one_http_exchange(
    http: TestClient, runner: RunnerDouble, answer: bytes, seen: list[bytes]
) -> None:
    """Play JupyterLab behind the runner: read one request, send answer."""
    (stream,) = wanted_streams(runner)
    assert stream["kind"] == "jupyter"
    with runner_socket(http, runner, str(stream["id"])) as pipe:
        data = b""
        while b"\r\n\r\n" not in data:
            data += pipe.receive_bytes()
        seen.append(data)
        pipe.send_bytes(answer)
        pipe.close()


def test_jupyter_proxy_forwards_http_without_console_credentials(
    http: TestClient, ann: Caller, ann_instance: tuple[int, RunnerDouble], rt: Runtime
) -> None:
    instance_id, runner = ann_instance
    prefix = f"/instances/{instance_id}/jupyter/"
    access = jupyter_cookie(rt, http, ann, instance_id)
    body = b'{"version": "2.0"}'
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n".encode()
        + f"Set-Cookie: {SESSION_COOKIE}=stolen; Path=/\r\n".encode()
        + b"Set-Cookie: wide=1; Path=/\r\n"
        + f"Set-Cookie: _xsrf=abc; Path={prefix}\r\n".encode()
        + b"Connection: close\r\n\r\n"
        + body
    )
    seen: list[bytes] = []
    server = threading.Thread(target=serve_one_http_exchange, args=(http, runner, answer, seen))
    server.start()
    headers = {
        **cookie(ann, jupyter_host(instance_id)),
        "Authorization": "Bearer nope",
        "Cookie": f"{SESSION_COOKIE}={ann.token}; gpulease_jupyter={access}; _xsrf=abc",
    }
    r = http.get(f"{jupyter_host(instance_id)}{prefix}api/status?x=1", headers=headers)
    server.join(timeout=30)
    assert r.status_code == 200 and r.content == body
    cookies = r.headers.get_list("set-cookie")
    assert cookies == [f"_xsrf=abc; Path={prefix}"]
    (request,) = seen
    head = request.decode("latin-1")
    assert head.startswith(f"GET {prefix}api/status?x=1 HTTP/1.1\r\n")
    assert ann.token not in head and "Bearer" not in head and access not in head
    assert "_xsrf=abc" in head
    with rt.sessions() as session:
        touched = session.scalar(
            select(Instance.last_activity_at).where(Instance.id == instance_id)
        )
    assert touched is not None

    # JupyterLab that cannot start: the runner says why, the page shows it

    def fail() -> None:
        (stream,) = wanted_streams(runner)
        with runner_socket(http, runner, str(stream["id"])) as pipe:
            pipe.send_text(
                json.dumps(
                    {"type": "error", "message": "JupyterLab could not be installed: no PyPI"}
                )
            )
            pipe.close()

    thread = threading.Thread(target=fail)
    thread.start()
    r = http.post(f"/instances/{instance_id}/jupyterlab", headers=cookie(ann))
    thread.join(timeout=30)
    assert r.status_code == 502 and "no PyPI" in r.text


def test_jupyter_websockets_are_proxied_with_their_subprotocol_and_no_console_cookie(
    http: TestClient, ann: Caller, ann_instance: tuple[int, RunnerDouble], rt: Runtime
) -> None:
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request as WsRequest
    from websockets.server import ServerProtocol
    from websockets.typing import Subprotocol

    instance_id, runner = ann_instance
    seen: list[WsRequest] = []
    subprotocol = Subprotocol("v1.kernel.websocket.jupyter.org")

    def kernel() -> None:
        """Play JupyterLab's kernel channel: accept, echo one message upper-cased."""
        (stream,) = wanted_streams(runner)
        protocol = ServerProtocol(subprotocols=[subprotocol])
        with runner_socket(http, runner, str(stream["id"])) as pipe:
            while not seen:
                protocol.receive_data(pipe.receive_bytes())
                seen.extend(e for e in protocol.events_received() if isinstance(e, WsRequest))
            protocol.send_response(protocol.accept(seen[0]))
            for data in protocol.data_to_send():
                pipe.send_bytes(data)
            frames: list[Frame] = []
            while not frames:
                protocol.receive_data(pipe.receive_bytes())
                frames = [e for e in protocol.events_received() if isinstance(e, Frame)]
            assert frames[0].opcode is Opcode.TEXT
            protocol.send_text(bytes(frames[0].data).upper())
            for data in protocol.data_to_send():
                pipe.send_bytes(data)
            pipe.close()

    thread = threading.Thread(target=kernel)
    thread.start()
    access = jupyter_cookie(rt, http, ann, instance_id)
    path = f"/instances/{instance_id}/jupyter/api/kernels/k1/channels?session_id=s"
    headers = {
        **cookie(ann, jupyter_host(instance_id)),
        "Cookie": f"{SESSION_COOKIE}={ann.token}; gpulease_jupyter={access}; _xsrf=abc",
    }
    url = jupyter_host(instance_id).replace("http", "ws") + path
    with http.websocket_connect(url, headers=headers, subprotocols=[subprotocol]) as ws:
        assert ws.accepted_subprotocol == subprotocol
        ws.send_text('{"msg": "hi"}')
        assert ws.receive_text() == '{"MSG": "HI"}'
        assert activity_recorded(rt, instance_id)
    thread.join(timeout=30)
    (request,) = seen
    assert request.path == f"/instances/{instance_id}/jupyter/api/kernels/k1/channels?session_id=s"
    assert request.headers["Cookie"] == "_xsrf=abc"
    assert request.headers["Origin"] == jupyter_host(instance_id)
