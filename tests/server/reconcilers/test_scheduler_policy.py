"""The scheduler reconciler applies exactly what schedule() decides for the state it reads,
and a waiting instance's status message carries the policy's reason and estimate."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from factories import Caller
from gpulease.scheduler.policy import schedule
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Instance, Run, UsageSegment
from gpulease.server.reconcilers import scheduler
from gpulease.server.runtime import Runtime
from gpulease.server.services import templates
from gpulease.server.services.instances import queue
from gpulease.server.services.instances.lifecycle import current_queue


def create(caller: Caller, gpu: str = "A100-80GB:1") -> int:
    r = caller.post("/api/v1/instances", json={"gpu": gpu})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_the_reconciler_applies_the_policys_decisions(
    ann: Caller, bob: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    ids = [create(ann), create(bob, "A100-80GB:2"), create(ann), create(bob, "T4:1")]
    with transaction(rt.sessions) as session:
        queue, _ = templates.restrict_queue(session, current_queue(session))
        now = utcnow()
        state, _ = scheduler.cluster_state(session, queue, now)
        expected = schedule(state, now.timestamp(), scheduler.SERVER_POLICY)
    tick()
    started = {s.request_id for s in expected.starts}
    assert started and expected.waiting  # the fixture's cluster cannot take all four
    for i in ids:
        shown = (
            ann.get(f"/api/v1/instances/{i}")
            if i in (ids[0], ids[2])
            else bob.get(f"/api/v1/instances/{i}")
        )
        body = shown.json()
        if i in started:
            assert body["status"] == "starting", body
        else:
            assert body["status"] == "queued", body
            assert body["status_message"].startswith(expected.waiting[i].reason)
            assert "no start time can be estimated yet" in body["status_message"]


def test_queue_places_follow_the_policy_not_arrival(
    ann: Caller, bob: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    hold = create(bob, "A100-80GB:2")
    tick()  # bob holds both A100s
    early = create(bob)
    r = bob.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "plan": "spot"})
    assert r.status_code == 201, r.text
    spot = int(r.json()["id"])
    heavy = create(bob)
    light = create(ann)
    with transaction(rt.sessions) as session:  # bob used two GPUs for the last hour
        row = session.get(Instance, hold)
        assert row is not None
        session.add(
            UsageSegment(
                instance_id=hold,
                owner_id=row.owner_id,
                gpu_model="A100-80GB",
                gpu_count=2,
                hourly_micro=1,
                started_at=utcnow() - timedelta(hours=1),
                ended_at=utcnow(),
            )
        )
    places = {
        i: caller.get(f"/api/v1/instances/{i}").json()["queue_position"]
        for i, caller in ((early, bob), (spot, bob), (heavy, bob), (light, ann))
    }
    # on demand before spot; the light user passes the heavy one; then arrival (FIFO would
    # give early 1, spot 2, heavy 3, light 4)
    assert places == {light: 1, early: 2, heavy: 3, spot: 4}
    with transaction(rt.sessions) as session:
        queued, _ = templates.restrict_queue(session, current_queue(session))
        state, _ = scheduler.cluster_state(session, queued, utcnow())
        decided = schedule(state, utcnow().timestamp(), scheduler.server_config(session))
    # the places the reconciler's own decisions give
    assert {i: decided.waiting[i].position for i in places} == places


def test_estimates_use_declared_and_learned_durations(
    ann: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    # a run of task "cats" that took 20 minutes, on an instance `gpulease run` named
    first = int(
        ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2", "name": "cats-1a2b"}).json()["id"]
    )
    with transaction(rt.sessions) as session:
        row = session.get(Instance, first)
        assert row is not None
        start = utcnow() - timedelta(hours=2)
        session.add(
            Run(
                instance_id=first,
                owner_id=row.owner_id,
                command="python cats.py",
                status="succeeded",
                exit_code=0,
                created_at=start,
                started_at=start,
                finished_at=start + timedelta(minutes=20),
            )
        )
    tick()  # cats-1a2b holds both A100s
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2", "name": "cats-3c4d"})
    again = int(r.json()["id"])
    other = create(ann, "A100-80GB:2")
    with transaction(rt.sessions) as session:
        rows = list(session.scalars(select(Instance).where(Instance.id.in_([first, again, other]))))
        known = queue.durations(session, rows)
    assert known[again].seconds == 20 * 60 and "learned from 1 earlier run of task cats" in (
        known[again].basis
    )
    assert other not in known  # no task name, no declared runtime: unknown
    # a declared maximum runtime beats what was learned
    r = ann.put(f"/api/v1/instances/{first}/autostop", json={"max_runtime_minutes": 45})
    assert r.status_code == 200, r.text
    tick()
    shown = ann.get(f"/api/v1/instances/{again}").json()
    assert shown["queue_position"] == 1
    # cats-1a2b gives its GPUs back 45 min after it started; cats-3c4d is next
    assert "expected to start in about 45 min" in shown["status_message"], shown
    assert "declared or learned durations of 1 of the 1 instances" in shown["status_message"]
    # behind it: 45 min plus the 20 min cats-3c4d is expected to take
    assert (
        "expected to start in about 65 min"
        in ann.get(f"/api/v1/instances/{other}").json()["status_message"]
    )
