"""Log batching: chunks per stream, consecutive seq from 0, kept until acknowledged."""

from __future__ import annotations

import threading
from itertools import count

from gpulease.runner.logs import LogBatcher, split_utf8


def ticking_clock() -> LogBatcher:
    ticks = count(100)
    return LogBatcher(max_chunk_bytes=16, clock=lambda: float(next(ticks)))


def test_writes_of_one_stream_merge_and_streams_keep_their_order() -> None:
    batcher = ticking_clock()
    batcher.write("stdout", "a\n")
    batcher.write("stdout", "b\n")
    batcher.write("stderr", "oops\n")
    batcher.write("stdout", "c\n")

    batcher.seal()
    chunks = batcher.unacked()

    assert [(c.seq, c.stream, c.data, c.time) for c in chunks] == [
        (0, "stdout", "a\nb\n", 100.0),
        (1, "stderr", "oops\n", 102.0),
        (2, "stdout", "c\n", 103.0),
    ]


def test_seq_continues_across_seals_and_survives_until_ack() -> None:
    batcher = ticking_clock()
    batcher.write("stdout", "one\n")
    batcher.seal()
    first = batcher.unacked()
    batcher.write("stdout", "two\n")
    batcher.seal()

    assert [c.seq for c in batcher.unacked()] == [0, 1]  # not acknowledged: sent again
    batcher.ack(first)
    assert [c.seq for c in batcher.unacked()] == [1]
    batcher.ack(batcher.unacked())
    assert batcher.drained
    batcher.write("stderr", "three\n")
    batcher.seal()
    assert [c.seq for c in batcher.unacked()] == [2]


def test_chunks_are_capped_and_never_split_a_character() -> None:
    batcher = ticking_clock()
    text = "é" * 20  # 40 bytes

    batcher.write("stdout", text)
    batcher.seal()
    chunks = batcher.unacked()

    assert "".join(c.data for c in chunks) == text
    assert all(len(c.data.encode()) <= 16 for c in chunks)
    assert [c.seq for c in chunks] == list(range(len(chunks)))


def test_unacked_sends_a_bounded_batch() -> None:
    batcher = ticking_clock()
    for i in range(10):
        batcher.write("stdout" if i % 2 else "stderr", f"{i:015d}\n")
    batcher.seal()

    batch = batcher.unacked(max_bytes=40)

    assert [c.seq for c in batch] == [0, 1]
    assert len(batcher.unacked(max_bytes=1)) == 1  # always at least one


def test_a_full_chunk_wakes_the_reporter_early() -> None:
    batcher = LogBatcher(max_chunk_bytes=8)
    woke = threading.Event()

    def reporter() -> None:
        batcher.wait(timeout=10)
        woke.set()

    thread = threading.Thread(target=reporter)
    thread.start()
    batcher.write("stdout", "1234")
    assert not woke.wait(0.1)
    batcher.write("stdout", "5678")
    assert woke.wait(2)
    thread.join()


def test_the_first_output_after_a_quiet_time_wakes_the_reporter_at_once() -> None:
    """A reporter with nothing to send waits for output, not for its batching interval:
    a run's first line reaches the server as soon as it is written."""
    batcher = LogBatcher(max_chunk_bytes=1024)
    woke = threading.Event()

    def reporter() -> None:
        batcher.wait_for_output(timeout=10)
        woke.set()

    thread = threading.Thread(target=reporter)
    thread.start()
    assert not woke.wait(0.1)
    batcher.write("stdout", "hi\n")  # far from a full chunk
    assert woke.wait(2)
    thread.join()
    batcher.wait_for_output(timeout=10)  # output is pending: no wait at all
    batcher.seal()
    assert [c.data for c in batcher.unacked()] == ["hi\n"]


def test_close_wakes_the_reporter() -> None:
    batcher = LogBatcher()
    thread = threading.Thread(target=batcher.wait, args=(10,))
    thread.start()
    batcher.close()
    thread.join(timeout=2)
    assert not thread.is_alive() and batcher.closed


def test_split_utf8() -> None:
    assert split_utf8("abc", 10) == [("abc", 3)]
    assert split_utf8("aé€x", 3) == [("aé", 3), ("€", 3), ("x", 1)]
