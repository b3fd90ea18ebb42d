"""The SDK's metrics methods and `gpulease metrics`, against the in-process server."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from factories import Caller, RunnerDouble
from gpulease.cli import connection
from gpulease.cli.main import app
from gpulease.client import ApiError, EndEvent, GpuleaseClient, LogEvent, StatusEvent
from gpulease.client.runstream import MetricEvent


def _finished_run(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> tuple[int, int]:
    instance_id = int(ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()["id"])
    tick()
    runner = runner_for(instance_id)
    runner.ready()
    run_id = int(
        ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "x"}).json()["id"]
    )
    points = [
        {"key": k, "step": s, "value": v * (s + 1), "time": 1.7e9 + s}
        for s in range(3)
        for k, v in (("loss", 1.0), ("acc", 0.25))
    ]
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
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
    monkeypatch.setattr(
        connection,
        "logged_in_client",
        lambda: GpuleaseClient("http://testserver", ann.token, http=ann.http),
    )
    runner = CliRunner()
    table = runner.invoke(app, ["metrics", str(run_id)])
    assert table.exit_code == 0, table.output
    rows = [line.split() for line in table.stdout.splitlines() if line.startswith("│ ")]
    cells = [[c for c in row if c != "│"] for row in rows]
    assert ["acc", "2", "0.75", "0.25", "0.75", "3"] in cells
    assert ["loss", "2", "3", "1", "3", "3"] in cells
    as_json = runner.invoke(app, ["metrics", str(run_id), "--key", "loss", "-o", "json"])
    assert json.loads(as_json.stdout)["series"][0]["values"] == [1.0, 2.0, 3.0]
    missing = runner.invoke(app, ["metrics", str(run_id + 100)])
    assert missing.exit_code == 1 and "no run" in missing.stderr
