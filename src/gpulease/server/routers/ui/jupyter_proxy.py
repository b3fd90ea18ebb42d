"""JupyterLab through the server: `/instances/{ref}/jupyter/...` proxied over runner streams.

Only the instance's owner gets through (the console's session cookie; another user gets
404). HTTP goes through an httpcore connection pool whose network backend opens a runner
stream per connection (keep-alive reuses it); WebSockets (kernels, terminals) speak the
`websockets` sans-I/O client protocol over a stream of their own. The console's session
cookie and bearer tokens never reach the instance, and JupyterLab cannot set cookies
outside its own path.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpcore
from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import RedirectResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response as WsResponse
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from gpulease.server.routers.api.runner_streams import close_quietly, refuse, until_first_ends
from gpulease.server.routers.deps import SESSION_COOKIE, same_origin
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url
from gpulease.server.routers.ui.templating import render
from gpulease.server.routers.ui.terminal import Activity, lookup, note_activity, origin_ok
from gpulease.server.services.instances.states import RUNNING
from gpulease.server.services.streams import StreamHub, StreamUnavailable, Target, hub_of

router = APIRouter()

HOST_SUFFIX = ".jupyter.gpulease"
# The first JupyterLab on a node is installed before it starts: allow for that on "Open".
START_TIMEOUT_S = 600.0
READ_TIMEOUT_S = 300.0
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# Hop-by-hop headers (RFC 9110 7.6.1) and what the proxy sets itself.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
_DROP_REQUEST = _HOP | {"authorization", "cookie"}
MAX_MESSAGE = 64 * 1024 * 1024


def base_path(instance_id: int) -> str:
    return f"/instances/{instance_id}/jupyter/"


class RunnerNetworkStream(httpcore.AsyncNetworkStream):
    """An httpcore connection carried by a runner stream: bytes in binary frames."""

    def __init__(self, hub: StreamHub, stream: Any, socket: WebSocket) -> None:
        self._hub = hub
        self._stream = stream
        self._socket = socket
        self._buffer = b""
        self._eof = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self._buffer and not self._eof:
            try:
                message = await asyncio.wait_for(self._socket.receive(), timeout)
            except TimeoutError as exc:
                raise httpcore.ReadTimeout("JupyterLab did not answer in time") from exc
            except (RuntimeError, WebSocketDisconnect) as exc:
                raise httpcore.ReadError(str(exc)) from exc
            if message["type"] == "websocket.disconnect":
                self._eof = True
            elif message.get("bytes") is not None:
                self._buffer = message["bytes"]
            elif message.get("text") is not None:
                raise httpcore.ReadError(_error_text(message["text"]))
        data, self._buffer = self._buffer[:max_bytes], self._buffer[max_bytes:]
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            await self._socket.send_bytes(bytes(buffer))
        except (RuntimeError, WebSocketDisconnect) as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._hub.close(self._stream)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle keep-alive connection the runner closed
            return self._eof
        return None


class RunnerBackend(httpcore.AsyncNetworkBackend):
    """Connections to host `<instance id>.jupyter.gpulease` become runner streams."""

    def __init__(self, hub: StreamHub) -> None:
        self._hub = hub

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        instance_id = int(host.removesuffix(HOST_SUFFIX))
        stream = self._hub.open(instance_id, "jupyter")
        try:
            socket = await self._hub.connect(stream, timeout or 30.0)
        except StreamUnavailable as exc:
            raise httpcore.ConnectError(exc.message) from exc
        return RunnerNetworkStream(self._hub, stream, socket)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the Jupyter proxy connects through runner streams only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def pool_of(state: Any) -> httpcore.AsyncConnectionPool:
    pool = getattr(state, "jupyter_pool", None)
    if not isinstance(pool, httpcore.AsyncConnectionPool):
        pool = httpcore.AsyncConnectionPool(
            network_backend=RunnerBackend(hub_of(state)),
            max_connections=200,
            keepalive_expiry=5.0,
        )
        state.jupyter_pool = pool
    return pool


def _error_text(text: str) -> str:
    try:
        message = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(message, dict) and isinstance(message.get("message"), str):
        return str(message["message"])
    return text[:500]


def _without_session_cookie(header: str) -> str:
    kept = [
        part.strip()
        for part in header.split(";")
        if part.strip() and part.strip().split("=", 1)[0].strip() != SESSION_COOKIE
    ]
    return "; ".join(kept)


def request_headers(request: Request) -> list[tuple[bytes, bytes]]:
    """The browser's headers minus hop-by-hop ones, credentials for the console, and the
    console's own session cookie (JupyterLab's `_xsrf` cookie passes)."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in request.headers.items()
        if name.lower() not in _DROP_REQUEST
    ]
    cookie = _without_session_cookie(request.headers.get("cookie", ""))
    if cookie:
        headers.append((b"cookie", cookie.encode("latin-1")))
    if "transfer-encoding" in request.headers and "content-length" not in request.headers:
        headers.append((b"transfer-encoding", b"chunked"))
    return headers


