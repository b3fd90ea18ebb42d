"""Downsampling for charts: few enough points to draw at once, every extreme still there."""

from __future__ import annotations

from collections.abc import Sequence


def min_max_indices(values: Sequence[float], max_points: int) -> list[int]:
    """Indices (ascending) of at most max_points of values: the first and the last, and the
    lowest and the highest value of each of (max_points - 2) // 2 equal runs between them.

    So a spike or a dip of a single step survives, which averaging or striding would lose,
    and the global minimum and maximum are always among the kept points.
    """
    n = len(values)
    if n <= max_points:
        return list(range(n))
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    buckets = max(1, (max_points - 2) // 2)
    inner = n - 2
    kept = [0]
    for b in range(buckets):
        lo = 1 + b * inner // buckets
        hi = 1 + (b + 1) * inner // buckets
        if lo >= hi:
            continue
        low = high = lo
        low_value = high_value = values[lo]
        for i in range(lo + 1, hi):
            v = values[i]
            if v < low_value:
                low, low_value = i, v
            elif v > high_value:
                high, high_value = i, v
        if low == high:
            kept.append(low)
        else:
            kept.extend((low, high) if low < high else (high, low))
    kept.append(n - 1)
    return kept


def bucket_means(
    times: Sequence[float], values: Sequence[float | None], max_points: int
) -> tuple[list[float], list[float | None]]:
    """At most max_points (time, mean value) pairs of a time series, in equal runs of
    consecutive samples; a run whose values are all None has the mean None."""
    n = len(times)
    if n <= max_points:
        return list(times), list(values)
    out_t: list[float] = []
    out_v: list[float | None] = []
    for b in range(max_points):
        lo, hi = b * n // max_points, (b + 1) * n // max_points
        if lo >= hi:
            continue
        present = [v for v in values[lo:hi] if v is not None]
        out_t.append(times[lo])
        out_v.append(sum(present) / len(present) if present else None)
    return out_t, out_v
