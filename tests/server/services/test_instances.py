"""Instances through the API: create, queue, stop, start, release, isolation, bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from factories import Caller, RunnerDouble
from gpulease.backends.fake import FakeBackend
from gpulease.server.runtime import Runtime


def create(caller: Caller, gpu: str | None = "A100-80GB:1", **kw: object) -> dict[str, object]:
    r = caller.post("/api/v1/instances", json={"gpu": gpu, **kw})
    assert r.status_code == 201, r.text
    return dict(r.json())


def show(caller: Caller, ref: object) -> dict[str, object]:
    r = caller.get(f"/api/v1/instances/{ref}")
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"gpu": "B200:1"}, 422, "unknown GPU model 'B200'"),
        ({"gpu": "A100-80GB:0"}, 422, "at least 1"),
        ({"gpu": "A100-80GB:-1"}, 422, "at least 1"),
        ({"gpu": "A100-80GB:x"}, 422, "whole number"),
        ({"gpu": "A100-80GB:3"}, 409, "largest has 2"),
        ({"gpu": "H100-80GB:1"}, 409, "no node offers H100-80GB"),
        ({"gpu": "T4:1", "template": "tensorflow"}, 422, "unknown template"),
        ({"gpu": "T4:1", "name": "Bad Name"}, 422, "not a valid instance name"),
        ({"gpu": ["T4"]}, 422, "gpu"),
    ],
)
def test_bad_requests_are_refused_and_create_nothing(
    ann: Caller, body: dict[str, object], status: int, words: str
) -> None:
    r = ann.post("/api/v1/instances", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]
    assert ann.get("/api/v1/instances?all=true").json() == []


def test_fifo_queue_third_waits_then_starts(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    ids = [create(ann)["id"] for _ in range(3)]
    tick()
    states = [show(ann, i)["status"] for i in ids]
    assert states == ["starting", "starting", "queued"]
    assert show(ann, ids[2])["queue_position"] == 1
    for i in ids[:2]:
        runner_for(i).ready()
    assert show(ann, ids[0])["status"] == "running"
    assert ann.post(f"/api/v1/instances/{ids[0]}/stop").json()["status"] == "stopping"
    first = runner_for(ids[0])
    assert first.heartbeat() == "stop"
    first.stopped()
    assert show(ann, ids[0])["status"] == "stopped"
    tick()
    third = show(ann, ids[2])
    assert third["status"] == "starting" and third["queue_position"] is None
    assert third["gpu_indices"] == show(ann, ids[0]).get("gpu_indices") or third["gpu_indices"]


def test_queue_is_per_model(ann: Caller, tick: Callable[[], None]) -> None:
    a = [create(ann)["id"] for _ in range(3)]
    t4 = create(ann, "T4:1")["id"]
    tick()
    assert show(ann, a[2])["status"] == "queued"
    assert show(ann, t4)["status"] == "starting"


def test_stop_start_release_keep_and_delete_the_workspace(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    inst = create(ann, name="work")
    tick()
    runner = runner_for(inst["id"])  # type: ignore[arg-type]
    runner.ready()
    workspace = rt.settings.workspaces_path / str(inst["id"])
    workspace.mkdir(parents=True)
    (workspace / "model.pt").write_text("weights")
    ann.post("/api/v1/instances/work/stop")
    runner.stopped()
    assert show(ann, "work")["status"] == "stopped"
    assert (workspace / "model.pt").exists()
    # stopped: GPUs back in the pool
    models = {m["name"]: m for m in ann.get("/api/v1/gpus").json()}
    assert models["A100-80GB"]["free"] == 2
    assert ann.post("/api/v1/instances/work/start").json()["status"] == "queued"
    tick()
    runner = runner_for(inst["id"])  # type: ignore[arg-type]
    runner.ready()
    assert show(ann, "work")["status"] == "running"
    assert (workspace / "model.pt").exists()
    ann.post("/api/v1/instances/work/release")
    assert runner.heartbeat() == "stop"
    runner.stopped()
    tick()
    assert not workspace.exists()
    assert ann.get("/api/v1/instances").json() == []
    assert ann.get("/api/v1/instances?all=true").json()[0]["status"] == "released"
    # its token no longer works
    assert runner.call("POST", "/heartbeat", json={}).status_code == 401


def test_other_users_get_404_for_everything(
    ann: Caller, bob: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    inst = create(ann, name="secret")
    tick()
    runner_for(inst["id"]).ready()  # type: ignore[arg-type]
    run = ann.post("/api/v1/instances/secret/runs", json={"command": "echo hi"}).json()
    for ref in (inst["id"], "secret"):
        assert bob.get(f"/api/v1/instances/{ref}").status_code == 404
        for action in ("stop", "start", "release"):
            assert bob.post(f"/api/v1/instances/{ref}/{action}").status_code == 404
        r = bob.post(f"/api/v1/instances/{ref}/runs", json={"command": "cat /etc/passwd"})
        assert r.status_code == 404
        assert bob.put(f"/api/v1/instances/{ref}/workdir", content=b"x").status_code == 404
    for url in (
        f"/api/v1/runs/{run['id']}",
        f"/api/v1/runs/{run['id']}/logs",
        f"/api/v1/runs/{run['id']}/stream",
    ):
        assert bob.get(url).status_code == 404
    assert bob.get("/api/v1/instances").json() == []
    assert bob.get("/api/v1/runs").json() == []
    assert show(ann, "secret")["status"] == "running"
    assert len(ann.get("/api/v1/runs").json()) == 1


def test_exec_on_a_stopped_instance_says_to_start_it(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    inst = create(ann, name="idle")
    ann.post("/api/v1/instances/idle/stop")
    r = ann.post("/api/v1/instances/idle/runs", json={"command": "nvidia-smi"})
    assert r.status_code == 409 and "gpulease instance start idle" in r.json()["detail"]
    r = ann.post(f"/api/v1/instances/{inst['id']}/runs", json={"command": "  "})
    assert r.status_code in (409, 422)


def test_dead_runner_fails_the_instance_and_frees_gpus(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    from gpulease.server.reconcilers import health

    inst = create(ann)
    tick()
    runner_for(inst["id"]).ready()  # type: ignore[arg-type]
    handle = backend.handle_for(inst["id"])  # type: ignore[arg-type]
    assert handle
    backend.set_alive(handle, False)
    assert health.tick(rt, check_all=True) == [inst["id"]]
    got = show(ann, inst["id"])
    assert got["status"] == "failed"
    assert "runner process exited unexpectedly" in str(got["status_reason"])
    models = {m["name"]: m for m in ann.get("/api/v1/gpus").json()}
    assert models["A100-80GB"]["free"] == 2
    notes = [n["message"] for n in ann.get("/api/v1/notifications").json()]
    assert any("failed" in n for n in notes)


def test_live_runner_is_left_alone_by_the_startup_check(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    from gpulease.server.reconcilers import health

    inst = create(ann)
    tick()
    runner_for(inst["id"]).ready()  # type: ignore[arg-type]
    assert health.tick(rt, check_all=True) == []
    assert show(ann, inst["id"])["status"] == "running"


def test_runner_that_ignores_stop_is_killed_after_grace(
    ann: Caller,
    rt: Runtime,
    backend: FakeBackend,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    inst = create(ann)
    tick()
    runner_for(inst["id"]).ready()  # type: ignore[arg-type]
    backend.stop_kills = False
    ann.post(f"/api/v1/instances/{inst['id']}/stop")
    tick()
    assert show(ann, inst["id"])["status"] == "stopping"
    rt.settings.stop_grace_s = 0
    tick()
    got = show(ann, inst["id"])
    assert got["status"] == "stopped"
    handle = backend.handle_for(inst["id"])  # type: ignore[arg-type]
    assert handle and backend.runners[handle].stop_calls == [True]


def test_runner_start_error_fails_the_instance_with_the_reason(
    ann: Caller, backend: FakeBackend, tick: Callable[[], None]
) -> None:
    backend.start_error = OSError("no space left on device")
    inst = create(ann)
    tick()
    got = show(ann, inst["id"])
    assert got["status"] == "failed"
    assert "no space left on device" in str(got["status_reason"])


def test_not_enough_credit_is_402_with_numbers(ann: Caller, admin: Caller, rt: Runtime) -> None:
    rt.settings.min_start_minutes = 60 * 24
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:2"})
    assert r.status_code == 402
    detail = r.json()["detail"]
    assert "$1.8000/h" in detail and "$10.0000" in detail
    assert ann.get("/api/v1/instances?all=true").json() == []