def cookie_allowed(value: str, prefix: str) -> bool:
    """A Set-Cookie from JupyterLab: never the console's cookie, only under its own path."""
    parts = [p.strip() for p in value.split(";")]
    name = parts[0].split("=", 1)[0].strip()
    if name == SESSION_COOKIE or "domain" in {p.split("=", 1)[0].lower() for p in parts[1:]}:
        return False
    paths = [p.split("=", 1)[1] for p in parts[1:] if p.lower().startswith("path=")]
    return bool(paths) and all(path.startswith(prefix.rstrip("/")) for path in paths)


def response_headers(raw: list[tuple[bytes, bytes]], prefix: str) -> list[tuple[bytes, bytes]]:
    kept = []
    for name, value in raw:
        lower = name.decode("latin-1").lower()
        if lower in _HOP or lower in ("date", "server"):  # uvicorn sends its own
            continue
        if lower == "set-cookie" and not cookie_allowed(value.decode("latin-1"), prefix):
            continue
        kept.append((name.lower(), value))
    return kept


def _not_found(request: Request, ref: str) -> Response:
    context = {"title": "Instance not found", "message": f"you have no instance {ref[:64]!r}"}
    return render(request, "errors/error.html", context, status_code=404)


def _not_running(request: Request, target: Target) -> Response:
    context = {
        "title": "JupyterLab is not available",
        "message": f"instance {target.name} is {target.status}; start it to use JupyterLab",
    }
    return render(request, "errors/error.html", context, status_code=409)


async def _owner_target(request: Request, ref: str) -> Target | Response:
    logged_in, target = await lookup(request, ref)
    if not logged_in:
        if request.method in ("GET", "HEAD"):
            return RedirectResponse(login_url(request), status_code=303)
        return Response("log in to the console first\n", status_code=401, media_type="text/plain")
    if target is None:
        return _not_found(request, ref)
    if request.method not in ("GET", "HEAD", "OPTIONS") and not same_origin(request):
        return cross_site_refusal(request)
    if target.status != RUNNING:
        return _not_running(request, target)
    return target


async def forward(
    request: Request,
    target: Target,
    target_path: bytes,
    *,
    read_timeout: float = READ_TIMEOUT_S,
    body: bool = True,
) -> httpcore.Response:
    pool = pool_of(request.app.state)
    content: AsyncIterator[bytes] | None = request.stream() if body else None
    upstream = httpcore.Request(
        request.method if body else "GET",
        httpcore.URL(scheme=b"http", host=f"{target.id}{HOST_SUFFIX}", port=80, target=target_path),
        headers=request_headers(request) if body else [(b"host", b"jupyter")],
        content=content,
        extensions={"timeout": {"connect": read_timeout, "read": read_timeout, "write": 60.0}},
    )
    return await pool.handle_async_request(upstream)


@router.post("/instances/{ref}/jupyterlab")
async def open_jupyterlab(ref: str, request: Request) -> Response:
    """Start JupyterLab in the instance (installing it on the node the first time), wait
    until it answers, then go there."""
    found = await _owner_target(request, ref)
    if isinstance(found, Response):
        return found
    status_path = f"{base_path(found.id)}api/status".encode()
    try:
        response = await forward(
            request, found, status_path, read_timeout=START_TIMEOUT_S, body=False
        )
        await response.aread()
        await response.aclose()
    except httpcore.TimeoutException:
        return _unavailable(request, "JupyterLab did not start in time; try again")
    except httpcore.NetworkError as exc:
        return _unavailable(request, f"JupyterLab could not start: {exc}")
    await note_activity(request, hub_of(request.app.state), found.id)
    return RedirectResponse(f"{base_path(found.id)}lab", status_code=303)


def _unavailable(request: Request, message: str) -> Response:
    context = {"title": "JupyterLab is not available", "message": message}
    return render(request, "errors/error.html", context, status_code=502)


@router.api_route("/instances/{ref}/jupyter/{path:path}", methods=METHODS)
async def jupyter_http(ref: str, path: str, request: Request) -> Response:
    found = await _owner_target(request, ref)
    if isinstance(found, Response):
        return found
    if ref != str(found.id):  # JupyterLab's base URL names the instance by id
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{base_path(found.id)}{path}{query}", status_code=307)
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    target_path = raw_path + (b"?" + request.scope["query_string"] if request.url.query else b"")
    await note_activity(request, hub_of(request.app.state), found.id)
    try:
        upstream = await forward(request, found, target_path)
    except httpcore.TimeoutException:
        return _unavailable(request, "JupyterLab did not answer in time")
    except httpcore.NetworkError as exc:
        return _unavailable(request, f"JupyterLab cannot be reached: {exc}")
    response = StreamingResponse(
        upstream.aiter_stream(),
        status_code=upstream.status,
        background=BackgroundTask(upstream.aclose),
    )
    response.raw_headers = response_headers(upstream.headers, base_path(found.id))
    return response


