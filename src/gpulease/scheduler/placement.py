"""Free GPUs per model per node, and best-fit placement on them (a 1-GPU request takes the
fullest node that still fits, so a block of 4 stays whole for a 4-GPU request)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Container, Iterable, Mapping


class FreeMap:
    """Free GPU counts per (model, node), bucketed by count (each bucket a sorted list of
    node ids) so that a best fit, the largest free block and the total are found without
    walking every node, and the lowest id of a bucket is its first."""

    __slots__ = ("_free", "_buckets", "_total", "_largest")

    def __init__(self, free: Mapping[str, Mapping[int, int]] | None = None) -> None:
        self._free: dict[str, dict[int, int]] = {}
        self._buckets: dict[str, list[list[int]]] = {}
        self._total: dict[str, int] = {}
        # the largest free block per model, kept as GPUs move (-1: look it up again)
        self._largest: dict[str, int] = {}
        for model, nodes in (free or {}).items():
            for node_id, n in nodes.items():
                self.add_node(model, node_id, n)

    def add_node(self, model: str, node_id: int, n: int) -> None:
        self._free.setdefault(model, {})
        self._buckets.setdefault(model, [[]])
        self._total.setdefault(model, 0)
        self._free[model].setdefault(node_id, 0)
        self.give(model, (node_id,), n)

    def copy(self) -> FreeMap:
        other = FreeMap.__new__(FreeMap)
        other._free = {m: dict(nodes) for m, nodes in self._free.items()}
        other._buckets = {m: [list(b) for b in bs] for m, bs in self._buckets.items()}
        other._total = dict(self._total)
        other._largest = dict(self._largest)
        return other

    def models(self) -> Iterable[str]:
        return self._free.keys()

    def free(self, model: str, node_id: int) -> int:
        return self._free.get(model, {}).get(node_id, 0)

    def nodes(self, model: str) -> Mapping[int, int]:
        return self._free.get(model, {})

    def total(self, model: str) -> int:
        return self._total.get(model, 0)

    def total_below(self, model: str, count: int) -> int:
        """Free GPUs of `model` on nodes with fewer than `count` free (stranded for it)."""
        buckets = self._buckets.get(model, [])
        return sum(k * len(buckets[k]) for k in range(1, min(count, len(buckets))))

    def largest(self, model: str) -> int:
        largest = self._largest.get(model, 0)
        if largest >= 0:
            return largest
        buckets = self._buckets[model]
        largest = 0
        for k in range(len(buckets) - 1, 0, -1):
            if buckets[k]:
                largest = k
                break
        self._largest[model] = largest
        return largest

    def nodes_with(self, model: str, count: int) -> set[int]:
        """The nodes with at least `count` free GPUs of `model`, as a new set."""
        buckets = self._buckets.get(model, [])
        return set(itertools.chain.from_iterable(buckets[max(count, 1) :]))

    def fit(
        self,
        model: str,
        count: int,
        nodes: int = 1,
        allowed: Container[int] | None = None,
        home: int | None = None,
    ) -> tuple[int, ...] | None:
        """`nodes` distinct nodes with `count` free GPUs of `model` each, tightest first
        (lowest id among equals), or None when there are not enough of them. A one-node
        request goes to `home` (the node it last ran on, where its workspace is) whenever
        that node fits it."""
        buckets = self._buckets.get(model)
        if buckets is None or count < 1:
            return None
        if (
            home is not None
            and nodes == 1
            and self.free(model, home) >= count
            and (allowed is None or home in allowed)
        ):
            return (home,)
        chosen: list[int] = []
        for k in range(count, len(buckets)):
            bucket = buckets[k]
            if not bucket:
                continue
            if nodes == 1 and allowed is None:
                return (bucket[0],)
            for node_id in bucket:
                if allowed is None or node_id in allowed:
                    chosen.append(node_id)
                    if len(chosen) == nodes:
                        return tuple(chosen)
        return None

    def take(self, model: str, node_ids: Iterable[int], count: int) -> None:
        self._move(model, node_ids, -count)

    def give(self, model: str, node_ids: Iterable[int], count: int) -> None:
        self._move(model, node_ids, count)

    def _move(self, model: str, node_ids: Iterable[int], delta: int) -> None:
        # GPUs may come back on a node or of a model that has none free now (an instance that
        # holds all of them, a node that is gone): they join the map then.
        free = self._free.setdefault(model, {})
        buckets = self._buckets.setdefault(model, [[]])
        self._total.setdefault(model, 0)
        largest = self._largest.get(model, 0)
        for node_id in node_ids:
            old = free.get(node_id, 0)
            new = old + delta
            if new < 0:
                raise ValueError(f"node {node_id} has {old} free {model}, not {-delta}")
            while len(buckets) <= new:
                buckets.append([])
            if old:
                bucket = buckets[old]
                del bucket[bisect.bisect_left(bucket, node_id)]
                if old == largest and not bucket and new < old:
                    largest = -1  # the largest block went: found again when asked
            if new:
                bisect.insort(buckets[new], node_id)
                if new > largest >= 0:
                    largest = new
            free[node_id] = new
            self._total[model] += delta
        self._largest[model] = largest
