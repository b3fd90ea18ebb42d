"""JupyterLab through the server, on an origin of its own: `<id>.GPULEASE_JUPYTER_DOMAIN`.

Script in a notebook's output runs with JupyterLab's origin. Served on the console's, it
could use the owner's console cookie (mint tokens, spend credit); so each instance's
JupyterLab has a host of its own, which never receives the console's cookie. The console's
"Open JupyterLab" (owner only, same-origin POST) starts it and sends the browser to that
host with a one-minute, one-use ticket (services/jupyter_access), redeemed there for a
cookie that opens this instance's JupyterLab and nothing else. On the Jupyter host only
JupyterLab's paths answer (JupyterOriginGate); on the console's host they do not.

HTTP goes through an httpcore connection pool whose network backend opens a runner stream
per connection (keep-alive reuses it); WebSockets (kernels, terminals) speak the
`websockets` sans-I/O client protocol over a stream of their own. Neither cookie nor any
bearer token reaches the instance, and JupyterLab cannot set cookies outside its own path.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpcore
from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response as WsResponse
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from gpulease.server.db import transaction
from gpulease.server.routers.api.runner_streams import close_quietly, refuse, until_first_ends
from gpulease.server.routers.deps import SESSION_COOKIE, same_origin
from gpulease.server.routers.ui.guards import cross_site_refusal, login_url, viewer
from gpulease.server.routers.ui.templating import SECURITY_HEADERS, render
from gpulease.server.routers.ui.terminal import Activity, lookup, note_activity
from gpulease.server.runtime import Runtime
from gpulease.server.services import jupyter_access, streams
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
JUPYTER_COOKIE = "gpulease_jupyter"
OUR_COOKIES = {SESSION_COOKIE, JUPYTER_COOKIE}
ENTER_PATH = "/_gpulease/jupyter/enter"
# JupyterLab needs inline styles, eval and blob: workers; what it must not do is be framed
# by another site or load plugins, forms and sockets from elsewhere.
JUPYTER_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self' data: blob:; script-src 'self' 'unsafe-inline' 'unsafe-eval' "
        "blob:; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
        "frame-ancestors 'self'"
    ),
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


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
        if part.strip() and part.strip().split("=", 1)[0].strip() not in OUR_COOKIES
    ]
    return "; ".join(kept)


def request_headers(request: Request) -> list[tuple[bytes, bytes]]:
    """The browser's headers minus hop-by-hop ones, credentials, and the console's and the
    Jupyter host's own cookies (JupyterLab's `_xsrf` cookie passes)."""
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
    if name in OUR_COOKIES or "domain" in {p.split("=", 1)[0].lower() for p in parts[1:]}:
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


def _text(message: str, status_code: int) -> Response:
    return Response(
        message + "\n", status_code=status_code, media_type="text/plain", headers=JUPYTER_HEADERS
    )


def jupyter_instance(conn: HTTPConnection) -> int | None:
    """The instance whose Jupyter host this request is for, or None (the console's host)."""
    domain = runtime_of(conn).settings.jupyter_domain
    return instance_of_host(conn.headers.get("host", ""), domain)


def instance_of_host(host: str, domain: str) -> int | None:
    """`12.jupyter.example.com[:port]` -> 12 when domain is jupyter.example.com."""
    name = host.strip().lower()
    if not name.startswith("["):
        name = name.rsplit(":", 1)[0]
    suffix = "." + domain.strip().lower().strip(".")
    label = name.removesuffix(suffix)
    if label == name or not label.isascii() or not label.isdigit() or len(label) > 12:
        return None
    return int(label) if label[0] != "0" else None


def jupyter_origin(request: Request, instance_id: int) -> str:
    """The origin of the instance's JupyterLab: the console's scheme and port (its public
    URL when set, else this request's) on host <id>.GPULEASE_JUPYTER_DOMAIN."""
    settings = runtime_of(request).settings
    public = urlsplit(settings.public_url) if settings.public_url else None
    scheme = public.scheme if public else request.url.scheme
    port = public.port if public else request.url.port
    shown = f":{port}" if port and port != {"http": 80, "https": 443}.get(scheme) else ""
    return f"{scheme}://{instance_id}.{settings.jupyter_domain.strip('.')}{shown}"


def runtime_of(conn: HTTPConnection) -> Runtime:
    rt = conn.app.state.runtime
    assert isinstance(rt, Runtime)
    return rt


def _find_access(rt: Runtime, secret: str | None, instance_id: int) -> tuple[bool, Target | None]:
    with transaction(rt.sessions) as session:
        user = jupyter_access.resolve_access(session, secret, instance_id)
        if user is None:
            return False, None
        return True, streams.target_of(session, user, instance_id)


OPEN_FROM_CONSOLE = "open JupyterLab from your instance's page in the console"


async def _access(conn: HTTPConnection, ref: str) -> Target | tuple[int, str]:
    """The instance this Jupyter host's cookie opens, or (status, why not)."""
    instance_id = jupyter_instance(conn)
    if instance_id is None:
        return 404, "JupyterLab is served at an address of its own: " + OPEN_FROM_CONSOLE
    if ref != str(instance_id):
        return 404, f"this address serves JupyterLab of instance {instance_id} only"
    secret = conn.cookies.get(JUPYTER_COOKIE)
    allowed, target = await run_in_threadpool(_find_access, runtime_of(conn), secret, instance_id)
    if not allowed:
        return 401, "you are not signed in to this JupyterLab: " + OPEN_FROM_CONSOLE
    if target is None:
        return 404, f"you have no instance {ref[:64]!r}"
    if target.status != RUNNING:
        return 409, f"instance {target.name} is {target.status}; start it to use JupyterLab"
    return target


async def _owner_target(request: Request, ref: str) -> Target | Response:
    """The console's side: the owner's instance, by the console's cookie."""
    logged_in, target = await lookup(request, ref)
    if not logged_in:
        if request.method in ("GET", "HEAD"):
            return RedirectResponse(login_url(request), status_code=303)
        return Response("log in to the console first\n", status_code=401, media_type="text/plain")
    if target is None:
        context = {"title": "Instance not found", "message": f"you have no instance {ref[:64]!r}"}
        return render(request, "errors/error.html", context, status_code=404)
    if request.method not in ("GET", "HEAD", "OPTIONS") and not same_origin(request):
        return cross_site_refusal(request)
    if target.status != RUNNING:
        context = {
            "title": "JupyterLab is not available",
            "message": f"instance {target.name} is {target.status}; start it to use JupyterLab",
        }
        return render(request, "errors/error.html", context, status_code=409)
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
    until it answers, then send the browser to its own origin with a one-use ticket."""
    if jupyter_instance(request) is not None:
        return _text("open JupyterLab from the console", 404)
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
    ticket = await run_in_threadpool(_mint, request, found.id)
    if ticket is None:
        return render(
            request,
            "errors/error.html",
            {"title": "Instance not found", "message": f"you have no instance {ref[:64]!r}"},
            status_code=404,
        )
    entry = f"{jupyter_origin(request, found.id)}{ENTER_PATH}?{urlencode({'ticket': ticket})}"
    return _go_to(entry)


def _go_to(entry: str) -> Response:
    """A page that moves on to JupyterLab's origin at once. Not a redirect: the console's
    CSP (form-action 'self') stops a form's redirect to another origin, and a page of its
    own lets the ticket leave without a Referer."""
    url = html.escape(entry, quote=True)
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={url}">'
        "<title>Opening JupyterLab</title></head><body>"
        f'<p>Opening JupyterLab… <a href="{url}" data-testid="jupyterlab-link">continue</a></p>'
        "</body></html>"
    )
    headers = {**SECURITY_HEADERS, "Referrer-Policy": "no-referrer"}
    return HTMLResponse(page, headers=headers)


def _mint(request: Request, instance_id: int) -> str | None:
    with transaction(runtime_of(request).sessions) as session:
        user = viewer(session, request)
        if user is None:
            return None
        return jupyter_access.mint_ticket(session, user, instance_id)


@router.get(ENTER_PATH)
def enter_jupyterlab(request: Request, ticket: str = "") -> Response:
    """On the Jupyter host: a ticket from the console becomes this host's cookie."""
    instance_id = jupyter_instance(request)
    if instance_id is None:
        return _text("not found", 404)
    with transaction(runtime_of(request).sessions) as session:
        secret = (
            jupyter_access.redeem_ticket(session, ticket[:200], instance_id) if ticket else None
        )
    if secret is None:
        return _text("this link was used already or has expired: " + OPEN_FROM_CONSOLE, 403)
    response = RedirectResponse(f"{base_path(instance_id)}lab", status_code=303)
    response.headers.update(JUPYTER_HEADERS)
    response.set_cookie(
        JUPYTER_COOKIE,
        secret,
        max_age=int(jupyter_access.ACCESS_TTL.total_seconds()),
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="lax",
    )
    return response


def _unavailable(request: Request, message: str) -> Response:
    context = {"title": "JupyterLab is not available", "message": message}
    return render(request, "errors/error.html", context, status_code=502)


@router.api_route("/instances/{ref}/jupyter/{path:path}", methods=METHODS)
async def jupyter_http(ref: str, path: str, request: Request) -> Response:
    if jupyter_instance(request) is None:
        return await _on_console_host(request, ref)
    found = await _access(request, ref)
    if isinstance(found, tuple):
        return _text(found[1], found[0])
    unsafe = request.method not in ("GET", "HEAD", "OPTIONS")
    if unsafe and not same_origin(request, require_header=True):
        return _text("this request was sent from another site; it was refused", 403)
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    target_path = raw_path + (b"?" + request.scope["query_string"] if request.url.query else b"")
    await note_activity(request, hub_of(request.app.state), found.id)
    try:
        upstream = await forward(request, found, target_path)
    except httpcore.TimeoutException:
        return _text("JupyterLab did not answer in time", 502)
    except httpcore.NetworkError as exc:
        return _text(f"JupyterLab cannot be reached: {exc}", 502)
    response = StreamingResponse(
        upstream.aiter_stream(),
        status_code=upstream.status,
        background=BackgroundTask(upstream.aclose),
    )
    response.raw_headers = response_headers(upstream.headers, base_path(found.id)) + [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in JUPYTER_HEADERS.items()
    ]
    return response


async def _on_console_host(request: Request, ref: str) -> Response:
    """JupyterLab's paths on the console's host: the console's usual answers (log in, not
    yours, not running), and for its owner where JupyterLab is now."""
    found = await _owner_target(request, ref)
    if isinstance(found, Response):
        return found
    context = {
        "title": "JupyterLab has an address of its own",
        "message": "JupyterLab is served at an address of its own, apart from the console: "
        f"open it with “Open JupyterLab” on the page of instance {found.name}",
    }
    return render(request, "errors/error.html", context, status_code=404)


@router.websocket("/instances/{ref}/jupyter/{path:path}")
async def jupyter_websocket(websocket: WebSocket, ref: str, path: str) -> None:
    """Kernel and terminal channels: a WebSocket client inside the runner stream."""
    if not same_origin(websocket):
        await refuse(websocket, 403, "this connection was opened from another site")
        return
    target = await _access(websocket, ref)
    if isinstance(target, tuple):
        await refuse(websocket, target[0], target[1])
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


class JupyterOriginGate:
    """On a Jupyter host (`<id>.GPULEASE_JUPYTER_DOMAIN`) only that instance's JupyterLab
    and the ticket entry answer: no console page, API or static file is served there, so
    no console form or cookie can ever exist on that origin."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            instance_id = _scope_instance(scope)
            if instance_id is not None and not _allowed(str(scope["path"]), instance_id):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 4404})
                    return
                await _text("not found: this address serves JupyterLab only", 404)(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


def _scope_instance(scope: Scope) -> int | None:
    runtime = getattr(getattr(scope.get("app"), "state", None), "runtime", None)
    if not isinstance(runtime, Runtime):
        return None
    for name, value in scope.get("headers", ()):
        if name == b"host":
            return instance_of_host(value.decode("latin-1"), runtime.settings.jupyter_domain)
    return None


def _allowed(path: str, instance_id: int) -> bool:
    return path == ENTER_PATH or path.startswith(base_path(instance_id))
