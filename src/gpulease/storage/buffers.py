"""Large buffers kept for the next request instead of fresh memory each time.

On the virtual machines gpulease runs on, filling memory the process has not touched
lately costs several times what refilling memory it just used does (the host takes freed
guest pages back, and each new page faults and is zeroed). A dataset push moves its bytes
in packs of 16 MiB; each one used to land in fresh memory twice on the server, once as the
request body and once as the sealed blob written to disk.
"""

from __future__ import annotations

import contextlib
import mmap
import threading


class BufferPool:
    """Page-aligned anonymous mappings, the largest `keep` of them up to `keep_bytes` each
    kept for the next take().

    A buffer is kept only if nothing still views it: give() checks that no memoryview of
    it is left (an exception's traceback may hold one), so a kept buffer is never
    overwritten under a reader."""

    STEP = 4 << 20

    def __init__(self, keep: int, keep_bytes: int) -> None:
        self.keep = keep
        self.keep_bytes = keep_bytes
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> mmap.mmap:
        """A buffer of at least size bytes: the smallest kept one that fits, or a new one.
        Its bytes are whatever the last user left there."""
        with self._lock:
            fitting = [buffer for buffer in self._free if len(buffer) >= size]
            if fitting:
                buffer = min(fitting, key=len)
                self._free.remove(buffer)
                return buffer
        return mmap.mmap(-1, max(-(-size // self.STEP), 1) * self.STEP)

    def give(self, buffer: mmap.mmap) -> None:
        """Back from its user: kept if it is among the largest up to keep_bytes and no view
        of it is left; otherwise unmapped (at once, or when its last view goes)."""
        unmapped = [buffer]
        if len(buffer) <= self.keep_bytes and _unviewed(buffer):
            with self._lock:
                self._free.append(buffer)
                self._free.sort(key=len, reverse=True)
                unmapped = self._free[self.keep :]
                del self._free[self.keep :]
        for extra in unmapped:
            with contextlib.suppress(BufferError):  # still viewed: goes with its last view
                extra.close()

    def kept(self) -> int:
        """How many buffers wait for a take()."""
        with self._lock:
            return len(self._free)


def _unviewed(buffer: mmap.mmap) -> bool:
    """Whether no memoryview of buffer is alive: an mmap refuses to resize while one is,
    and a resize to its own size changes nothing else."""
    try:
        buffer.resize(len(buffer))
    except BufferError:
        return False
    return True
