"""Per-instance wake-ups for the runner's long poll: a stop, a release or a new run rings
its instance's bell once the transaction that recorded it commits.

In-process only: the long poll also re-reads the database every FALLBACK_S, so a change a
replica made that never rings here is still seen.
"""

from __future__ import annotations

import asyncio
import threading

from sqlalchemy import event
from sqlalchemy.orm import Session

FALLBACK_S = 1.0
_PENDING = "gpulease_runner_rings"


class Doorbell:
    """Rings from any thread wake every coroutine listening for that instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[int, set[Listener]] = {}

    def listen(self, instance_id: int) -> Listener:
        """Start listening before reading the state, so a ring in between is not lost."""
        return Listener(self, instance_id, asyncio.get_running_loop())

    def ring(self, instance_id: int) -> None:
        with self._lock:
            listeners = list(self._listeners.get(instance_id, ()))
        for listener in listeners:
            listener.wake()

    def _add(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.setdefault(listener.instance_id, set()).add(listener)

    def _remove(self, listener: Listener) -> None:
        with self._lock:
            listeners = self._listeners.get(listener.instance_id)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[listener.instance_id]


class Listener:
    def __init__(self, bell: Doorbell, instance_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self._bell = bell
        self.instance_id = instance_id
        self._loop = loop
        self._event = asyncio.Event()

    def __enter__(self) -> Listener:
        self._bell._add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._bell._remove(self)

    def wake(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout: float) -> bool:
        """True if rung within timeout (or since the last wait); then listens afresh."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self._event.clear()
        return True


doorbell = Doorbell()


def ring_after_commit(session: Session, instance_id: int) -> None:
    """Ring instance_id's bell when session commits (never for a rolled back change)."""
    session.info.setdefault(_PENDING, set()).add(instance_id)


@event.listens_for(Session, "after_commit")
def _ring_committed(session: Session) -> None:
    for instance_id in session.info.pop(_PENDING, ()):
        doorbell.ring(instance_id)


@event.listens_for(Session, "after_rollback")
def _forget_rolled_back(session: Session) -> None:
    session.info.pop(_PENDING, None)
