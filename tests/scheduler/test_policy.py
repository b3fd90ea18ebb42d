"""The scheduling policies on small hand-made clusters (pure: no DB, no clock)."""

from __future__ import annotations

import random

import pytest

from gpulease.scheduler.model import (
    DAILY,
    SPOT,
    ClusterState,
    Config,
    Request,
    Running,
    RunningSet,
)
from gpulease.scheduler.placement import FreeMap
from gpulease.scheduler.policy import POLICIES, schedule

A = "A100-80GB"


def state(
    free: dict[int, int],
    queue: list[Request],
    running: list[Running] = (),  # type: ignore[assignment]
    usage: dict[str, float] | None = None,
) -> ClusterState:
    return ClusterState(FreeMap({A: free}), RunningSet(running), queue, usage or {}, list(free))


def req(i: int, owner: str = "ann", count: int = 1, **kw: object) -> Request:
    kw.setdefault("arrival", float(i))
    return Request(i, owner, A, count, **kw)  # type: ignore[arg-type]


def test_best_fit_keeps_a_block_of_four() -> None:
    s = state({1: 4, 2: 1, 3: 2}, [req(1), req(2, count=2), req(3, count=4)])
    starts = {st.request_id: st.node_ids for st in schedule(s, 0, Config("fifo")).starts}
    assert starts == {1: (2,), 2: (3,), 3: (1,)}


def test_a_multi_gpu_request_needs_one_node_and_says_why_it_waits() -> None:
    s = state({1: 2, 2: 2}, [req(1, count=4), req(2), req(3), req(4)])
    d = schedule(s, 0, Config("fifo"))
    assert d.starts == []
    w = d.waiting[1]
    assert w.position == 1
    assert "needs 4 × A100-80GB on one node; the largest free block is 2" in w.reason
    assert "3 requests ahead of you" in d.waiting[4].reason


def test_a_waiting_requests_words_end_with_how_many_are_ahead_of_it() -> None:
    s = state({1: 2, 2: 2}, [req(1, count=4), req(2, count=4), req(3, count=4)])
    d = schedule(s, 0, Config("fifo"))
    needs = "needs 4 × A100-80GB on one node; the largest free block is 2"
    assert [d.waiting[i].reason for i in (1, 2, 3)] == [
        needs,
        f"{needs}; 1 request ahead of you",
        f"{needs}; 2 requests ahead of you",
    ]
    assert d.waiting[2].cause == needs and d.waiting[2].position == 2


def test_gang_is_all_or_nothing() -> None:
    s = state({1: 8, 2: 4, 3: 8}, [req(1, count=8, nodes=3)])
    d = schedule(s, 0, Config("default"))
    assert d.starts == [] and "needs 3 nodes with 8 × A100-80GB" in d.waiting[1].reason
    s = state({1: 8, 2: 8, 3: 8}, [req(1, count=8, nodes=3)])
    assert schedule(s, 0, Config("default")).starts[0].node_ids == (1, 2, 3)


def test_spot_never_preempts_on_demand_or_daily_and_youngest_spot_goes_first() -> None:
    running = [
        Running(10, "bob", A, 4, (1,), start=0, plan="on_demand"),
        Running(11, "bob", A, 2, (2,), start=0, plan=DAILY),
        Running(12, "cy", A, 2, (2,), start=5, plan=SPOT),
        Running(13, "cy", A, 2, (2,), start=9, plan=SPOT),
    ]
    s = state({1: 0, 2: 2}, [req(1, count=4)], running)
    d = schedule(s, 10, Config("default"))
    assert d.preempt == [13]  # the youngest spot instance frees what the request needs
    assert [st.node_ids for st in d.starts] == [(2,)]
    # a spot request never preempts anything; nothing preempts on demand or daily
    s = state({1: 0, 2: 0}, [req(2, count=4, plan=SPOT), req(3, count=4)], running[:2])
    d = schedule(s, 10, Config("default"))
    assert d.preempt == [] and d.starts == []
    assert (
        schedule(
            state({1: 0, 2: 2}, [req(1, count=4)], running),
            10,
            Config("default", spot_preemption=False),
        ).preempt
        == []
    )


