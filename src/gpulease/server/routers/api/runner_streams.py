"""The runner's end of a stream: `/runner/v1/streams/{id}`, a WebSocket with the runner token."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gpulease.core.errors import Unauthorized
from gpulease.schemas.runner import RUNNER_API
from gpulease.server.db import transaction
from gpulease.server.routers.deps import bearer
from gpulease.server.runtime import Runtime
from gpulease.server.services import runners
from gpulease.server.services.streams import hub_of

router = APIRouter(prefix=RUNNER_API, tags=["runner"])

# Close codes (also the HTTP status of a refused handshake where the server can send one).
NOT_FOUND_CODE = 4404
UNAUTHORIZED_CODE = 4401


async def refuse(websocket: WebSocket, status: int, message: str) -> None:
    """Refuse a WebSocket before accepting it: an HTTP status where the server supports
    denial responses (uvicorn does), else a close with 4000 + status."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(
            Response(message + "\n", status_code=status, media_type="text/plain")
        )
    else:
        await websocket.close(code=4000 + status, reason=message[:120])


@router.websocket("/streams/{stream_id}")
async def runner_stream(websocket: WebSocket, stream_id: str) -> None:
    token = bearer(websocket)
    if token is None:
        await refuse(websocket, 401, "runner streams need 'Authorization: Bearer <runner token>'")
        return
    rt = websocket.app.state.runtime
    assert isinstance(rt, Runtime)

    def _instance_id() -> int | None:
        with transaction(rt.sessions) as session:
            try:
                return runners.instance_for_token(session, token).id
            except Unauthorized:
                return None

    instance_id = await run_in_threadpool(_instance_id)
    if instance_id is None:
        await refuse(websocket, 401, "unknown runner token")
        return
    hub = hub_of(websocket.app.state)
    stream = hub.claim(instance_id, stream_id)
    if stream is None:
        await refuse(websocket, 404, f"no stream {stream_id!r} waits for this instance")
        return
    await websocket.accept()
    hub.attach(stream, websocket)
    try:
        # The asker reads and writes this socket; this handler only keeps it open.
        await stream.finished.wait()
    finally:
        hub.close(stream)
        await close_quietly(websocket)


async def until_first_ends(*pumps: Coroutine[Any, Any, None]) -> None:
    """Run the pumps of a bridged connection until one ends (one side hung up), then cancel
    the others and wait for them; the disconnect errors that follow are expected."""
    tasks = [asyncio.create_task(pump) for pump in pumps]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, RuntimeError, WebSocketDisconnect):
                await task


async def close_quietly(websocket: WebSocket, code: int = 1000, reason: str = "") -> None:
    """Close a socket unless it is closed already; a peer that vanished is no error."""
    if websocket.application_state != WebSocketState.CONNECTED:
        return
    with contextlib.suppress(Exception):  # the transport may be gone in any of many ways
        await websocket.close(code=code, reason=reason)
