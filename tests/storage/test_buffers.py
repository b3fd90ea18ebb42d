"""The buffers kept for the next pack: reused when nothing views them, never overwritten
under a view left behind, and never more than the pool keeps."""

from __future__ import annotations

from gpulease.storage.buffers import BufferPool


def test_a_given_buffer_is_taken_again_for_a_body_it_fits() -> None:
    pool = BufferPool(keep=2, keep_bytes=16 << 20)
    first = pool.take(5 << 20)
    assert len(first) == 8 << 20  # whole steps of 4 MiB
    pool.give(first)
    assert pool.kept() == 1
    assert pool.take(1 << 20) is first
    assert pool.kept() == 0
    assert len(pool.take(0)) == BufferPool.STEP  # a mapping is never empty


def test_the_smallest_fitting_buffer_is_taken_and_only_the_largest_few_kept() -> None:
    pool = BufferPool(keep=2, keep_bytes=16 << 20)
    small, middle, large, huge = (pool.take(n << 20) for n in (4, 8, 12, 20))
    for buffer in (small, middle, large, huge):
        pool.give(buffer)
    assert pool.kept() == 2
    assert small.closed and huge.closed  # the smallest beyond keep, the one over keep_bytes
    assert pool.take(5 << 20) is middle
    assert pool.take(5 << 20) is large


def test_a_buffer_still_viewed_is_not_kept_nor_unmapped_under_its_view() -> None:
    pool = BufferPool(keep=2, keep_bytes=16 << 20)
    buffer = pool.take(1 << 20)
    with memoryview(buffer) as whole:
        left_behind = whole[10:20]  # as a traceback's frame might keep one
    left_behind[:] = b"0123456789"
    pool.give(buffer)
    assert pool.kept() == 0 and not buffer.closed
    other = pool.take(1 << 20)
    assert other is not buffer
    other[:20] = b"x" * 20
    assert bytes(left_behind) == b"0123456789"
    left_behind.release()
    pool.give(buffer)
    assert pool.kept() == 1
