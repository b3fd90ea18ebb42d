"""The SDK's metrics methods and `gpulease metrics`, against the in-process server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factories import Caller, RunnerDouble
from gpulease.cli import connection
from gpulease.cli.main import app
from gpulease.client import ApiError, EndEvent, GpuleaseClient, LogEvent, StatusEvent
from gpulease.client.runstream import MetricEvent
from gpulease.runner.metrics import SDK_FILE, RunMetrics
from gpulease.schemas.runner import RunnerMetrics


def _started_run(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> tuple[int, int, RunnerDouble]:
    instance_id = int(ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"])
    tick()
    runner = runner_for(instance_id)
    runner.ready()
    run_id = int(
        ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "x"}).json()["id"]
    )
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
    return instance_id, run_id, runner


def _cli_as(ann: Caller, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(
        connection,
        "logged_in_client",
        lambda: GpuleaseClient("http://testserver", ann.token, http=ann.http),
    )
    return CliRunner()


def _cells(output: str) -> list[list[str]]:
    rows = [line.split() for line in output.splitlines() if line.startswith("│ ")]
    return [[c for c in row if c != "│"] for row in rows]


def _finished_run(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> tuple[int, int]:
    instance_id, run_id, runner = _started_run(ann, tick, runner_for)
    points = [
        {"key": k, "step": s, "value": v * (s + 1), "time": 1.7e9 + s}
        for s in range(3)
        for k, v in (("loss", 1.0), ("acc", 0.25))
    ]
    assert (
        runner.call("POST", f"/runs/{run_id}/metrics", json={"points": points}).status_code == 204
    )
    runner.run(run_id, ["epoch 1"], 0)
    return instance_id, run_id


def test_the_sdk_reads_series_events_and_gpus(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, run_id = _finished_run(ann, tick, runner_for)
    client = GpuleaseClient("http://testserver", ann.token, http=ann.http)
    got = client.runs.metrics(run_id, ["loss"], max_points=10)
    assert [s.key for s in got.series] == ["loss"] and got.keys == ["acc", "loss"]
    assert got.series[0].values == [1.0, 2.0, 3.0]
    assert client.runs.metrics_csv(run_id).count("\n") == 7
    events = list(client.runs.stream(run_id))
    assert isinstance(events[0], LogEvent) and events[0].chunk.data == "epoch 1\n"
    metric = [e for e in events if isinstance(e, MetricEvent)]
    assert sorted((p.key, p.step) for e in metric for p in e.points) == sorted(
        (k, s) for s in range(3) for k in ("loss", "acc")
    )
    assert isinstance(events[-2], StatusEvent) and events[-2].run.status == "succeeded"
    assert events[-1] == EndEvent(status="succeeded", exit_code=0)
    later = list(client.runs.stream(run_id, f"0:{got.last_point_id}"))
    assert [type(e) for e in later] == [StatusEvent, EndEvent]
    compared = client.runs.compare([run_id], "acc")
    assert compared.runs[0].series[0].values == [0.25, 0.5, 0.75]
    gpus = client.instances.gpus(instance_id)
    assert [g.simulated for g in gpus.gpus] == [True]
    with pytest.raises(ApiError) as refused:
        client.runs.metrics(run_id + 100)
    assert refused.value.status == 404


def test_the_metrics_command_prints_latest_values(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, run_id = _finished_run(ann, tick, runner_for)
    runner = _cli_as(ann, monkeypatch)
    table = runner.invoke(app, ["metrics", str(run_id)])
    assert table.exit_code == 0, table.output
    cells = _cells(table.stdout)
    assert ["acc", "2", "0.75", "0.25", "0.75", "3"] in cells
    assert ["loss", "2", "3", "1", "3", "3"] in cells
    as_json = runner.invoke(app, ["metrics", str(run_id), "--key", "loss", "-o", "json"])
    assert json.loads(as_json.stdout)["series"][0]["values"] == [1.0, 2.0, 3.0]
    missing = runner.invoke(app, ["metrics", str(run_id + 100)])
    assert missing.exit_code == 1 and "no run" in missing.stderr


def test_a_step_logged_by_the_sdk_and_printed_on_stdout_counts_once(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Training code that calls track.log and prints the same values: the runner reads both
    (its stdout parser and its SDK file reader), the server stores both, and every step is
    one point, with the SDK's value (the printed one is rounded)."""
    _, run_id, runner = _started_run(ann, tick, runner_for)
    metrics = RunMetrics(sdk_file=tmp_path / SDK_FILE, clock=lambda: 1.7e9)
    losses = [0.91234567, 0.61234567, 0.41234567]
    with (tmp_path / SDK_FILE).open("a") as sdk:
        for step, loss in enumerate(losses):
            record = {"step": step, "time": 1.7e9 + step, "values": {"loss": loss}}
            sdk.write(json.dumps(record) + "\n")
            metrics.on_output("stdout", f"step={step} loss={loss:.4f}\n")
    metrics.on_output("stdout", "step=3 loss=0.3000\n")  # printed only
    metrics.close()
    metrics.collect(force=True)
    sent = metrics.unsent()
    assert sorted((p.source, p.step) for p in sent) == [("sdk", s) for s in range(3)] + [
        ("stdout", s) for s in range(4)
    ]
    body = RunnerMetrics(points=list(sent)).model_dump(mode="json")
    assert runner.call("POST", f"/runs/{run_id}/metrics", json=body).status_code == 204

    cli = _cli_as(ann, monkeypatch)
    table = cli.invoke(app, ["metrics", str(run_id)])
    assert table.exit_code == 0, table.output
    assert _cells(table.stdout) == [["loss", "3", "0.3", "0.3", "0.912346", "4"]]
    (loss,) = json.loads(cli.invoke(app, ["metrics", str(run_id), "-o", "json"]).stdout)["series"]
    assert loss["count"] == 4 and loss["raw_count"] == 7
    assert loss["values"] == [*losses, 0.3]  # the SDK's values where it has the step
