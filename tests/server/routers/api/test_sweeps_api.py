"""Sweeps through the API on both databases: trials as instances with runs, the credit check,
the best trial, the median stopping rule on a fixed clock, bad input and other users."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from factories import Caller, RunnerDouble
from gpulease.server.reconcilers import sweeps as sweep_reconciler
from gpulease.server.runtime import Runtime

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def _body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "tune",
        "task": {
            "name": "train",
            "run": "python train.py --lr ${lr} --batch ${batch}",
            "envs": {"EPOCHS": "3", "TAG": "lr-${lr}"},
            "gpu": "T4:1",
        },
        "space": {"grid": {"lr": ["0.1", "0.01"], "batch": ["32", "64"]}},
        "metric": "val_acc",
        "goal": "max",
    }
    body.update(over)
    return body


def _create(caller: Caller, **over: Any) -> dict[str, Any]:
    r = caller.post("/api/v1/sweeps", json=_body(**over))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_a_grid_sweep_makes_one_instance_and_run_per_trial(ann: Caller) -> None:
    sweep = _create(ann)
    trials = sweep["trials"]
    assert [t["params"] for t in trials] == [
        {"lr": "0.1", "batch": "32"},
        {"lr": "0.1", "batch": "64"},
        {"lr": "0.01", "batch": "32"},
        {"lr": "0.01", "batch": "64"},
    ]
    assert sweep["counts"] == {"queued": 4}
    assert sweep["finished"] is False
    assert sweep["metric_note"] == "no trial has reported val_acc yet"
    run = ann.get(f"/api/v1/runs/{trials[2]['run_id']}").json()
    assert "--lr 0.01 --batch 32" in run["command"]
    assert run["task_name"] == "train"
    instance = ann.get(f"/api/v1/instances/{trials[2]['instance_id']}").json()
    assert instance["name"] == f"sweep-{sweep['id']}-3"
    assert instance["gpu_model"] == "T4"
    listed = ann.get("/api/v1/sweeps").json()
    assert [s["id"] for s in listed] == [sweep["id"]]


def test_a_trial_receives_its_values_as_upper_case_variables_and_in_envs(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    sweep = _create(ann, space={"grid": {"lr": ["0.5"], "batch": ["8"]}})
    tick()
    runner = runner_for(sweep["trials"][0]["instance_id"])
    runner.ready()
    (given,) = runner.commands()
    assert given["env"]["LR"] == "0.5"
    assert given["env"]["BATCH"] == "8"
    assert given["env"]["TAG"] == "lr-0.5"
    assert given["env"]["EPOCHS"] == "3"


def test_random_trials_repeat_with_the_seed_the_sweep_records(ann: Caller) -> None:
    space = {"random": 3, "ranges": [{"name": "lr", "low": 1e-4, "high": 1e-1, "scale": "log"}]}
    first = _create(
        ann, space=space, task={"run": "echo ${lr}", "gpu": None, "template": "pytorch"}
    )
    seed = first["space"]["seed"]
    again = _create(ann, space={**space, "seed": seed}, task={"run": "echo ${lr}", "gpu": None})
    assert [t["params"] for t in again["trials"]] == [t["params"] for t in first["trials"]]
    assert all(1e-4 <= float(t["params"]["lr"]) <= 1e-1 for t in first["trials"])


def test_a_sweep_the_credit_does_not_cover_is_refused_with_its_total(ann: Caller) -> None:
    # A100-80GB is $0.90/h in the catalog; ann has $10.00 of sign-up credit. 12 trials of
    # 60 min each: 12 × $0.90 = $10.80.
    task = {"run": "python train.py", "gpu": "A100-80GB:1", "max_runtime_minutes": 60}
    values = [str(i) for i in range(12)]
    r = ann.post("/api/v1/sweeps", json=_body(task=task, space={"grid": {"seed": values}}))
    assert r.status_code == 402, r.text
    detail = r.json()["detail"]
    assert "12 trials of A100-80GB:1" in detail
    assert "estimated at $10.8000 ($0.9000 each" in detail
    assert "your balance is $10.0000" in detail
    assert ann.get("/api/v1/instances").json() == []  # nothing was left behind
    assert ann.get("/api/v1/sweeps").json() == []
    r = ann.post("/api/v1/sweeps", json=_body(task=task, space={"grid": {"seed": values[:11]}}))
    assert r.status_code == 201, r.text
    assert r.json()["estimated"] == "$9.9000"


BAD = [
    ({"space": {"grid": {}}}, "0 trials"),
    ({"space": {"random": 0, "ranges": [{"name": "lr", "low": 0, "high": 1}]}}, "0 trials"),
    (
        {"space": {"grid": {"a": [str(i) for i in range(40)], "b": [str(i) for i in range(26)]}}},
        "40 × 26 = 1,040 trials, above the limit of 1,000",
    ),
    ({"space": {"random": 2, "ranges": [{"name": "lr", "low": 1, "high": 0}]}}, "below the high"),
    ({"space": {"grid": {"my lr": ["1"]}}}, "not a parameter name"),
    ({"metric": "val acc"}, "not a metric key"),
    ({"metric": None, "stop_early": True}, "name it, e.g. --metric"),
    (
        {"space": {"grid": {"lr": ["1"]}, "ranges": [{"name": "x", "low": 0, "high": 1}]}},
        "--random N",
    ),
]


def test_bad_sweeps_are_refused_with_a_message(ann: Caller) -> None:
    for over, says in BAD:
        r = ann.post("/api/v1/sweeps", json=_body(**over))
        assert r.status_code == 422, r.text
        assert says in r.json()["detail"], (over, r.json()["detail"])
    assert ann.get("/api/v1/instances").json() == []


def test_other_users_sweeps_are_not_found(ann: Caller, bob: Caller) -> None:
    sweep = _create(ann)
    for path in (f"/api/v1/sweeps/{sweep['id']}", f"/api/v1/sweeps/{sweep['id']}/curves"):
        r = bob.get(path)
        assert r.status_code == 404
        assert "you have no sweep" in r.json()["detail"]
    assert bob.get("/api/v1/sweeps").json() == []
    assert ann.get("/api/v1/sweeps/999999").status_code == 404


def _report(runner: RunnerDouble, run_id: int, key: str, values: list[float]) -> None:
    points = [
        {"key": key, "step": step, "value": value, "time": 1.7e9 + step}
        for step, value in enumerate(values, start=1)
    ]
    r = runner.call("POST", f"/runs/{run_id}/metrics", json={"points": points})
    assert r.status_code == 204, r.text


def _start_trials(
    caller: Caller,
    sweep: dict[str, Any],
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> list[RunnerDouble]:
    tick()
    runners = []
    for trial in sweep["trials"]:
        runner = runner_for(trial["instance_id"])
        runner.ready()
        assert (
            runner.call("POST", f"/runs/{trial['run_id']}/started", json={"pid": 2}).status_code
            == 204
        )
        runners.append(runner)
    return runners


def test_the_median_rule_stops_a_trial_behind_and_names_the_best(
    rt: Runtime,
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    space = {"grid": {"lr": ["0.1", "0.01", "0.001"]}}
    task = {"run": "python train.py --lr ${lr}", "gpu": None}
    sweep = _create(ann, space=space, task=task, stop_early=True, min_steps=3, min_trials=2)
    runners = _start_trials(ann, sweep, tick, runner_for)
    trials = sweep["trials"]
    _report(runners[0], trials[0]["run_id"], "val_acc", [0.5, 0.6, 0.7, 0.8])
    _report(runners[1], trials[1]["run_id"], "val_acc", [0.4, 0.6, 0.75, 0.85])
    _report(runners[2], trials[2]["run_id"], "val_acc", [0.1, 0.2])
    assert sweep_reconciler.tick(rt, now=NOW) == 0  # 2 steps < min_steps
    _report(runners[2], trials[2]["run_id"], "val_acc", [0.1, 0.2, 0.25])
    assert sweep_reconciler.tick(rt, now=NOW) == 1
    assert sweep_reconciler.tick(rt, now=NOW) == 0  # once
    shown = ann.get(f"/api/v1/sweeps/{sweep['id']}").json()
    third = shown["trials"][2]
    assert third["stopped_early"] is True
    assert third["status"].startswith("stopped early at step 3: its best val_acc 0.25 is below")
    assert third["instance_status"] == "stopping"
    instance = ann.get(f"/api/v1/instances/{third['instance_id']}").json()
    assert "median stopping rule" in instance["status_reason"]
    assert instance["desired_state"] == "released"
    assert shown["counts"] == {"running": 2, "stopped_early": 1}
    assert shown["best_trial"] == 2  # 0.85
    assert [t["best"] for t in shown["trials"]] == [0.8, 0.85, 0.25]
    curves = ann.get(f"/api/v1/sweeps/{sweep['id']}/curves").json()
    assert curves["key"] == "val_acc"
    assert [c["series"][0]["values"] for c in curves["runs"]][2] == [0.1, 0.2, 0.25]


def test_a_metric_no_trial_reported_is_named_once_the_sweep_ended(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    sweep = _create(ann, space={"grid": {"lr": ["0.1", "0.01"]}}, task={"run": "x", "gpu": None})
    runners = _start_trials(ann, sweep, tick, runner_for)
    for runner, trial in zip(runners, sweep["trials"], strict=True):
        _report(runner, trial["run_id"], "loss", [1.0, 0.5])
        assert (
            runner.call("POST", f"/runs/{trial['run_id']}/exit", json={"exit_code": 0}).status_code
            == 204
        )
    shown = ann.get(f"/api/v1/sweeps/{sweep['id']}").json()
    assert shown["finished"] is True
    assert shown["counts"] == {"succeeded": 2}
    assert shown["best_trial"] is None
    assert shown["metric_note"] == "no trial of this sweep reported 'val_acc'; they reported loss"
    r = ann.get(f"/api/v1/sweeps/{sweep['id']}", params={"metric": "acc"})
    assert r.status_code == 422
    assert "reported 'acc'; they reported loss" in r.json()["detail"]
    by_loss = ann.get(f"/api/v1/sweeps/{sweep['id']}", params={"metric": "loss"}).json()
    assert by_loss["metric"] == "loss"
    assert by_loss["best_trial"] == 1


def test_trials_beyond_the_quota_wait_in_the_queue(
    ann: Caller, admin: Caller, tick: Callable[[], None]
) -> None:
    r = admin.put("/api/v1/admin/quotas/users/ann", json={"max_gpus": 1})
    assert r.status_code == 200, r.text
    task = {"run": "python train.py", "gpu": "A100-80GB:1"}  # two free A100s, a quota of one
    sweep = _create(ann, task=task, space={"grid": {"lr": ["0.1", "0.01"]}})
    tick()
    shown = ann.get(f"/api/v1/sweeps/{sweep['id']}").json()
    first, second = shown["trials"]
    assert first["instance_status"] == "starting"
    assert second["instance_status"] == "queued"
    assert "quota" in second["status"], second["status"]