def test_gpus_already_coming_back_are_used_before_preempting_more() -> None:
    running = [
        Running(12, "cy", A, 2, (2,), start=5, plan=SPOT),
        Running(13, "cy", A, 2, (2,), start=9, plan=SPOT, stopping=True),
    ]
    s = state({1: 0, 2: 0}, [req(1, count=2)], running)
    d = schedule(s, 10, Config("default"))
    # the stopping (already preempted) one makes room: nothing more is preempted
    assert d.preempt == [] and d.reclaiming == {1: [13]}
    assert [st.request_id for st in d.starts] == [1]
    # a second request needs more: the remaining spot instance goes, the stopping one is
    # not chosen again
    s = state({1: 0, 2: 0}, [req(1, count=2), req(2, count=2)], running)
    d = schedule(s, 10, Config("default"))
    assert d.preempt == [12] and d.reclaiming == {1: [13], 2: [12]}
    # a stopping on-demand instance's GPUs count too, but it is never "preempted"
    od = [Running(14, "bob", A, 4, (1,), start=0, stopping=True)]
    d = schedule(state({1: 0}, [req(1, count=4)], od), 10, Config("default"))
    assert d.preempt == [] and d.reclaiming == {1: [14]}


def test_quotas_cap_concurrency() -> None:
    running = [Running(10, "ann", A, 6, (1,), start=0)]
    s = state(
        {1: 2, 2: 8}, [req(1, count=4), req(2, count=2), req(3, "bob", count=4, team="t")], running
    )
    config = Config("default", default_user_quota=8, team_quota={"t": 2})
    d = schedule(s, 0, config)
    assert [st.request_id for st in d.starts] == [2]
    assert (
        "over the per-user quota: ann holds 6 of at most 8 GPUs and this needs 4"
        in d.waiting[1].reason
    )
    assert "over team t's quota" in d.waiting[3].reason


def test_fair_share_lets_a_light_user_pass_a_heavy_one() -> None:
    queue = [req(1, "heavy", count=8), req(2, "light", count=8)]
    s = state({1: 8}, queue, usage={"heavy": 1e6, "light": 10.0})
    assert [st.request_id for st in schedule(s, 0, Config("default")).starts] == [2]
    assert [st.request_id for st in schedule(s, 0, Config("fifo")).starts] == [1]


def test_priority_class_before_fair_share() -> None:
    queue = [
        req(1, "light", count=8, plan=SPOT),
        req(2, "heavy", count=8),
        req(3, "x", count=8, priority=5, plan=SPOT),
    ]
    s = state({1: 8}, queue, usage={"heavy": 1e6})
    assert [st.request_id for st in schedule(s, 0, Config("default")).starts] == [2]


def test_backfill_lets_a_short_job_pass_but_not_a_long_one() -> None:
    running = [Running(10, "bob", A, 4, (1,), start=0, expected_end=100)]
    queue = [req(1, count=8), req(2, count=2, duration=50), req(3, count=2, duration=500)]
    s = state({1: 4}, queue, running)
    d = schedule(s, 0, Config("backfill"))
    assert [st.request_id for st in d.starts] == [2]
    assert d.waiting[1].eta == 100
    assert "would delay the reserved start" in d.waiting[3].reason
    assert [st.request_id for st in schedule(s, 0, Config("fifo")).starts] == []


@pytest.mark.parametrize("policy", ["backfill", "default"])
def test_behind_a_reservation_a_short_job_starts_after_many_long_ones_of_its_shape(
    policy: str,
) -> None:
    # Once a request of a shape finds no room within the reservation, a pass passes over
    # the later ones of that shape, but not one that ends before the reservation, and one
    # over its quota still says so.
    running = [Running(10, "bob", A, 4, (1,), start=0, expected_end=100)]
    long = [req(i, count=2, duration=500) for i in range(2, 40)]
    over = req(40, "max", count=2, duration=500)
    queue = [req(1, count=8), *long, over, req(41, count=2, duration=50)]
    s = state({1: 4}, queue, running)
    d = schedule(s, 0, Config(policy, user_quota={"max": 1}))
    assert [st.request_id for st in d.starts] == [41]
    for r in long:
        assert "would delay the reserved start" in d.waiting[r.id].reason
    assert "over the per-user quota" in d.waiting[40].reason


def _reserved_start(s: ClusterState, now: float, config: Config) -> float | None:
    d = schedule(s, now, config)
    heads = [w for w in d.waiting.values() if w.position == 1]
    return heads[0].eta if heads else None


