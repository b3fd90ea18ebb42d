"""client.runs.stream(): the one live view of a run, against the real app in process."""

from __future__ import annotations

from typing import Any

import pytest
from inprocess import InProcessServer

from gpulease.client import ApiError, EndEvent, LogEvent, MetricEvent, StatusEvent, position
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.runs import RunCreate

REPORTED_AT = 1_790_000_000.0  # a fixed moment (2026) for the points the job reports


def _finished_run_with_metrics(server: InProcessServer) -> int:
    """A run that printed one line and reported three loss points, then succeeded."""
    ann = server.user()
    ann.instances.create(InstanceCreate(gpu="T4:1", name="box"))

    def job(run: dict[str, Any]) -> tuple[list[tuple[str, str]], int]:
        (runner,) = [r for r in server.backend.runners.values() if r.alive]
        points = [
            {"key": "loss", "step": s, "value": 1 / (s + 1), "time": REPORTED_AT} for s in range(3)
        ]
        path = f"/runs/{run['id']}/metrics"
        answer = server.cluster._call("POST", path, runner.spec.token, json={"points": points})
        assert answer.status_code == 204, answer.text
        return [("stdout", "epoch 1\n")], 0

    server.cluster.job = job
    run = ann.runs.create("box", RunCreate(command="python train.py"))
    server.cluster.start()
    server.cluster.wait_for(lambda: ann.runs.get(run.id).status == "succeeded")
    return run.id


def test_the_stream_carries_logs_metrics_and_status_and_leaves_out_what_is_not_asked_for(
    server: InProcessServer,
) -> None:
    run_id = _finished_run_with_metrics(server)
    ann = server.user()

    everything = list(ann.runs.stream(run_id))
    assert [e.chunk.data for e in everything if isinstance(e, LogEvent)] == ["epoch 1\n"]
    points = [p for e in everything if isinstance(e, MetricEvent) for p in e.points]
    assert [(p.key, p.step) for p in points] == [("loss", 0), ("loss", 1), ("loss", 2)]
    assert [e.run.status for e in everything if isinstance(e, StatusEvent)] == ["succeeded"]
    assert everything[-1] == EndEvent("succeeded", 0)

    logs_only = list(ann.runs.stream(run_id, metrics=False))
    assert [type(e) for e in logs_only] == [LogEvent, StatusEvent, EndEvent]
    metrics_only = list(ann.runs.stream(run_id, logs=False))
    assert [type(e) for e in metrics_only] == [MetricEvent, StatusEvent, EndEvent]

    # From a position after everything: only where the run stands.
    after_all = list(ann.runs.stream(run_id, position(0, points[-1].id)))
    assert [type(e) for e in after_all] == [StatusEvent, EndEvent]


def test_the_stream_refuses_other_users_bad_positions_and_the_old_log_route(
    server: InProcessServer,
) -> None:
    run_id = _finished_run_with_metrics(server)
    bob = server.user("bob")
    with pytest.raises(ApiError) as hidden:
        list(bob.runs.stream(run_id))
    assert hidden.value.status == 404

    ann = server.user()
    with pytest.raises(ApiError, match="LOG_SEQ:POINT_ID") as bad:
        list(ann.runs.stream(run_id, "yesterday"))
    assert bad.value.status == 422

    headers = {"Authorization": f"Bearer {ann.token}"}
    gone = server.http.get(f"/api/v1/runs/{run_id}/logs/stream", headers=headers)
    assert gone.status_code == 404
