"""The browser terminal: a page, and its WebSocket bridged to a shell in the instance."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import Response, WebSocket
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from gpulease.core.errors import NotFound
from gpulease.server.db import transaction
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.api.runner_streams import close_quietly, refuse, until_first_ends
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.routers.ui.guards import PageViewer, console_router, same_site
from gpulease.server.runtime import Runtime
from gpulease.server.services.instances import lifecycle
from gpulease.server.services.instances.states import RUNNING
from gpulease.server.services.streams import (
    MAX_REF,
    StreamHub,
    StreamUnavailable,
    Target,
    console_target,
    hub_of,
    record_activity,
)

router = console_router()
log = logging.getLogger(__name__)

MAX_SIZE = 1000
# Close codes the page explains: the instance is not running, the runner did not answer.
NOT_RUNNING_CODE = 4409
UNAVAILABLE_CODE = 4504


def _find(rt: Runtime, secret: str | None, ref: str) -> tuple[bool, Target | None]:
    with transaction(rt.sessions) as session:
        return console_target(session, secret, ref)


async def lookup(conn: HTTPConnection, ref: str) -> tuple[bool, Target | None]:
    rt = conn.app.state.runtime
    assert isinstance(rt, Runtime)
    return await run_in_threadpool(_find, rt, conn.cookies.get(SESSION_COOKIE), ref)


def _record(rt: Runtime, instance_id: int) -> None:
    with transaction(rt.sessions) as session:
        record_activity(session, instance_id)


async def note_activity(conn: HTTPConnection, hub: StreamHub, instance_id: int) -> None:
    if hub.due_for_activity(instance_id):
        await run_in_threadpool(_record, conn.app.state.runtime, instance_id)


class Activity:
    """A long-lived connection's activity, recorded beside it (keystrokes never wait for
    the database); drain() before the connection's handler returns."""

    def __init__(self, conn: HTTPConnection, hub: StreamHub, instance_id: int) -> None:
        self._rt = conn.app.state.runtime
        self._hub = hub
        self._instance_id = instance_id
        self._pending: set[asyncio.Task[None]] = set()

    def note(self) -> None:
        if self._hub.due_for_activity(self._instance_id):
            task = asyncio.create_task(self._record())
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _record(self) -> None:
        try:
            await run_in_threadpool(_record, self._rt, self._instance_id)
        except Exception:
            log.exception("recording activity of instance %d failed", self._instance_id)

    async def drain(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending)


@router.get("/instances/{ref}/terminal")
def terminal_page(ref: str, console: PageViewer) -> Response:
    """The terminal on a page of its own (the instance page embeds the same panel)."""
    try:
        if not ref or len(ref) > MAX_REF:
            raise NotFound(f"you have no instance {ref[:MAX_REF]!r}; see the dashboard")
        instance = lifecycle.get_instance(console.session, console.user, ref)
    except NotFound as exc:
        return console.refused(exc, "Instance not found")
    positions = lifecycle.queue_position_map(console.session)
    public = instance_public(console.session, instance, console.runtime.catalog, positions)
    context = {"instance": public, "csrf": "", "standalone": True}
    return console.render("instances/terminal.html", context, page="instance", terminal=True)


def _size(value: Any, default: int) -> int:
    try:
        return min(max(int(value), 1), MAX_SIZE)
    except (TypeError, ValueError):
        return default


@router.websocket("/instances/{ref}/terminal/ws")
async def terminal_socket(websocket: WebSocket, ref: str) -> None:
    """Binary frames: keystrokes in, terminal output out. Text frames: JSON, `resize`
    from the page, `exit` / `error` to it."""
    # WebSockets have no CORS: without the console's one origin check any site could
    # open a shell with the visitor's cookie.
    if not same_site(websocket):
        await refuse(websocket, 403, "this terminal was opened from another site")
        return
    logged_in, target = await lookup(websocket, ref)
    if not logged_in:
        await refuse(websocket, 401, "log in to the console first")
        return
    if target is None:
        await refuse(websocket, 404, f"you have no instance {ref[:MAX_REF]!r}")
        return
    await websocket.accept()
    if target.status != RUNNING:
        await _end(
            websocket,
            NOT_RUNNING_CODE,
            f"instance {target.name} is {target.status}; start it to use the terminal",
        )
        return
    hub = hub_of(websocket.app.state)
    params = websocket.query_params
    stream = hub.open(
        target.id,
        "terminal",
        cols=_size(params.get("cols"), 80),
        rows=_size(params.get("rows"), 24),
    )
    try:
        try:
            runner = await hub.connect(stream)
        except StreamUnavailable as exc:
            await _end(websocket, UNAVAILABLE_CODE, exc.message)
            return
        activity = Activity(websocket, hub, target.id)
        try:
            await relay(websocket, runner, on_input=activity.note)
        finally:
            await activity.drain()
            await close_quietly(websocket)
    finally:
        hub.close(stream)


async def _end(websocket: WebSocket, code: int, message: str) -> None:
    with contextlib.suppress(Exception):  # the browser may have left already
        await websocket.send_text(json.dumps({"type": "error", "message": message}))
    await close_quietly(websocket, code, message[:120])


async def relay(browser: WebSocket, runner: WebSocket, *, on_input: Callable[[], None]) -> None:
    """Copy frames both ways until either side closes; then close the runner's end."""

    async def upstream() -> None:
        while True:
            message = await browser.receive()
            if message["type"] == "websocket.disconnect":
                return
            data, text = message.get("bytes"), message.get("text")
            if data:
                await runner.send_bytes(data)
                on_input()
            elif text:
                control = _resize(text)
                if control is not None:
                    await runner.send_text(control)

    async def downstream() -> None:
        while True:
            message = await runner.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await browser.send_bytes(message["bytes"])
            elif message.get("text") is not None:
                await browser.send_text(message["text"])

    try:
        await until_first_ends(upstream(), downstream())
    finally:
        await close_quietly(runner)  # the caller closes the browser's socket


def _resize(text: str) -> str | None:
    """The page's resize message, checked and re-encoded; None for anything else."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("type") != "resize":
        return None
    return json.dumps(
        {
            "type": "resize",
            "cols": _size(message.get("cols"), 80),
            "rows": _size(message.get("rows"), 24),
        }
    )
