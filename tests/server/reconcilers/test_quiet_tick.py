"""The reconcilers run every second: on a server with nothing for them to do, the steps that
only look (scheduled starts and stops, the scheduler's pass, launcher, health, idle stop,
sweeps, notification sender, daily blocks, budgets, stopped-instance release, GPU sampling)
open no write transaction, which on SQLite would hold every API write back while they read.
Each reads first, without the write lock, and writes only when it has work."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import event

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.backends.fake import FakeBackend
from gpulease.server.db import READ_ONLY, transaction, utcnow
from gpulease.server.orm import Instance, InstanceSchedule
from gpulease.server.reconcilers import (
    billing,
    health,
    idle,
    launcher,
    meter,
    notify,
    scheduler,
    sweeps,
)
from gpulease.server.reconcilers import schedules as schedule_fires
from gpulease.server.reconcilers.gpu_samples import sample_gpus
from gpulease.server.runtime import Runtime

LOOKING = (
    schedule_fires.tick,
    scheduler.tick,
    launcher.tick,
    health.tick,
    idle.tick,
    sweeps.tick,
    notify.tick,
    billing.daily_blocks,
    billing.budgets,
    billing.release_stopped,
    sample_gpus,  # this host's GPUs are simulated: nothing to sample
)


@pytest.fixture
def writes(rt: Runtime) -> Iterator[list[str]]:
    """The write transactions begun on rt's engine (a read-only one is a deferred BEGIN on
    SQLite, autocommit statements on PostgreSQL), each as the statement that followed."""
    begun: list[str] = []
    pending: set[int] = set()

    def began(conn):  # type: ignore[no-untyped-def]
        options = conn.get_execution_options()
        if not options.get(READ_ONLY) and options.get("isolation_level") != "AUTOCOMMIT":
            pending.add(id(conn))

    def executed(conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
        if id(conn) in pending and not statement.startswith("BEGIN"):
            pending.discard(id(conn))
            begun.append(statement.split("\n")[0])

    event.listen(rt.engine, "begin", began)
    event.listen(rt.engine, "before_cursor_execute", executed)
    yield begun
    event.remove(rt.engine, "begin", began)
    event.remove(rt.engine, "before_cursor_execute", executed)


def stopped_instance(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> int:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    assert ann.post(f"/api/v1/instances/{instance_id}/stop").status_code == 200
    runner.stopped()
    tick()
    return instance_id


def test_a_quiet_tick_only_reads_and_writes_once_there_is_work(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    writes: list[str],
) -> None:
    meter.tick(rt)  # nothing runs yet: the meter only looks
    assert writes == []
    # a running instance whose runner heartbeats, with an idle stop after an hour and a
    # stop scheduled for later, two stopped long before their release
    running, _ = make_running_instance(ann, tick, runner_for)
    writes.clear()
    meter.tick(rt)
    assert writes  # now it has a segment to charge
    autostop = ann.put(f"/api/v1/instances/{running}/autostop", json={"idle_minutes": 60})
    assert autostop.status_code == 200, autostop.text
    scheduled = ann.post(
        f"/api/v1/instances/{running}/schedules", json={"action": "stop", "cron": "0 3 * * *"}
    )
    assert scheduled.status_code == 201, scheduled.text
    released, aged = (stopped_instance(ann, tick, runner_for) for _ in range(2))
    with transaction(rt.sessions) as session:
        statuses = {i.id: i.status for i in session.query(Instance)}
    assert statuses == {running: "running", released: "stopped", aged: "stopped"}
    writes.clear()

    for step in LOOKING:
        step(rt)
    assert writes == []

    # work: the owner releases one; the other has been stopped for longer than it is kept;
    # the running one's scheduled stop is due
    assert ann.post(f"/api/v1/instances/{released}/release").status_code == 200
    keep = timedelta(days=rt.settings.stopped_release_days)
    with transaction(rt.sessions) as session:
        for schedule in session.query(InstanceSchedule):
            schedule.next_fire_at = utcnow() - timedelta(minutes=1)
        instance = session.get(Instance, aged)
        assert instance is not None and instance.stopped_at is not None
        instance.stopped_at -= keep + timedelta(minutes=1)
    writes.clear()
    for step in LOOKING:
        step(rt)
    assert writes
    with transaction(rt.sessions) as session:
        statuses = {i.id: i.status for i in session.query(Instance)}
    assert statuses == {running: "stopping", released: "released", aged: "released"}


def test_a_quiet_launcher_tick_is_one_query_and_a_stop_still_leads_to_its_release(
    ann: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    statements: list[str] = []

    def executed(_conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
        if statement.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK"):
            statements.append(statement)

    running, _ = make_running_instance(ann, tick, runner_for)
    event.listen(rt.engine, "before_cursor_execute", executed)
    try:
        launcher.tick(rt)
        assert len(statements) == 1, statements  # a running instance: nothing to launch
        # released while it stops: one tick finishes the stop, then the release it waited for
        assert ann.post(f"/api/v1/instances/{running}/release").status_code == 200
        with transaction(rt.sessions) as session:
            instance = session.get(Instance, running)
            assert instance is not None and instance.status == "stopping"
            handle = instance.runner_handle
        assert isinstance(rt.backend, FakeBackend) and handle is not None
        rt.backend.set_alive(handle, False)  # its runner exits without a word
        launcher.tick(rt)
    finally:
        event.remove(rt.engine, "before_cursor_execute", executed)
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, running)
        assert instance is not None and instance.status == "released"
