"""The scheduler reconciler applies exactly what schedule() decides for the state it reads,
and a waiting instance's status message carries the policy's reason and estimate."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from factories import Caller
from gpulease.scheduler.policy import schedule
from gpulease.server import db
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, Instance, Run, UsageSegment
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
        state, _, _ = scheduler.cluster_state(session, queue, now)
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
        state, _, _ = scheduler.cluster_state(session, queued, utcnow())
        decided = schedule(state, utcnow().timestamp(), scheduler.server_config(session))
    # the places the reconciler's own decisions give
    assert {i: decided.waiting[i].position for i in places} == places


def add_run(
    rt: Runtime, instance_id: int, task: str | None, minutes: float | None, status: str
) -> None:
    """A run of `task` on the instance: finished after `minutes` (None: not yet)."""
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None
        start = utcnow() - timedelta(hours=2)
        session.add(
            Run(
                instance_id=instance_id,
                owner_id=row.owner_id,
                command="python cats.py",
                task_name=task,
                status=status,
                exit_code=0 if status == "succeeded" else None,
                created_at=start,
                started_at=start if minutes is not None else None,
                finished_at=start + timedelta(minutes=minutes) if minutes is not None else None,
            )
        )


def test_estimates_use_declared_and_learned_durations(
    ann: Caller, bob: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    # ann's earlier runs of task "cats" took 10, 20 and 50 minutes (median 20); a failed
    # one and bob's runs of a task of the same name do not count
    past = create(ann, "T4:1")
    for minutes in (10, 20, 50):
        add_run(rt, past, "cats", minutes, "succeeded")
    add_run(rt, past, "cats", 500, "failed")
    add_run(rt, create(bob, "T4:1"), "cats", 300, "succeeded")
    first = create(ann, "A100-80GB:2")
    add_run(rt, first, "cats", None, "pending")
    tick()  # first holds both A100s
    again = create(ann, "A100-80GB:2")
    add_run(rt, again, "cats", None, "pending")
    other = create(ann, "A100-80GB:2")
    with transaction(rt.sessions) as session:
        rows = list(session.scalars(select(Instance).where(Instance.id.in_([first, again, other]))))
        known = queue.durations(session, rows)
    assert known[again].seconds == 20 * 60 and not known[again].declared
    assert known[again].basis == "learned from your last 3 runs of cats (median 20 min)"
    assert other not in known  # no task, no declared duration: unknown
    # a declared maximum runtime beats what was learned
    r = ann.put(f"/api/v1/instances/{first}/autostop", json={"max_runtime_minutes": 45})
    assert r.status_code == 200, r.text
    tick()
    shown = ann.get(f"/api/v1/instances/{again}").json()
    assert shown["queue_position"] == 1
    # first gives its GPUs back 45 min after it started; again is next
    assert "expected to start in about 45 min" in shown["status_message"], shown
    assert shown["queue_reason"].startswith("needs 2 × A100-80GB on one node")
    eta = datetime.fromisoformat(shown["queue_eta"])
    assert abs((eta - utcnow()).total_seconds() - 45 * 60) < 120
    assert shown["queue_eta_basis"] == (
        "expected ends of 1 of the 1 instance holding A100-80GB (1 declared)"
    )
    assert shown["duration_basis"] == "learned from your last 3 runs of cats (median 20 min)"
    # behind it: 45 min plus the 20 min `again` is expected to take
    behind = ann.get(f"/api/v1/instances/{other}").json()
    assert "expected to start in about 65 min" in behind["status_message"]
    assert behind["duration_basis"] == "no duration known"
    assert behind["queue_eta_basis"].endswith("durations of 1 of the 1 request ahead (1 learned)")
    assert ann.get(f"/api/v1/instances/{first}").json()["duration_basis"] == "declared 45 min"
    # running, it has no queue fields
    assert ann.get(f"/api/v1/instances/{first}").json()["queue_reason"] is None
    # bob sees none of ann's instances, nor their reasons
    assert bob.get(f"/api/v1/instances/{again}").status_code == 404


def test_an_instance_released_while_the_tick_places_it_is_left_released(
    ann: Caller, rt: Runtime, tick: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's release commits between the tick's read of the queue and its start of the
    instance: the tick leaves it released, with no GPU held, and goes on without an error."""
    if rt.engine.dialect.name == "sqlite":
        pytest.skip("two writers at once need PostgreSQL (SQLite takes one at a time)")
    instance_id = create(ann)
    balance = scheduler.ledger.balance

    def released_meanwhile(session: Session, owner_id: int, team_id: int | None) -> int:
        with transaction(rt.sessions) as other:
            other.execute(
                update(Instance).where(Instance.id == instance_id).values(status="released")
            )
        return balance(session, owner_id, team_id)

    monkeypatch.setattr(scheduler.ledger, "balance", released_meanwhile)
    assert scheduler.tick(rt) == 0
    monkeypatch.undo()
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None and row.status == "released"
        assert session.scalar(select(Gpu.id).where(Gpu.instance_id == instance_id)) is None
    tick()  # and the next tick is an ordinary one


def test_the_queue_is_read_a_slice_of_instances_at_a_time(
    ann: Caller, bob: Caller, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A queue can outgrow PostgreSQL's 65,535 parameters a statement: its instances are
    # read a slice at a time (here 2), and none is left out of the scheduler's view.
    monkeypatch.setattr(db, "IN_BATCH", 2)
    ids = [create(ann), create(bob, "A100-80GB:2"), create(ann, "T4:1"), create(bob), create(ann)]
    with transaction(rt.sessions) as session:
        waiting, refused = templates.restrict_queue(session, current_queue(session))
        state, _, _ = scheduler.cluster_state(session, waiting, utcnow())
        places = queue.queue_positions(session, waiting)
    assert refused == {}
    assert sorted(r.instance_id for r in waiting) == sorted(ids)
    assert sorted(r.id for r in state.queue) == sorted(ids)
    assert sorted(places) == sorted(ids)
