"""The policies on many random clusters (seeded): properties every tick must keep, however
the policy's order, placement and forward simulation are computed."""

from __future__ import annotations

import math
import random

import pytest

from gpulease.scheduler.model import (
    DAILY,
    ON_DEMAND,
    PLAN_RANK,
    SPOT,
    ClusterState,
    Config,
    Decisions,
    Request,
    Running,
    RunningSet,
    Waiting,
)
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import POLICIES, policy_order, schedule

MODELS = ("A100-80GB", "H100", "T4")


def cluster(rng: random.Random) -> tuple[ClusterState, float]:
    """A random cluster: 1-3 GPU models, busy nodes, running instances with known, unknown
    and overdue ends (some spot, some stopping), and a queue with ties in arrival and fair
    share, gangs, CPU-only requests, node limits and homes."""
    n_nodes = rng.randint(1, 24)
    per_node = rng.choice((2, 4, 8))
    models = MODELS[: rng.randint(1, 3)]
    model_of = {n: rng.choice(models) for n in range(n_nodes)}
    free = dict.fromkeys(range(n_nodes), per_node)
    now = float(rng.choice((0, 3600, rng.randint(0, 10_000))))
    running = RunningSet()
    rid = 1000
    for n in range(n_nodes):
        while free[n] and rng.random() < 0.7:
            c = rng.randint(1, free[n])
            free[n] -= c
            start = float(rng.randint(0, int(now)))
            end = rng.choice((None, now + rng.choice((600, 1800, 3600)), rng.uniform(start, now)))
            running.add(
                Running(
                    rid,
                    f"u{rng.randrange(5)}",
                    model_of[n],
                    c,
                    (n,),
                    start,
                    end,
                    plan=rng.choice((ON_DEMAND, DAILY, SPOT)),
                    team=rng.choice((None, "t1")),
                    stopping=rng.random() < 0.05,
                )
            )
            rid += 1
    queue = [
        Request(
            i,
            f"u{rng.randrange(5)}",
            rng.choice(models),
            rng.choice((0, 1, 1, 2, per_node)),
            1 if rng.random() < 0.85 else 2,
            float(rng.randint(0, 20)),  # many ties in arrival
            plan=rng.choice((ON_DEMAND, DAILY, SPOT)),
            team=rng.choice((None, "t1")),
            priority=rng.choice((0, 0, 1)),
            duration=rng.choice((None, 600.0, 1800.0, rng.uniform(60, 9000))),
            attained=rng.choice((0.0, rng.uniform(0, 4e5))),
            allowed=None if rng.random() < 0.85 else frozenset(rng.sample(range(n_nodes), 1)),
            home=None if rng.random() < 0.8 else rng.randrange(n_nodes),
        )
        for i in rng.sample(range(200), rng.randint(0, 80))  # ids not in arrival order
    ]
    queue.sort(key=lambda r: r.arrival)
    usage = {f"u{k}": rng.choice((0.0, 5.0, rng.uniform(0, 1e6))) for k in range(5)}
    fm = FreeMap()
    for n, k in free.items():
        fm.add_node(model_of[n], n, k)
    return ClusterState(fm, running, queue, usage, list(range(n_nodes))), now


def config(rng: random.Random, policy: str) -> Config:
    quota = {"u0": rng.randint(0, 12)} if rng.random() < 0.3 else {}
    return Config(policy=policy, user_quota=quota, eta_events=rng.choice((500, 500, 7)))


def cases(n: int) -> list[tuple[int, str]]:
    return [(seed, policy) for seed in range(n) for policy in POLICIES]