@router.websocket("/instances/{ref}/jupyter/{path:path}")
async def jupyter_websocket(websocket: WebSocket, ref: str, path: str) -> None:
    """Kernel and terminal channels: a WebSocket client inside the runner stream."""
    if not origin_ok(websocket):
        await refuse(websocket, 403, "this connection was opened from another site")
        return
    logged_in, target = await lookup(websocket, ref)
    if not logged_in:
        await refuse(websocket, 401, "log in to the console first")
        return
    if target is None or ref != str(target.id):
        await refuse(websocket, 404, f"you have no instance {ref[:64]!r}")
        return
    if target.status != RUNNING:
        await refuse(websocket, 409, f"instance {target.name} is {target.status}")
        return
    hub = hub_of(websocket.app.state)
    stream = hub.open(target.id, "jupyter")
    try:
        try:
            runner = await hub.connect(stream)
        except StreamUnavailable as exc:
            await refuse(websocket, 502, exc.message)
            return
        await _bridge_websocket(websocket, runner, hub, target)
    finally:
        hub.close(stream)


async def _bridge_websocket(
    browser: WebSocket, runner: WebSocket, hub: StreamHub, target: Target
) -> None:
    raw_path = browser.scope.get("raw_path") or browser.url.path.encode()
    query = browser.scope.get("query_string", b"")
    resource = raw_path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
    host = browser.headers.get("host", "jupyter")
    offered = [
        Subprotocol(p.strip())
        for p in browser.headers.get("sec-websocket-protocol", "").split(",")
        if p.strip()
    ]
    protocol = ClientProtocol(
        parse_uri(f"ws://{host}{resource}"),
        subprotocols=offered or None,
        max_size=MAX_MESSAGE,
    )
    request = protocol.connect()
    cookie = _without_session_cookie(browser.headers.get("cookie", ""))
    if cookie:
        request.headers["Cookie"] = cookie
    if "origin" in browser.headers:
        request.headers["Origin"] = browser.headers["origin"]
    protocol.send_request(request)
    await _flush(protocol, runner)

    handshake: WsResponse | None = None
    pending: list[Frame] = []
    while handshake is None:
        message = await runner.receive()
        if message["type"] == "websocket.disconnect" or message.get("text") is not None:
            await refuse(browser, 502, "JupyterLab closed the connection")
            return
        protocol.receive_data(message.get("bytes") or b"")
        for event in protocol.events_received():
            if isinstance(event, WsResponse):
                handshake = event
            elif isinstance(event, Frame):
                pending.append(event)
        if protocol.handshake_exc is not None:
            status = handshake.status_code if handshake is not None else 502
            await refuse(browser, status if 400 <= status < 600 else 502, "JupyterLab refused")
            return
    chosen = handshake.headers.get("Sec-WebSocket-Protocol")
    await browser.accept(subprotocol=chosen)
    activity = Activity(browser, hub, target.id)

    async def upstream() -> None:
        while True:
            message = await browser.receive()
            if message["type"] == "websocket.disconnect":
                protocol.send_close()
                await _flush(protocol, runner)
                return
            if message.get("bytes") is not None:
                protocol.send_binary(message["bytes"])
            elif message.get("text") is not None:
                protocol.send_text(message["text"].encode())
            await _flush(protocol, runner)
            activity.note()

    async def downstream() -> None:
        fragments: list[bytes] = []
        opcode = Opcode.TEXT
        for frame in pending:
            await _deliver(browser, frame, fragments)
        while True:
            message = await runner.receive()
            if message["type"] == "websocket.disconnect":
                return
            protocol.receive_data(message.get("bytes") or b"")
            await _flush(protocol, runner)  # pongs, close answers
            for event in protocol.events_received():
                if isinstance(event, Frame):
                    if event.opcode is Opcode.CLOSE:
                        return
                    if event.opcode in (Opcode.TEXT, Opcode.BINARY):
                        opcode = event.opcode
                    if event.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                        fragments.append(bytes(event.data))
                        if event.fin:
                            data = b"".join(fragments)
                            fragments.clear()
                            if opcode is Opcode.TEXT:
                                await browser.send_text(data.decode("utf-8", "replace"))
                            else:
                                await browser.send_bytes(data)

    try:
        await until_first_ends(upstream(), downstream())
    finally:
        await activity.drain()
        await close_quietly(browser)


async def _deliver(browser: WebSocket, frame: Frame, fragments: list[bytes]) -> None:
    """Frames that arrived with the handshake answer (rare): whole messages only."""
    if frame.opcode is Opcode.TEXT and frame.fin:
        await browser.send_text(bytes(frame.data).decode("utf-8", "replace"))
    elif frame.opcode is Opcode.BINARY and frame.fin:
        await browser.send_bytes(bytes(frame.data))


async def _flush(protocol: ClientProtocol, runner: WebSocket) -> None:
    for data in protocol.data_to_send():
        if data:
            await runner.send_bytes(data)
