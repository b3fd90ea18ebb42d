"""FIFO placement per GPU model: first come, first served, without one model blocking another.

The head of each model's queue blocks later requests for that model (no overtaking, so a
large request is never starved by small ones), but a T4 request never waits behind an A100
one. A request may be limited to some nodes (those whose driver runs its template); it then
waits, still holding its model's queue, until GPUs free up on one of them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FreeGpu:
    node_id: int
    gpu_id: int
    index: int
    model: str


@dataclass(frozen=True)
class Request:
    instance_id: int
    model: str
    count: int  # 0 = CPU only: needs a node, no GPU
    # The nodes it may run on (their driver runs its template); None = any node.
    nodes: frozenset[int] | None = None

    def allows(self, node_id: int) -> bool:
        return self.nodes is None or node_id in self.nodes


@dataclass(frozen=True)
class Placement:
    instance_id: int
    node_id: int
    gpu_ids: tuple[int, ...]


def place_fifo(
    queue: Sequence[Request], free: Sequence[FreeGpu], node_ids: Sequence[int]
) -> list[Placement]:
    """Decide which queued requests start now. `queue` is in arrival order.

    A request goes to the node where it fits most tightly (fewest free GPUs of its model
    that still fit), which keeps large blocks free for large requests.
    """
    pool: dict[tuple[int, str], list[FreeGpu]] = defaultdict(list)
    for gpu in sorted(free, key=lambda g: (g.node_id, g.index)):
        pool[(gpu.node_id, gpu.model)].append(gpu)
    blocked: set[str] = set()
    placements: list[Placement] = []
    for req in queue:
        if req.count == 0:
            allowed = [node_id for node_id in node_ids if req.allows(node_id)]
            if allowed:
                placements.append(Placement(req.instance_id, min(allowed), ()))
            continue
        if req.model in blocked:
            continue
        fits = [
            (len(gpus), node_id)
            for (node_id, model), gpus in pool.items()
            if model == req.model and len(gpus) >= req.count and req.allows(node_id)
        ]
        if not fits:
            blocked.add(req.model)
            continue
        _, node_id = min(fits)
        gpus = pool[(node_id, req.model)]
        taken, pool[(node_id, req.model)] = gpus[: req.count], gpus[req.count :]
        placements.append(Placement(req.instance_id, node_id, tuple(g.gpu_id for g in taken)))
    return placements


def queue_positions(queue: Sequence[Request]) -> dict[int, int]:
    """1-based place of each request in its model's queue."""
    seen: dict[str, int] = defaultdict(int)
    positions = {}
    for req in queue:
        seen[req.model] += 1
        positions[req.instance_id] = seen[req.model]
    return positions
