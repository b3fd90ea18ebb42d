"""The free map's counts as GPUs move, against the same counts worked out from scratch."""

from __future__ import annotations

import random

import pytest

from gpulease.scheduler.placement import FreeMap


@pytest.mark.parametrize("seed", range(30))
def test_the_largest_block_and_the_total_follow_every_take_and_give(seed: int) -> None:
    rng = random.Random(seed)
    models = ("A100-80GB", "T4")
    free = {m: {n: rng.randint(0, 8) for n in range(rng.randint(1, 12))} for m in models}
    fm = FreeMap(free)
    copy_at = rng.randrange(200)
    for step in range(200):
        model = rng.choice(models)
        nodes = rng.sample(sorted(free[model]), rng.randint(1, min(2, len(free[model]))))
        most = min(free[model][n] for n in nodes)
        if most and rng.random() < 0.6:
            count = rng.randint(1, most)
            fm.take(model, nodes, count)
            count = -count
        else:
            count = rng.randint(1, 8)
            fm.give(model, nodes, count)
        for n in nodes:
            free[model][n] += count
        if step == copy_at:
            fm = fm.copy()  # a copy goes on from where the map was
        for m in models:
            assert fm.largest(m) == max(free[m].values())
            assert fm.total(m) == sum(free[m].values())
    assert fm.largest("H100") == 0
