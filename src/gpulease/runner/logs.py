"""A run's output cut into numbered log chunks, each kept until the server acknowledged it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpulease.schemas.runner import RunnerLogChunk

MAX_CHUNK_BYTES = 64 * 1024
MAX_REQUEST_BYTES = 1024 * 1024
MAX_REQUEST_CHUNKS = 5000  # the server takes at most 10,000 chunks in one post


@dataclass
class _Pending:
    stream: str
    time: float
    parts: list[str]
    size: int


def split_utf8(data: str, limit: int) -> list[tuple[str, int]]:
    """data cut into pieces of at most limit UTF-8 bytes, never inside a character,
    each with its size in bytes."""
    raw = data.encode("utf-8", "replace")
    if len(raw) <= limit:
        return [(data, len(raw))]
    pieces = []
    start = 0
    while start < len(raw):
        end = min(start + limit, len(raw))
        while end < len(raw) and end > start + 1 and (raw[end] & 0xC0) == 0x80:
            end -= 1  # step back to the first byte of the character
        pieces.append((raw[start:end].decode("utf-8", "replace"), end - start))
        start = end
    return pieces


class Outbox:
    """What producer threads fill and one sender empties, under one condition: the sender
    waits until enough is pending (`_full`, asked with the lock held) or the producers are
    done (`close`). Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False

    def _full(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """No more will come; wakes a waiting sender."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def wait(self, timeout: float) -> None:
        """Sleep up to timeout, less once enough is pending or the outbox closes."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._full(), timeout=timeout)


class LogBatcher(Outbox):
    """The output of one run, written by reader threads and shipped by one reporter.

    Writes collect into pending chunks (one stream each, at most max_chunk_bytes); seal()
    numbers them with consecutive seq from 0; they stay in unacked() until ack(). Thread-safe.
    """

    def __init__(
        self, max_chunk_bytes: int = MAX_CHUNK_BYTES, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__()
        self._max = max_chunk_bytes
        self._clock = clock
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._unacked: list[RunnerLogChunk] = []
        self._next_seq = 0

    def write(self, stream: str, data: str) -> None:
        if not data:
            return
        now = self._clock()
        with self._cond:
            was_empty = not self._pending
            for piece, size in split_utf8(data, self._max):
                last = self._pending[-1] if self._pending else None
                if last is not None and last.stream == stream and last.size + size <= self._max:
                    last.parts.append(piece)
                    last.size += size
                else:
                    self._pending.append(_Pending(stream, now, [piece], size))
                self._pending_bytes += size
            if was_empty or self._pending_bytes >= self._max:
                self._cond.notify_all()

    def _full(self) -> bool:  # a full chunk is pending
        return self._pending_bytes >= self._max

    def wait_for_output(self, timeout: float) -> None:
        """Sleep up to timeout, less once any output is pending or the batcher closes."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or bool(self._pending), timeout=timeout)

    def seal(self) -> None:
        """Turn everything pending into numbered chunks."""
        with self._cond:
            for pending in self._pending:
                chunk = RunnerLogChunk(
                    seq=self._next_seq,
                    stream=pending.stream,
                    data="".join(pending.parts),
                    time=pending.time,
                )
                self._unacked.append(chunk)
                self._next_seq += 1
            self._pending = []
            self._pending_bytes = 0

    def unacked(self, max_bytes: int = MAX_REQUEST_BYTES) -> list[RunnerLogChunk]:
        """The oldest unacknowledged chunks, about max_bytes of them (at least one)."""
        with self._cond:
            batch: list[RunnerLogChunk] = []
            size = 0
            for chunk in self._unacked:
                if batch and (
                    size + len(chunk.data) > max_bytes or len(batch) >= MAX_REQUEST_CHUNKS
                ):
                    break
                batch.append(chunk)
                size += len(chunk.data)
            return batch

    def ack(self, chunks: Sequence[RunnerLogChunk]) -> None:
        if not chunks:
            return
        last = max(chunk.seq for chunk in chunks)
        with self._cond:
            self._unacked = [chunk for chunk in self._unacked if chunk.seq > last]

    @property
    def drained(self) -> bool:
        """Nothing pending and nothing waiting for an acknowledgement."""
        with self._cond:
            return not self._pending and not self._unacked
