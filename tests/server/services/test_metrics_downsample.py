"""Downsampling for charts keeps the ends and every bucket's extremes, within max_points."""

from __future__ import annotations

import random

from gpulease.server.services.metrics.downsample import bucket_means, min_max_indices


def test_min_max_keeps_ends_and_extremes_within_the_budget() -> None:
    rng = random.Random(6)
    values = [rng.gauss(0.0, 1.0) for _ in range(100_000)]
    values[12_345], values[99_998] = -100.0, 100.0
    for max_points in (10, 11, 500, 2000):
        kept = min_max_indices(values, max_points)
        assert len(kept) <= max_points
        assert kept == sorted(set(kept))
        assert kept[0] == 0 and kept[-1] == len(values) - 1
        assert 12_345 in kept and 99_998 in kept


def test_short_series_are_returned_whole() -> None:
    assert min_max_indices([3.0, 1.0, 2.0], 10) == [0, 1, 2]
    assert bucket_means([1.0, 2.0], [5.0, None], 10) == ([1.0, 2.0], [5.0, None])


def test_bucket_means_average_and_keep_gaps() -> None:
    times = [float(t) for t in range(8)]
    values: list[float | None] = [1.0, 3.0, None, None, 2.0, None, 4.0, 6.0]
    assert bucket_means(times, values, 4) == ([0.0, 2.0, 4.0, 6.0], [2.0, None, 2.0, 5.0])
