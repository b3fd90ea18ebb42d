"""How long a runner may be silent or ignore a stop is measured to the time the reconciler
is given, so these run on a fixed clock instead of sleeping or zeroing the grace."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from factories import Caller, RunnerDouble
from gpulease.backends.fake import FakeBackend
from gpulease.server.db import transaction
from gpulease.server.orm import Instance
from gpulease.server.reconcilers import health, launcher
from gpulease.server.runtime import Runtime

SECOND = timedelta(seconds=1)


def _running(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> int:
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    assert r.status_code == 201, r.text
    instance_id = int(r.json()["id"])
    tick()
    runner_for(instance_id).ready()
    return instance_id


def _row(rt: Runtime, instance_id: int) -> tuple[str, datetime | None, datetime | None]:
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        return instance.status, instance.stop_requested_at, instance.last_heartbeat_at


def test_a_runner_that_ignores_a_stop_is_killed_once_the_grace_has_passed(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id = _running(ann, tick, runner_for)
    backend.stop_kills = False
    assert ann.post(f"/api/v1/instances/{instance_id}/stop").status_code == 200
    status, requested, _ = _row(rt, instance_id)
    assert status == "stopping" and requested is not None
    grace = timedelta(seconds=rt.settings.stop_grace_s)

    launcher.finish_stops(rt, now=requested + grace)
    assert _row(rt, instance_id)[0] == "stopping"
    launcher.finish_stops(rt, now=requested + grace + SECOND)
    assert _row(rt, instance_id)[0] == "stopped"
    handle = backend.handle_for(instance_id)
    assert handle and backend.runners[handle].stop_calls[-1] is True


def test_a_silent_runner_is_killed_after_four_heartbeat_timeouts(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id = _running(ann, tick, runner_for)
    status, _, last_seen = _row(rt, instance_id)
    assert status == "running" and last_seen is not None
    limit = 4 * timedelta(seconds=rt.settings.heartbeat_timeout_s)

    assert health.tick(rt, now=last_seen + limit) == []
    assert health.tick(rt, now=last_seen + limit + SECOND) == [instance_id]
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "failed"
    silent = int((limit + SECOND).total_seconds())
    assert f"stopped responding for {silent} s" in got["status_reason"]
