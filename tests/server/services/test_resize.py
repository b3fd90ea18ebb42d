"""Resize a stopped instance and start one without GPUs: prices, workspace, restart, refusals."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, make_user
from gpulease.backends.fake import FakeBackend
from gpulease.core.catalog import load_catalog
from gpulease.server.app import create_app
from gpulease.server.db import transaction
from gpulease.server.orm import UsageSegment
from gpulease.server.reconcilers.loop import run_once
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.settings import Settings

Tick = Callable[[], None]
RunnerFor = Callable[[int], RunnerDouble]
PRICES = {m.name: m.hourly_micro for m in load_catalog(None).models}


def runner(http: TestClient, backend: FakeBackend, instance_id: int) -> RunnerDouble:
    handle = backend.handle_for(instance_id)
    assert handle is not None
    return RunnerDouble(http, backend.runners[handle].spec.token)


def segments(rt: Runtime, instance_id: int) -> list[tuple[str, int, int]]:
    with transaction(rt.sessions) as session:
        return [
            (s.gpu_model, s.gpu_count, s.hourly_micro)
            for s in session.scalars(
                select(UsageSegment)
                .where(UsageSegment.instance_id == instance_id)
                .order_by(UsageSegment.id)
            )
        ]


def test_resize_across_a_server_restart_keeps_the_workspace_and_bills_the_new_rate(
    settings: Settings,
) -> None:
    backend = FakeBackend()
    rt = build_runtime(settings, backend)
    with TestClient(create_app(settings, runtime=rt, reconcilers=False)) as http:
        ann = make_user(http, "ann")
        i = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2"}).json()["id"]
        run_once(rt)
        runner(http, backend, i).ready()
        workspace = backend.runners[backend.handle_for(i) or ""].spec.workspace
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "checkpoint.pt").write_text("epoch 7")
        ann.post(f"/api/v1/instances/{i}/stop")
        runner(http, backend, i).stopped()
        r = ann.post(f"/api/v1/instances/{i}/resize", json={"gpu_model": "t4", "gpu_count": 1})
        assert r.status_code == 200, r.text
        resized = r.json()
        assert (resized["gpu_model"], resized["gpu_count"]) == ("T4", 1)
        assert resized["hourly_micro"] == PRICES["T4"]
        token = ann.token
    rt.engine.dispose()

    backend = FakeBackend()
    rt = build_runtime(settings, backend)  # the server restarts over the same database
    try:
        with TestClient(create_app(settings, runtime=rt, reconcilers=False)) as http:
            ann = Caller(http, token, "ann")
            assert ann.get(f"/api/v1/instances/{i}").json()["gpu_model"] == "T4"
            assert ann.post(f"/api/v1/instances/{i}/start").json()["status"] == "queued"
            run_once(rt)
            spec = backend.runners[backend.handle_for(i) or ""].spec
            assert spec.workspace == workspace
            assert (spec.workspace / "checkpoint.pt").read_text() == "epoch 7"
            assert len(spec.gpu_uuids) == 1
            runner(http, backend, i).ready()
            assert segments(rt, i) == [
                ("A100-80GB", 2, 2 * PRICES["A100-80GB"]),
                ("T4", 1, PRICES["T4"]),
            ]
    finally:
        rt.engine.dispose()


def test_no_gpu_start_runs_cpu_only_and_a_plain_start_brings_the_gpus_back(
    ann: Caller, rt: Runtime, backend: FakeBackend, tick: Tick, runner_for: RunnerFor
) -> None:
    i = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).json()["id"]
    r = ann.post(f"/api/v1/instances/{i}/start", json={"no_gpu": True})
    assert r.status_code == 409 and "stop it first" in r.json()["detail"]
    ann.post(f"/api/v1/instances/{i}/stop")

    r = ann.post(f"/api/v1/instances/{i}/start", json={"no_gpu": True})
    assert r.status_code == 200, r.text
    cpu = r.json()
    assert (cpu["gpu_model"], cpu["gpu_count"], cpu["hourly_micro"]) == ("CPU", 0, PRICES["CPU"])
    tick()
    runner_for(i).ready()
    assert backend.runners[backend.handle_for(i) or ""].spec.gpu_uuids == ()
    ann.post(f"/api/v1/instances/{i}/stop")
    runner_for(i).stopped()

    back = ann.post(f"/api/v1/instances/{i}/start").json()
    assert (back["gpu_model"], back["gpu_count"]) == ("A100-80GB", 1)
    tick()
    runner_for(i).ready()
    assert [s[0] for s in segments(rt, i)] == ["CPU", "A100-80GB"]
    assert segments(rt, i)[0][2] == PRICES["CPU"]


def test_resize_refusals_say_what_to_do(ann: Caller, bob: Caller) -> None:
    i = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).json()["id"]
    r = ann.post(f"/api/v1/instances/{i}/resize", json={"gpu_model": "T4", "gpu_count": 1})
    assert r.status_code == 409 and "stop it first" in r.json()["detail"]
    ann.post(f"/api/v1/instances/{i}/stop")
    cases = [
        ({"gpu_model": "B200", "gpu_count": 1}, 422, "unknown GPU model 'B200'"),
        ({"gpu_model": "T4", "gpu_count": 0}, 422, "at least 1"),
        ({"gpu_model": "T4", "gpu_count": 2}, 409, "largest has 1"),
        ({"gpu_model": "H100-80GB"}, 409, "no node offers H100-80GB"),
        ({}, 422, '"gpu_model": "T4"'),
        ({"no_gpu": True, "gpu_count": 2}, 422, "no gpu_count"),
        ({"gpu_model": "T4", "gpu_count": "two"}, 422, "gpu_count"),
    ]
    for body, code, words in cases:
        r = ann.post(f"/api/v1/instances/{i}/resize", json=body)
        assert r.status_code == code, (body, r.text)
        assert words in r.json()["detail"], (body, r.json())
    shown = ann.get(f"/api/v1/instances/{i}").json()
    assert (shown["gpu_model"], shown["gpu_count"]) == ("A100-80GB", 1)

    r = bob.post(f"/api/v1/instances/{i}/resize", json={"gpu_model": "T4", "gpu_count": 1})
    assert r.status_code == 404
    assert bob.post(f"/api/v1/instances/{i}/start", json={"no_gpu": True}).status_code == 404
    assert ann.get(f"/api/v1/instances/{i}").json()["gpu_model"] == "A100-80GB"

    # resized to CPU only, it stays so across plain starts
    r = ann.post(f"/api/v1/instances/{i}/resize", json={"no_gpu": True})
    assert r.status_code == 200 and r.json()["gpu_model"] == "CPU"
    assert r.json()["hourly_micro"] == PRICES["CPU"]
    assert ann.post(f"/api/v1/instances/{i}/start").json()["gpu_model"] == "CPU"