@pytest.mark.parametrize(("seed", "policy"), cases(40))
def test_a_tick_keeps_its_promises(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    s, now = cluster(rng)
    cfg = config(rng, policy)
    d = schedule(s, now, cfg)
    by_id = {r.id: r for r in s.queue}
    # every request either starts or waits, with a reason, and an ETA not before now
    assert {st.request_id for st in d.starts}.isdisjoint(d.waiting)
    assert {st.request_id for st in d.starts} | set(d.waiting) == set(by_id)
    for w in d.waiting.values():
        assert w.reason and (w.eta is None or w.eta >= now)
    # places count 1, 2, ... per model in the policy's order
    order = [r for r in policy_order(s.queue, s.usage, cfg) if r.id in d.waiting]
    seen: dict[str, int] = {}
    for r in order:
        seen[r.model] = seen.get(r.model, 0) + 1
        assert d.waiting[r.id].position == seen[r.model]
    # starts fit in the GPUs free now plus those of what is preempted or already stopping
    free = s.free.copy()
    for rid in {v for victims in d.reclaiming.values() for v in victims}:
        r = s.running.by_id[rid]
        free.give(r.model, r.node_ids, r.count)
    for st in d.starts:
        r = by_id[st.request_id]
        assert len(set(st.node_ids)) == len(st.node_ids) == (r.nodes if r.count else 1)
        assert r.allowed is None or set(st.node_ids) <= r.allowed
        if r.count:
            free.take(r.model, st.node_ids, r.count)  # raises when they are not free
    assert set(d.preempt) <= {r.id for r in s.running if not r.stopping}


def decisions(d: Decisions) -> tuple[object, ...]:
    waiting = {k: (w.position, w.reason, w.eta) for k, w in d.waiting.items()}
    return d.starts, d.preempt, d.reclaiming, waiting


@pytest.mark.parametrize(("seed", "policy"), cases(25))
def test_explaining_some_or_none_changes_no_decision_and_no_estimate(
    seed: int, policy: str
) -> None:
    rng = random.Random(seed)
    s, now = cluster(rng)
    cfg = config(rng, policy)
    full = schedule(s, now, cfg)
    lean = schedule(s, now, cfg, explain=())
    assert (lean.starts, lean.preempt, lean.reclaiming) == (
        full.starts,
        full.preempt,
        full.reclaiming,
    )
    assert lean.waiting == {}
    some = {r.id for r in s.queue if rng.random() < 0.3}
    part = schedule(s, now, cfg, explain=some)
    assert part.starts == full.starts
    assert part.waiting == {k: w for k, w in full.waiting.items() if k in some}


@pytest.mark.parametrize(("seed", "policy"), cases(25))
def test_the_order_is_the_documented_key_whatever_the_queue_order(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    s, now = cluster(rng)
    cfg = config(rng, policy)
    order = policy_order(s.queue, s.usage, cfg)
    if policy == "default":
        share = s.usage
        key = sorted(
            s.queue,
            key=lambda r: (
                PLAN_RANK.get(r.plan, 1),
                -r.priority,
                share.get(r.owner, 0.0),
                r.arrival,
                r.id,
            ),
        )
        assert order == key
    if policy == "srtf":  # shortest remaining time first (unknown: last)

        def remaining(r: Request) -> float:
            if r.duration is None:
                return math.inf
            return max(0.0, r.duration - r.attained / max(1, r.count * r.nodes))

        assert order == sorted(s.queue, key=lambda r: (remaining(r), r.arrival, r.id))
    if policy in ("default", "las", "srtf"):  # (arrival, id) breaks every tie
        shuffled = list(s.queue)
        rng.shuffle(shuffled)
        again = ClusterState(s.free, s.running, shuffled, s.usage, s.node_ids)
        assert policy_order(shuffled, s.usage, cfg) == order
        assert decisions(schedule(again, now, cfg)) == decisions(schedule(s, now, cfg))


@pytest.mark.parametrize(("seed", "policy"), cases(25))
def test_answers_read_one_at_a_time_or_all_at_once_are_the_same(seed: int, policy: str) -> None:
    rng = random.Random(seed)
    s, now = cluster(rng)
    cfg = config(rng, policy)
    some = None if rng.random() < 0.5 else {r.id for r in s.queue if rng.random() < 0.5}
    waiting = schedule(s, now, cfg, explain=some).waiting
    one_by_one = {k: waiting[k] for k in waiting}  # before any is made all at once
    assert len(one_by_one) == len(waiting) and all(k in waiting for k in one_by_one)
    assert -1 not in waiting and waiting.get(-1) is None
    assert all(isinstance(w, Waiting) and w.request_id == k for k, w in one_by_one.items())
    assert list(waiting.items()) == list(one_by_one.items())  # all at once, in order
    assert {k: waiting[k] for k in waiting} == one_by_one  # once all are made (kept)
    assert list(waiting.values()) == list(one_by_one.values()) and waiting == one_by_one
