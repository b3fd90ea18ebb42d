"""Byte streams between the server and a runner (terminal, Jupyter), paired in this process.

The runner opens connections outward only. When the server needs a stream into an instance
it registers one here with a fresh random id; the runner's long poll hands the id out
(`streams` in `/runner/v1/commands`), and the runner connects a WebSocket to
`/runner/v1/streams/{id}` with its token. The party that asked (a browser's terminal socket,
the Jupyter proxy) waits here until that socket arrives, then owns it until it finishes.

Pairing lives in memory: with several server replicas, the browser's connection and the
runner's stream must reach the same replica (sticky routing by instance), or the stream is
never claimed and the asker gives up after ATTACH_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session
from starlette.websockets import WebSocket

from gpulease.core.errors import GpuleaseError, NotFound, Unauthorized
from gpulease.server.db import utcnow
from gpulease.server.orm import User
from gpulease.server.services import tokens
from gpulease.server.services.instances import activity, lifecycle

KINDS = ("terminal", "jupyter")
# How long an asker waits for the runner to connect its end of a stream.
ATTACH_TIMEOUT_S = 30.0
# Terminal input and proxied Jupyter requests record activity at most this often per
# instance (services/instances/activity.touch throttles the database writes again).
ACTIVITY_EVERY_S = 10.0
MAX_REF = 64


class StreamUnavailable(GpuleaseError):
    """The runner did not connect the stream in time (it is busy, gone, or on another
    replica); the message says so for people."""

    status = 503


@dataclass(frozen=True)
class Target:
    """An instance a console user may open a terminal or JupyterLab in: their own."""

    id: int
    name: str
    status: str


def console_target(session: Session, secret: str | None, ref: str) -> tuple[bool, Target | None]:
    """(logged in, the instance `ref` of the user whose session secret this is, or None).
    Another user's instance, like one that does not exist, is None."""
    if not secret:
        return False, None
    try:
        user = tokens.resolve_token(session, secret)
    except Unauthorized:
        return False, None
    return True, target_of(session, user, ref)


def target_of(session: Session, user: User, ref: str | int) -> Target | None:
    """The instance `ref` (a name or an id) when it is `user`'s, else None: another user's
    instance reads like one that does not exist."""
    if isinstance(ref, str) and (not ref or len(ref) > MAX_REF):
        return None
    try:
        instance = lifecycle.get_instance(session, user, ref)
    except NotFound:
        return None
    return Target(instance.id, instance.name, instance.status)


def record_activity(session: Session, instance_id: int) -> None:
    """Terminal input or a Jupyter request: the instance is in use (idle stop waits)."""
    activity.touch(session, instance_id, utcnow())


@dataclass
class Stream:
    """One requested stream: who it is for, what it carries, and the runner's socket once
    it arrives. `finished` tells the runner's endpoint that the asker is done with it."""

    id: str
    instance_id: int
    kind: str
    params: dict[str, Any]
    created: float
    claimed: bool = False
    socket: asyncio.Future[WebSocket] = field(default_factory=asyncio.Future)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def announcement(self) -> dict[str, Any]:
        """The entry of the runner's `streams` list."""
        return {**self.params, "id": self.id, "kind": self.kind}


class StreamHub:
    """All streams asked for in this server process. Used from the event loop only."""

    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self._streams: dict[str, Stream] = {}
        self._wake = wake
        self._touched: dict[int, float] = {}

    def open(self, instance_id: int, kind: str, **params: Any) -> Stream:
        """Ask instance's runner for a stream; wakes the runners' long polls."""
        if kind not in KINDS:
            raise ValueError(f"unknown stream kind {kind!r}")
        self._expire()
        stream = Stream(
            id=secrets.token_urlsafe(24),
            instance_id=instance_id,
            kind=kind,
            params=dict(params),
            created=time.monotonic(),
        )
        self._streams[stream.id] = stream
        self._wake()
        return stream

    def wanted(self, instance_id: int) -> list[dict[str, Any]]:
        """Streams of this instance its runner has not connected yet."""
        self._expire()
        return [
            s.announcement()
            for s in self._streams.values()
            if s.instance_id == instance_id and not s.claimed
        ]

    def claim(self, instance_id: int, stream_id: str) -> Stream | None:
        """The stream the runner of instance_id connects to; None for an unknown id, one
        already taken, or one of another instance (a runner cannot reach others' streams)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.claimed or stream.instance_id != instance_id:
            return None
        stream.claimed = True
        return stream

    def attach(self, stream: Stream, websocket: WebSocket) -> None:
        if not stream.socket.done():
            stream.socket.set_result(websocket)

    async def connect(self, stream: Stream, timeout: float = ATTACH_TIMEOUT_S) -> WebSocket:
        """The runner's socket for stream, once it connected. StreamUnavailable after
        timeout; the stream is then forgotten."""
        try:
            return await asyncio.wait_for(asyncio.shield(stream.socket), timeout)
        except TimeoutError:
            self.close(stream)
            raise StreamUnavailable(
                "the instance did not open the connection in time; it may be busy or "
                "restarting: try again in a moment"
            ) from None

    def close(self, stream: Stream) -> None:
        """The asker is done: the runner's endpoint closes its socket."""
        self._streams.pop(stream.id, None)
        stream.finished.set()
        if not stream.socket.done():
            stream.socket.cancel()

    def due_for_activity(self, instance_id: int) -> bool:
        """True at most once per ACTIVITY_EVERY_S per instance."""
        now = time.monotonic()
        if now - self._touched.get(instance_id, -ACTIVITY_EVERY_S) < ACTIVITY_EVERY_S:
            return False
        self._touched[instance_id] = now
        return True

    def _expire(self) -> None:
        """Forget streams nobody connected long after their asker gave up."""
        limit = time.monotonic() - 2 * ATTACH_TIMEOUT_S
        for stream in [s for s in self._streams.values() if not s.claimed and s.created < limit]:
            self.close(stream)


def hub_of(state: Any) -> StreamHub:
    """The app's hub (app.state.streams), made on first use."""
    hub = getattr(state, "streams", None)
    if not isinstance(hub, StreamHub):
        signals = getattr(state, "signals", None)
        runs = getattr(signals, "runs", None)
        hub = StreamHub(wake=runs.fire if runs is not None else lambda: None)
        state.streams = hub
    return hub
