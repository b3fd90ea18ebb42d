"""The forward simulation's view of the waiting requests it has not started yet (`_Rest`),
which deals the queue into its classes only as far as a pass reads: on random queues and
free maps (seeded), pass after pass, each read to a random depth and some of what it read
started, it reads exactly what a plain filter of the whole queue reads. And where a pass
leaves part of a class unread (what could not start before a reservation), every estimate
is as it is when the pass reads it all."""

from __future__ import annotations

import itertools
import random

import pytest

from gpulease.scheduler.model import ClusterState, Config, Decisions, Request, Running, RunningSet
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import _Reads, _Rest, schedule

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


def busy(rng: random.Random) -> ClusterState:
    """A cluster of 8-GPU nodes, most of them held by instances with known ends (some with
    none), and a queue of hundreds of requests of 1-8 GPUs, some gangs, some limited to a
    few nodes, some with no known duration."""
    nodes = rng.randint(10, 80)
    free = dict.fromkeys(range(nodes), 8)
    running = RunningSet()
    for n in range(nodes):
        while free[n] and rng.random() < 0.85:
            count = rng.randint(1, free[n])
            free[n] -= count
            end = rng.choice((None, rng.uniform(60, 86400), rng.uniform(60, 86400)))
            running.add(
                Running(len(running) + 10**6, f"u{rng.randrange(9)}", "A", count, (n,), 0.0, end)
            )
    queue = [
        Request(
            i,
            f"u{rng.randrange(9)}",
            "A",
            rng.choice((1, 1, 1, 2, 4, 8)),
            2 if rng.random() < 0.03 else 1,
            float(i),
            duration=rng.choice((None, rng.uniform(60, 86400), rng.uniform(60, 86400))),
            allowed=frozenset(rng.sample(range(nodes), 3)) if rng.random() < 0.05 else None,
        )
        for i in range(rng.randint(200, 1500))
    ]
    usage = {f"u{k}": rng.uniform(0, 1e6) for k in range(9)}
    return ClusterState(FreeMap({"A": free}), running, queue, usage, list(range(nodes)))


def answers(d: Decisions) -> tuple[object, ...]:
    waiting = {i: (w.position, w.reason, w.eta) for i, w in d.waiting.items()}
    return d.starts, d.preempt, waiting


def test_leaving_part_of_a_class_unread_changes_no_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = 0
    read = _Reads.__next__

    def counted(self: _Reads) -> Request:
        nonlocal reads
        reads += 1
        return read(self)

    monkeypatch.setattr(_Reads, "__next__", counted)
    cut, whole = 0, 0
    for seed in range(16):
        rng = random.Random(seed)
        s = busy(rng)
        config = Config(rng.choice(("backfill", "default")), eta_events=rng.choice((500, 60)))
        reads = 0
        got = answers(schedule(s, 0.0, config))
        cut += reads
        with monkeypatch.context() as m:
            m.setattr(_Reads, "pass_over", lambda self, *args: None)  # read every request
            reads = 0
            assert got == answers(schedule(s, 0.0, config)), seed
            whole += reads
    assert cut < whole / 2
