"""The forward simulation's view of the waiting requests it has not started yet (`_Rest`),
which deals the queue into its classes only as far as a pass reads: on random queues and
free maps (seeded), pass after pass, each read to a random depth and some of what it read
started, it reads exactly what a plain filter of the whole queue reads."""

from __future__ import annotations

import itertools
import random

import pytest

from gpulease.scheduler.model import Request
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import _Rest

MODELS = ("A", "B", "C")


def plain(waiting: list[Request], started: set[int], free: FreeMap) -> list[Request]:
    """What a pass on `free` reads: the GPU requests not started, in order, but of those too
    big for their model's largest free block only the first per model."""
    out, too_big = [], set()
    for req in waiting:
        if not req.count or req.id in started:
            continue
        if req.count <= free.largest(req.model):
            out.append(req)
        elif req.model not in too_big:
            too_big.add(req.model)
            out.append(req)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_a_pass_reads_what_a_plain_filter_of_the_queue_reads(seed: int) -> None:
    rng = random.Random(seed)
    models = MODELS[: rng.randint(1, 3)]
    waiting = [
        Request(i, "u", rng.choice(models), rng.choice((0, 1, 1, 2, 4, 8)))
        for i in rng.sample(range(1000), rng.randint(0, 120))
    ]
    free = FreeMap()
    for n in range(rng.randint(1, 6)):
        free.add_node(rng.choice(models), n, rng.randint(0, 8))
    rest = _Rest(waiting)
    started: set[int] = set()
    for _ in range(25):
        for model in models:  # GPUs come back and are taken between passes
            nodes = list(free.nodes(model))
            if nodes:
                n = rng.choice(nodes)
                if rng.random() < 0.5:
                    free.give(model, (n,), rng.randint(1, 4))
                elif free.free(model, n):
                    free.take(model, (n,), rng.randint(1, free.free(model, n)))
        expected = plain(waiting, started, free)
        depth = rng.randint(0, len(expected) + 1)
        read = list(itertools.islice(rest.order(free), depth))
        assert read == expected[:depth]
        for req in read:
            if rng.random() < 0.4:
                rest.started(req)
                started.add(req.id)
        assert rest.any_left() == any(r.count and r.id not in started for r in waiting)
