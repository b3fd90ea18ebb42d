"""The server's side of the runner protocol: runs, logs, exits, one-shot instances."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.server.db import transaction
from gpulease.server.orm import Instance
from gpulease.server.runtime import Runtime


def test_run_logs_and_exit_code(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    run = ann.post(
        f"/api/v1/instances/{instance_id}/runs",
        json={"command": "python train.py", "env": {"LR": "0.1"}},
    ).json()
    assert run["status"] == "pending"
    (cmd,) = runner.commands()
    assert cmd == {"id": run["id"], "command": "python train.py", "env": {"LR": "0.1"}}
    runner.run(run["id"], ["epoch 1 loss=0.9", "epoch 2 loss=0.5"], 0)
    assert runner.commands() == []
    page = ann.get(f"/api/v1/runs/{run['id']}/logs").json()
    assert [c["data"] for c in page["chunks"]] == ["epoch 1 loss=0.9\n", "epoch 2 loss=0.5\n"]
    assert page["run"]["status"] == "succeeded" and page["run"]["exit_code"] == 0
    later = ann.get(f"/api/v1/runs/{run['id']}/logs", params={"after": 0}).json()
    assert [c["seq"] for c in later["chunks"]] == [1]


def test_resent_log_chunks_are_not_duplicated(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "x"}).json()
    chunk = {"seq": 0, "stream": "stderr", "data": "warning\n", "time": 1.7e9}
    for _ in range(3):
        assert (
            runner.call("POST", f"/runs/{run['id']}/logs", json={"chunks": [chunk]}).status_code
            == 204
        )
    page = ann.get(f"/api/v1/runs/{run['id']}/logs").json()
    assert len(page["chunks"]) == 1 and page["chunks"][0]["stream"] == "stderr"


def test_failed_run_reports_its_code(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "exit 3"}).json()
    runner.run(run["id"], [], 3)
    got = ann.get(f"/api/v1/runs/{run['id']}").json()
    assert got["status"] == "failed" and got["exit_code"] == 3
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "running"


def test_one_shot_instance_is_released_when_its_run_ends(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(
        ann, tick, runner_for, gpu="T4:1", auto_release=True
    )
    run = ann.post(
        f"/api/v1/instances/{instance_id}/runs",
        json={"command": "python train.py", "stop_instance_on_exit": True},
    ).json()
    runner.run(run["id"], ["done"], 0)
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "stopping"
    assert runner.heartbeat() == "stop"
    runner.stopped()
    tick()
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "released"


def test_runs_end_when_their_instance_stops(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "sleep 100"}).json()
    ann.post(f"/api/v1/instances/{instance_id}/stop")
    runner.stopped()
    got = ann.get(f"/api/v1/runs/{run['id']}").json()
    assert got["status"] == "failed" and "stopped by its owner" in got["status_reason"]


def test_runner_cannot_touch_another_instances_runs(
    ann: Caller, bob: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    a_id, _ = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    _, b_runner = make_running_instance(bob, tick, runner_for, gpu="A100-80GB:1")
    run = ann.post(f"/api/v1/instances/{a_id}/runs", json={"command": "x"}).json()
    r = b_runner.call(
        "POST",
        f"/runs/{run['id']}/logs",
        json={"chunks": [{"seq": 0, "stream": "stdout", "data": "forged", "time": 1.0}]},
    )
    assert r.status_code == 404
    assert (
        b_runner.call("POST", f"/runs/{run['id']}/exit", json={"exit_code": 0}).status_code == 404
    )
    assert ann.get(f"/api/v1/runs/{run['id']}").json()["status"] == "pending"
    assert ann.get(f"/api/v1/runs/{run['id']}/logs").json()["chunks"] == []
    # a user token is not a runner token
    r = ann.http.post("/runner/v1/heartbeat", headers=ann.headers, json={})
    assert r.status_code == 401


def test_workdir_upload_reaches_the_runner(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1"})
    instance_id = r.json()["id"]
    assert ann.put(f"/api/v1/instances/{instance_id}/workdir", content=b"").status_code == 422
    assert (
        ann.put(f"/api/v1/instances/{instance_id}/workdir", content=b"\x1f\x8bdata").status_code
        == 204
    )
    tick()
    runner = runner_for(instance_id)
    got = runner.call("GET", "/workdir")
    assert got.status_code == 200 and got.content == b"\x1f\x8bdata"


def test_a_vanished_workdir_upload_is_a_410_and_other_runners_never_get_it(
    ann: Caller,
    bob: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id = ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"]
    assert (
        ann.put(f"/api/v1/instances/{instance_id}/workdir", content=b"\x1f\x8b..").status_code
        == 204
    )
    bobs_id = bob.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).json()["id"]
    tick()
    assert runner_for(bobs_id).call("GET", "/workdir").status_code == 204  # not ann's
    with transaction(rt.sessions) as session:
        upload = session.get(Instance, instance_id).workdir_upload  # type: ignore[union-attr]
    assert upload is not None
    Path(upload).unlink()  # deleted from the uploads folder, the runner token still valid
    got = runner_for(instance_id).call("GET", "/workdir")
    assert got.status_code == 410
    assert "is no longer on the server" in got.json()["detail"]
    assert "run the task again" in got.json()["detail"]


def test_log_stream_sends_chunks_then_end(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "x"}).json()
    runner.run(run["id"], ["a", "b"], 0)
    url = f"/api/v1/runs/{run['id']}/stream?metrics=false"
    with ann.http.stream("GET", url, headers=ann.headers) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    events = [line.split(": ", 1)[1] for line in body.splitlines() if line.startswith("event: ")]
    assert events == ["log", "log", "status", "end"]
    assert '"exit_code": 0' in body


def test_an_instance_awaiting_its_workdir_is_not_placed_until_it_lands(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "awaiting_workdir": True})
    instance_id = r.json()["id"]
    assert r.json()["status_message"] == "waiting for the workdir upload"
    other = ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"]
    tick()
    # the waiting one does not hold up the queue behind it
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "queued"
    assert ann.get(f"/api/v1/instances/{other}").json()["status"] == "starting"
    ann.post(f"/api/v1/instances/{other}/release")
    runner_for(other).stopped()
    tick()
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "queued"
    assert (
        ann.put(f"/api/v1/instances/{instance_id}/workdir", content=b"\x1f\x8b..").status_code
        == 204
    )
    tick()
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "starting"
    assert runner_for(instance_id).call("GET", "/workdir").content == b"\x1f\x8b.."


SESSION = "glr_" + "s" * 43  # a runner-made session token (url-safe, 256 bits in real use)


def test_a_session_token_replaces_the_launch_secret(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    launch = runner.token
    assert runner.call("POST", "/session", json={"token": SESSION}).status_code == 204

    # The launch secret (in the spec file) is refused from now on, for every call.
    assert runner.call("POST", "/heartbeat", json={"running_runs": []}).status_code == 401
    assert runner.call("POST", "/session", json={"token": "glr_" + "x" * 43}).status_code == 401
    session = RunnerDouble(runner.http, SESSION)
    assert session.heartbeat() == "continue"
    # Asking again with the session token itself (its answer was lost) changes nothing.
    assert session.call("POST", "/session", json={"token": SESSION}).status_code == 204
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "x"}).json()
    assert [r["id"] for r in session.commands()] == [run["id"]]

    # A later session (the server came back) retires this one in turn.
    later = "glr_" + "t" * 43
    assert session.call("POST", "/session", json={"token": later}).status_code == 204
    assert session.call("GET", "/commands", params={"wait": 0}).status_code == 401
    assert RunnerDouble(runner.http, later).heartbeat() == "continue"
    assert launch != later


def test_a_session_needs_a_strong_token_and_the_runners_own_secret(
    ann: Caller,
    bob: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, gpu="T4:1")
    _, bobs = make_running_instance(bob, tick, runner_for, gpu="A100-80GB:1")
    for weak in ("", "short", "glr_" + "a" * 10, "x" * 60, "glr_" + "é" * 43):
        r = runner.call("POST", "/session", json={"token": weak})
        assert r.status_code == 422, (weak, r.text)
    assert runner.heartbeat() == "continue"  # a refused session changes nothing
    # Without a runner's secret nobody opens a session: a user token, a made-up one.
    r = ann.http.post("/runner/v1/session", headers=ann.headers, json={"token": SESSION})
    assert r.status_code == 401
    assert (
        RunnerDouble(runner.http, "glr_guess")
        .call("POST", "/session", json={"token": SESSION})
        .status_code
        == 401
    )
    # Bob's runner opening a session moves only its own token.
    assert bobs.call("POST", "/session", json={"token": SESSION}).status_code == 204
    assert runner.heartbeat() == "continue"
