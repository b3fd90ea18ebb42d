"""Idle stop, maximum runtime and stop-after-run, driven with explicit times."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from factories import Caller, RunnerDouble, make_running_instance, make_settings
from gpulease.backends.fake import FakeBackend
from gpulease.server import db
from gpulease.server.app import create_app
from gpulease.server.db import transaction
from gpulease.server.orm import GpuSample, Instance, Notification, Run
from gpulease.server.reconcilers import idle
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.services.instances import activity

Tick = Callable[[], None]
RunnerFor = Callable[[int], RunnerDouble]


def started_at(rt: Runtime, instance_id: int) -> datetime:
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None and instance.started_at is not None
        return instance.started_at


def state(rt: Runtime, instance_id: int) -> tuple[str, str, str]:
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        return instance.status, instance.desired_state, instance.status_reason


def notes(rt: Runtime, kind: str) -> list[str]:
    with transaction(rt.sessions) as session:
        return list(session.scalars(select(Notification.message).where(Notification.kind == kind)))


def set_autostop(caller: Caller, ref: object, **body: object) -> dict[str, object]:
    r = caller.put(f"/api/v1/instances/{ref}/autostop", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_idle_stop_warns_once_then_stops_after_t_and_not_before(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    i, _ = make_running_instance(ann, tick, runner_for)
    set_autostop(ann, i, idle_minutes=30)
    t0 = started_at(rt, i)

    assert idle.tick(rt, now=t0 + timedelta(minutes=24)) == 0
    assert notes(rt, "idle_warning") == []
    idle.tick(rt, now=t0 + timedelta(minutes=25))
    (warning,) = notes(rt, "idle_warning")
    assert "will be stopped" in warning and "workspace kept" in warning
    shown = ann.get(f"/api/v1/instances/{i}/autostop").json()
    assert shown["idle_warned_at"] is not None
    assert shown["idle_stop_at"] is not None

    assert idle.tick(rt, now=t0 + timedelta(minutes=29, seconds=59)) == 0
    assert state(rt, i)[0] == "running"
    assert len(notes(rt, "idle_warning")) == 1  # warned once, not every tick

    assert idle.tick(rt, now=t0 + timedelta(minutes=30)) == 1
    status, desired, reason = state(rt, i)
    assert (status, desired) == ("stopping", "stopped")
    assert reason.startswith("idle:") and "workspace kept" in reason
    assert len(notes(rt, "instance_stopped_idle")) == 1
    runner_for(i).stopped()
    assert state(rt, i)[0] == "stopped"
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, i)
        assert instance is not None and instance.workspace is not None


def test_terminal_activity_resets_the_idle_clock_and_the_warning(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    i, _ = make_running_instance(ann, tick, runner_for)
    set_autostop(ann, i, idle_minutes=30)
    t0 = started_at(rt, i)
    idle.tick(rt, now=t0 + timedelta(minutes=26))
    assert len(notes(rt, "idle_warning")) == 1

    with transaction(rt.sessions) as session:
        assert activity.touch(session, i, t0 + timedelta(minutes=27))
        # throttled: a second keystroke within 30 s writes nothing
        assert not activity.touch(session, i, t0 + timedelta(minutes=27, seconds=20))
    assert ann.get(f"/api/v1/instances/{i}/autostop").json()["idle_warned_at"] is None

    assert idle.tick(rt, now=t0 + timedelta(minutes=40)) == 0
    assert state(rt, i)[0] == "running"
    assert idle.tick(rt, now=t0 + timedelta(minutes=27 + 25)) == 0
    assert len(notes(rt, "idle_warning")) == 2  # a new idle period warns again
    assert idle.tick(rt, now=t0 + timedelta(minutes=27 + 30)) == 1


def test_no_stop_without_a_warning_first_even_after_an_outage(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    i, _ = make_running_instance(ann, tick, runner_for)
    set_autostop(ann, i, idle_minutes=30)
    t0 = started_at(rt, i)
    # the server was down past T: the first look warns, the stop waits the warning's lead
    assert idle.tick(rt, now=t0 + timedelta(minutes=90)) == 0
    assert len(notes(rt, "idle_warning")) == 1
    assert idle.tick(rt, now=t0 + timedelta(minutes=94)) == 0
    assert idle.tick(rt, now=t0 + timedelta(minutes=95)) == 1


def _samples(rt: Runtime, instance_id: int, start: datetime, minutes: int, util: float) -> None:
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None and instance.node_id is not None
        for m in range(minutes):
            session.add(
                GpuSample(
                    node_id=instance.node_id,
                    gpu_uuid="GPU-test",
                    instance_id=instance_id,
                    time=start + timedelta(minutes=m),
                    util_pct=util,
                )
            )


def test_a_busy_gpu_keeps_the_instance_and_an_idle_one_stops_it(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    busy, _ = make_running_instance(ann, tick, runner_for)
    quiet, _ = make_running_instance(ann, tick, runner_for)
    for i in (busy, quiet):
        set_autostop(ann, i, idle_minutes=30, idle_util_pct=10)
    t0 = max(started_at(rt, busy), started_at(rt, quiet))
    _samples(rt, busy, t0, 60, util=85.0)
    _samples(rt, quiet, t0, 60, util=3.0)
    # a run is pending on the quiet one: with real readings, the GPU decides, not the run
    assert (
        ann.post(f"/api/v1/instances/{quiet}/runs", json={"command": "sleep 1"}).status_code == 201
    )

    for minute in (25, 30, 45, 59):
        idle.tick(rt, now=t0 + timedelta(minutes=minute))
    assert state(rt, busy)[0] == "running"
    assert state(rt, quiet)[0] == "stopping"
    assert "GPU utilisation under 10%" in state(rt, quiet)[2]


def test_a_running_run_keeps_an_instance_without_gpu_readings(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    i, _ = make_running_instance(ann, tick, runner_for)
    set_autostop(ann, i, idle_minutes=30)
    run = ann.post(f"/api/v1/instances/{i}/runs", json={"command": "python train.py"}).json()
    t0 = started_at(rt, i)
    for minute in (25, 31, 90):
        assert idle.tick(rt, now=t0 + timedelta(minutes=minute)) == 0
    assert notes(rt, "idle_warning") == []
    runner_for(i).run(run["id"], ["done"], 0)
    # the run just ended: its end restarts the idle clock
    assert idle.tick(rt, now=t0 + timedelta(minutes=120)) == 0
    assert state(rt, i)[0] == "running"


def test_max_runtime_stops_a_busy_instance(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    i, _ = make_running_instance(ann, tick, runner_for, max_runtime_minutes=480)
    shown = ann.get(f"/api/v1/instances/{i}/autostop").json()
    assert shown["max_runtime_minutes"] == 480 and shown["idle_minutes_effective"] is None
    ann.post(f"/api/v1/instances/{i}/runs", json={"command": "python train.py"})
    t0 = started_at(rt, i)
    assert idle.tick(rt, now=t0 + timedelta(minutes=474)) == 0
    assert notes(rt, "runtime_warning") == []
    # five minutes ahead the owner is told, once
    for minute in (476, 479):
        assert idle.tick(rt, now=t0 + timedelta(minutes=minute)) == 0
    (warning,) = notes(rt, "runtime_warning")
    stop_at = t0 + timedelta(minutes=480)
    assert f"maximum runtime of 8 h at {stop_at:%H:%M} UTC" in warning
    assert idle.tick(rt, now=t0 + timedelta(minutes=480)) == 1
    status, _, reason = state(rt, i)
    assert status == "stopping" and "maximum runtime of 8 h" in reason
    assert len(notes(rt, "instance_stopped")) == 1


def test_stop_after_a_given_run(
    ann: Caller, bob: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    i, _ = make_running_instance(ann, tick, runner_for)
    first = ann.post(f"/api/v1/instances/{i}/runs", json={"command": "prep"}).json()
    second = ann.post(f"/api/v1/instances/{i}/runs", json={"command": "train"}).json()
    set_autostop(ann, i, stop_after_run=first["id"])
    # switching to another run: the first one's end no longer stops the instance
    assert set_autostop(ann, i, stop_after_run=second["id"])["stop_after_run"] == second["id"]

    other, _ = make_running_instance(bob, tick, runner_for, gpu="T4:1")
    theirs = bob.post(f"/api/v1/instances/{other}/runs", json={"command": "x"}).json()
    r = ann.put(f"/api/v1/instances/{i}/autostop", json={"stop_after_run": theirs["id"]})
    assert r.status_code == 404 and "has no run" in r.json()["detail"]

    runner = runner_for(i)
    runner.run(first["id"], ["ok"], 0)
    assert state(rt, i)[0] == "running"
    r = ann.put(f"/api/v1/instances/{i}/autostop", json={"stop_after_run": first["id"]})
    assert r.status_code == 409 and "already ended" in r.json()["detail"]
    runner.run(second["id"], ["ok"], 0)
    status, desired, reason = state(rt, i)
    assert (status, desired) == ("stopping", "stopped")
    assert f"run {second['id']} ended" in reason


def test_bad_autostop_settings_are_refused_with_what_to_do(ann: Caller, bob: Caller) -> None:
    i = ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"]
    cases = [
        ({"idle_minutes": 30, "idle_util_pct": 0}, 422, "above 0 and at most 100"),
        ({"idle_minutes": 30, "idle_util_pct": 101}, 422, "above 0 and at most 100"),
        ({"idle_minutes": 2}, 422, "between 5 and"),
        ({"idle_util_pct": 5}, 422, "give idle_minutes too"),
        ({"max_runtime_minutes": 0}, 422, "between 1 and"),
        ({"idle_minutes": "soon"}, 422, "idle_minutes"),
        ({"stop_after_run": 999999}, 404, "has no run 999999"),
    ]
    for body, code, words in cases:
        r = ann.put(f"/api/v1/instances/{i}/autostop", json=body)
        assert r.status_code == code, (body, r.text)
        assert words in r.json()["detail"], (body, r.json())
    shown = ann.get(f"/api/v1/instances/{i}/autostop").json()
    assert shown["idle_minutes"] is None and shown["max_runtime_minutes"] is None

    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "x1", "idle_minutes": 1})
    assert r.status_code == 422 and "idle_minutes" in r.json()["detail"]
    assert len(ann.get("/api/v1/instances?all=true").json()) == 1

    assert bob.get(f"/api/v1/instances/{i}/autostop").status_code == 404
    r = bob.put(f"/api/v1/instances/{i}/autostop", json={"idle_minutes": 30})
    assert r.status_code == 404
    assert ann.get(f"/api/v1/instances/{i}/autostop").json()["idle_minutes"] is None


@pytest.fixture
def ceiling_rt(tmp_path: Path, database_url: str) -> Iterator[Runtime]:
    settings = make_settings(
        tmp_path / "ceiling", database_url, simulated_gpus="A100-80GB:1", idle_stop_max_minutes=60
    )
    runtime = build_runtime(settings, FakeBackend())
    yield runtime
    runtime.engine.dispose()  # a pooled PostgreSQL connection left open warns at collection


def test_the_operators_ceiling_bounds_and_defaults_idle_stop(ceiling_rt: Runtime) -> None:
    from starlette.testclient import TestClient

    from factories import make_user

    rt = ceiling_rt
    backend = rt.backend
    assert isinstance(backend, FakeBackend)
    with TestClient(create_app(rt.settings, runtime=rt, reconcilers=False)) as http:
        ann = make_user(http, "ann")
        r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
        i = r.json()["id"]
        r = ann.put(f"/api/v1/instances/{i}/autostop", json={"idle_minutes": 120})
        assert r.status_code == 422
        assert "ceiling of 60 minutes" in r.json()["detail"]
        shown = ann.get(f"/api/v1/instances/{i}/autostop").json()
        assert shown["idle_minutes"] is None
        assert shown["idle_minutes_effective"] == 60 and shown["idle_ceiling_minutes"] == 60

        from gpulease.server.reconcilers.loop import run_once

        run_once(rt)
        handle = backend.handle_for(i)
        assert handle is not None
        RunnerDouble(http, backend.runners[handle].spec.token).ready()
        t0 = started_at(rt, i)
        assert idle.tick(rt, now=t0 + timedelta(minutes=55)) == 0  # the warning
        assert idle.tick(rt, now=t0 + timedelta(minutes=60)) == 1
    rt.engine.dispose()


def test_one_pass_judges_each_instance_by_its_own_window_threshold_readings_and_runs(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    kinds = ("gpu-busy", "gpu-high-bar", "gpu-quiet", "run-pending", "run-ended", "nothing")
    ids = {kind: make_running_instance(ann, tick, runner_for, kind, gpu=None)[0] for kind in kinds}
    long_window, _ = make_running_instance(ann, tick, runner_for, "long-window", gpu=None)
    for kind, i in ids.items():
        set_autostop(ann, i, idle_minutes=30, idle_util_pct=90 if kind == "gpu-high-bar" else 10)
    set_autostop(ann, long_window, idle_minutes=120)
    t0 = max(started_at(rt, i) for i in [*ids.values(), long_window])
    _samples(rt, ids["gpu-busy"], t0, 20, util=85.0)  # busy until minute 19
    _samples(rt, ids["gpu-high-bar"], t0, 20, util=85.0)  # under its own 90 %
    _samples(rt, ids["gpu-quiet"], t0, 26, util=3.0)
    assert ann.post(
        f"/api/v1/instances/{ids['run-pending']}/runs", json={"command": "x"}
    ).is_success
    ended = ann.post(f"/api/v1/instances/{ids['run-ended']}/runs", json={"command": "y"}).json()
    runner_for(ids["run-ended"]).run(ended["id"], ["done"], 0)
    with transaction(rt.sessions) as session:
        run = session.get(Run, ended["id"])
        assert run is not None
        run.finished_at = t0 + timedelta(minutes=10)

    # at minute 26 the 30-minute windows warn what has been idle for 25 minutes or more
    assert idle.tick(rt, now=t0 + timedelta(minutes=26)) == 0
    with transaction(rt.sessions) as session:
        warned = {
            i.name
            for i in session.scalars(select(Instance).where(Instance.idle_warned_at.is_not(None)))
        }
    assert warned == {"gpu-high-bar", "gpu-quiet", "nothing"}


def test_a_pass_over_more_instances_than_one_in_list_stops_every_one_due(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL refuses a statement of more than 65,535 parameters, so the ids the write
    # pass takes again are asked a slice at a time: here slices of 2 over 5 instances.
    monkeypatch.setattr(db, "IN_BATCH", 2)
    ids = [make_running_instance(ann, tick, runner_for, f"box{n}", gpu=None)[0] for n in range(5)]
    for i in ids:
        set_autostop(ann, i, idle_minutes=30)
    t0 = max(started_at(rt, i) for i in ids)
    assert idle.tick(rt, now=t0 + timedelta(minutes=25)) == 0
    assert len(notes(rt, "idle_warning")) == 5
    assert idle.tick(rt, now=t0 + timedelta(minutes=30)) == 5
    assert {state(rt, i)[:2] for i in ids} == {("stopping", "stopped")}