@pytest.mark.parametrize("seed", range(30))
def test_backfill_never_delays_the_reserved_start_of_the_request_ahead(seed: int) -> None:
    rng = random.Random(seed)
    nodes = dict.fromkeys(range(4), 8)
    running: list[Running] = []
    rid = 100
    for n in nodes:
        while nodes[n] and rng.random() < 0.8:
            c = rng.randint(1, nodes[n])
            nodes[n] -= c
            running.append(Running(rid, "r", A, c, (n,), 0, expected_end=rng.randint(10, 400)))
            rid += 1
    queue = [req(1, count=8, duration=rng.randint(10, 400))] + [
        req(i, rng.choice("abc"), count=rng.randint(1, 4), duration=rng.randint(10, 400))
        for i in range(2, 12)
    ]
    config = Config("backfill")
    s = state(nodes, queue, running)
    d = schedule(s, 0, config)
    before = d.waiting[1].eta if 1 in d.waiting else 0
    assert before is not None
    # the backfilled requests, now running, must leave the head's reserved start as it was
    free = s.free.copy()
    more = list(running)
    for st in d.starts:
        r = next(q for q in queue if q.id == st.request_id)
        free.take(A, st.node_ids, r.count)
        more.append(Running(r.id, r.owner, A, r.count, st.node_ids, 0, expected_end=r.duration))
    left = [q for q in queue if q.id in d.waiting]
    after = _reserved_start(ClusterState(free, RunningSet(more), left, {}, list(nodes)), 0, config)
    if 1 in d.waiting:
        assert after is not None and after <= before


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_places_within_the_free_gpus(policy: str) -> None:
    rng = random.Random(7)
    queue = [
        req(i, rng.choice("abc"), count=rng.choice((1, 2, 4, 8)), duration=100.0) for i in range(40)
    ]
    s = state(dict.fromkeys(range(6), 8), queue)
    d = schedule(s, 0, Config(policy))
    used: dict[int, int] = {}
    for st in d.starts:
        r = queue[st.request_id]
        for n in st.node_ids:
            used[n] = used.get(n, 0) + r.count
    assert all(v <= 8 for v in used.values()) and sum(used.values()) == 48
    assert set(d.waiting) | {st.request_id for st in d.starts} == set(range(40))


def test_las_preempts_a_job_that_has_run_long_for_a_new_one() -> None:
    running = [Running(10, "bob", A, 8, (1,), start=0)]
    s = state({1: 0}, [req(1, count=8, arrival=7200.0)], running)
    d = schedule(s, 7200, Config("las"))
    assert d.preempt == [10] and d.starts[0].request_id == 1
    assert schedule(s, 7200, Config("default")).preempt == []


def test_srtf_preempts_the_longer_remaining_job() -> None:
    running = [Running(10, "bob", A, 8, (1,), start=0, duration=1000)]
    s = state({1: 0}, [req(1, count=8, duration=50)], running)
    assert schedule(s, 100, Config("srtf")).preempt == [10]
    s = state({1: 0}, [req(1, count=8, duration=950)], running)
    assert schedule(s, 100, Config("srtf")).preempt == []


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown policy 'lottery'"):
        schedule(state({1: 8}, []), 0, Config("lottery"))


def test_gpus_come_back_on_a_model_with_none_free_now() -> None:
    """An instance holding every T4 ends in the forward simulation: its GPUs rejoin the map,
    and the T4 request waiting for them gets an ETA at that end."""
    t4 = "T4"
    free = FreeMap({A: {1: 1}})
    holder = Running(9, "bob", t4, 1, (2,), start=0.0, expected_end=100.0)
    waiting = Request(1, "ann", t4, 1, arrival=1.0)
    s = ClusterState(free, RunningSet([holder]), [waiting], {}, [1, 2])
    decisions = schedule(s, 10.0, Config("default"))
    assert not decisions.starts
    free.give(t4, (2,), 1)
    assert free.total(t4) == 1 and free.largest(t4) == 1


def test_an_instance_past_its_expected_end_is_expected_to_run_as_long_again() -> None:
    # started at 0, expected to end at 100, still running at 1,000: not "any moment now"
    overdue = Running(10, "bob", A, 8, (1,), start=0, expected_end=100)
    d = schedule(state({1: 0}, [req(1, count=8)], [overdue]), 1000, Config("default"))
    assert d.starts == [] and d.waiting[1].eta == 2000
    # one already stopping gives its GPUs back as said, however late that is
    stopping = Running(10, "bob", A, 8, (1,), start=0, expected_end=100, stopping=True)
    d = schedule(state({1: 0}, [req(1, count=8)], [stopping]), 1000, Config("backfill"))
    assert d.waiting[1].eta == 1000
    # and one within its expected end keeps it
    on_time = Running(10, "bob", A, 8, (1,), start=0, expected_end=1500)
    d = schedule(state({1: 0}, [req(1, count=8)], [on_time]), 1000, Config("default"))
    assert d.waiting[1].eta == 1500
