"""`gpulease sweep` end to end on the in-process server: the trials run as instances of the
task (one waiting in the queue for the only T4), their values reach the job, the best trial
is named; sweep ls and show; bad input and another user's sweep."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from inprocess import tar_members
from wired_cli import Cli

from gpulease.cli import sweeps
from gpulease.server.orm import Run

TASK = """\
name: tune
resources:
  accelerators: T4:1
workdir: .
envs:
  EPOCHS: "3"
run: python train.py --lr ${lr}
"""


def _task(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "task.yaml").write_text(TASK)
    (project / "train.py").write_text("print('training')\n")
    return project / "task.yaml"


def _reporting_job(cli: Cli):  # type: ignore[no-untyped-def]
    """A job that reports val_acc = 10 × its LR at steps 1..3 over the runner protocol,
    as the runner does for `track.log`, then exits 0."""
    server = cli.server

    def job(run: dict[str, Any]) -> tuple[list[tuple[str, str]], int]:
        with server.rt.sessions() as session:
            row = session.get(Run, run["id"])
            assert row is not None
            instance_id = row.instance_id
        handle = server.backend.handle_for(instance_id)
        assert handle is not None
        token = server.backend.runners[handle].spec.token
        lr = float(run["env"]["LR"])
        points = [
            {"key": "val_acc", "step": s, "value": lr * 10 * s / 3, "time": time.time()}
            for s in (1, 2, 3)
        ]
        answer = server.http.post(
            f"/runner/v1/runs/{run['id']}/metrics",
            json={"points": points},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 204, answer.text
        return [("stdout", f"lr {lr}\n")], 0

    return job


def test_sweep_runs_each_trial_and_names_the_best(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweeps, "POLL_INTERVAL_S", 0.05)
    ann = cli.login_as("ann")
    cli.server.cluster.job = _reporting_job(cli)
    cli.server.cluster.start()
    task = str(_task(tmp_path))
    options = ("--grid", "lr=0.01,0.05", "--metric", "val_acc", "--max-duration", "30m")
    result = cli("sweep", task, *options)
    assert result.exit_code == 0, result.output
    # a T4 is $0.25/h in the catalog: 2 trials × 30 min = $0.25
    assert "sweep 1: 2 trials on T4:1 each, estimated $0.2500 in all" in result.stderr
    assert "workdir uploaded to 2 trials" in result.stderr
    assert "trial 2 (lr=0.05): succeeded" in result.stderr
    assert "best: trial 2 (lr=0.05), val_acc 0.5 (max)" in result.stdout
    # each trial: its own instance, its value in the command and as LR, the workdir
    commands = sorted(run["command"] for run in cli.server.cluster.runs)
    assert [
        c.endswith(f"python train.py --lr {lr}' run")
        for c, lr in zip(commands, ("0.01", "0.05"), strict=True)
    ] == [True, True]
    assert sorted(run["env"]["LR"] for run in cli.server.cluster.runs) == ["0.01", "0.05"]
    assert all(run["env"]["EPOCHS"] == "3" for run in cli.server.cluster.runs)
    instances = ann.instances.list(include_released=True)
    assert sorted(i.name for i in instances) == ["sweep-1-1", "sweep-1-2"]
    for instance in instances:
        members = tar_members(cli.server.cluster.workdirs[instance.id] or b"")
        assert members["train.py"] == b"print('training')\n"
    listing = cli("sweep", "ls")
    assert listing.exit_code == 0
    assert "2 succeeded" in listing.stdout and "val_acc (max)" in listing.stdout
    shown = cli("sweep", "show", "1", "-o", "json")
    assert json.loads(shown.stdout)["best_trial"] == 2
    by_min = cli("sweep", "show", "1", "--metric", "val_acc")
    assert by_min.exit_code == 0 and "ended: 2 succeeded" in by_min.stdout


def test_sweep_refusals(cli: Cli, tmp_path: Path) -> None:
    cli.login_as("ann")
    task = str(_task(tmp_path))
    cases = [
        (["--grid", "lr"], "write NAME=V1,V2"),
        (["--range", "lr=1:0"], "low end must be below"),
        (["--random", "3", "--range", "lr=0:1:cubic"], "not one of linear, log, int"),
        ([], "0 trials"),
        (
            [
                "--grid",
                "a=" + ",".join(map(str, range(50))),
                "--grid",
                "b=" + ",".join(map(str, range(30))),
            ],
            "1,500 trials, above the limit",
        ),
        (["--grid", "lr=1", "--max", "--min"], "--max or --min"),
    ]
    for options, says in cases:
        result = cli("sweep", task, *options)
        assert result.exit_code == 2, (options, result.output)
        assert says in result.stderr, (options, result.stderr)
    assert cli.server.user("ann").instances.list() == []


def test_a_command_sweep_and_another_users_sweep(cli: Cli) -> None:
    ann = cli.login_as("ann")
    started = cli("sweep", "--grid", "lr=0.1", "--detach", "--", "python train.py --lr ${lr}")
    assert started.exit_code == 0, started.output
    assert "gpulease sweep show 1" in started.stderr
    (run,) = ann.runs.list()
    assert run.command == "python train.py --lr 0.1"
    cli.login_as("bob")
    result = cli("sweep", "show", "1")
    assert result.exit_code == 1
    assert "you have no sweep 1" in result.stderr
    listing = cli("sweep", "ls")
    assert "no sweeps yet" in listing.stderr + listing.stdout
