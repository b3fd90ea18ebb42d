"""Wake-ups inside one server process: a run was queued, a log line arrived.

They only shorten waits: every waiter also re-reads the database on a timeout, so replicas
that never see each other's signals still converge.
"""

from __future__ import annotations

import asyncio


class Broadcast:
    """Fire from any thread; every coroutine waiting at that moment wakes up."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def _current(self) -> asyncio.Event:
        if self._event is None:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        return self._event

    async def wait(self, timeout: float) -> bool:
        """True if fired within timeout."""
        event = self._current()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def fire(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._swap)

    def _swap(self) -> None:
        old, self._event = self._event, asyncio.Event()
        if old is not None:
            old.set()
