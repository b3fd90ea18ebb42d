"""Metric points of runs: ingest through the runner protocol, series, CSV, compare, access."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import delete, select

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.server.db import transaction
from gpulease.server.orm import MetricPoint, Run
from gpulease.server.runtime import Runtime
from gpulease.server.services import metrics
from gpulease.server.services.metrics import PointIn

T0 = 1.7e9


def _running_run(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    gpu: str = "T4:1",
) -> tuple[int, int, RunnerDouble]:
    instance_id, runner = make_running_instance(ann, tick, runner_for, gpu=gpu)
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "python t.py"})
    run_id = int(run.json()["id"])
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
    return instance_id, run_id, runner


def _point(key: str, step: int, value: float, source: str = "sdk") -> dict[str, object]:
    return {"key": key, "step": step, "value": value, "time": T0 + step, "source": source}


def _send(runner: RunnerDouble, run_id: int, points: list[dict[str, object]]) -> None:
    r = runner.call("POST", f"/runs/{run_id}/metrics", json={"points": points})
    assert r.status_code == 204, r.text


def test_a_resent_batch_stores_each_point_once(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    _, run_id, runner = _running_run(ann, tick, runner_for)
    batch = [_point("loss", s, 1.0 / (s + 1)) for s in range(3)] + [_point("val/acc", 2, 0.5)]
    for _ in range(3):
        _send(runner, run_id, batch)
    # the same step from stdout is kept as its own raw point; the chart shows the SDK's
    _send(runner, run_id, [_point("loss", 1, 9.0, "stdout"), _point("loss", 3, 0.2, "stdout")])
    got = ann.get(f"/api/v1/runs/{run_id}/metrics").json()
    assert got["keys"] == ["loss", "val/acc"]
    loss, acc = got["series"]
    assert loss["raw_count"] == 5 and loss["count"] == 4 and not loss["downsampled"]
    assert loss["steps"] == [0, 1, 2, 3]
    assert loss["values"] == [1.0, 0.5, 1.0 / 3, 0.2]
    assert loss["last_step"] == 3 and loss["last_value"] == 0.2
    assert loss["times"][0] == T0
    assert acc["values"] == [0.5]
    only = ann.get(f"/api/v1/runs/{run_id}/metrics", params={"keys": "val/acc"}).json()
    assert [s["key"] for s in only["series"]] == ["val/acc"]
    csv = ann.get(f"/api/v1/runs/{run_id}/metrics.csv")
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0] == "key,step,value,time,source" and len(lines) == 1 + 6
    assert "loss,1,9.0,2023-11-14T22:13:21+00:00,stdout" in lines


def test_bad_points_are_refused_with_what_to_do(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, run_id, runner = _running_run(ann, tick, runner_for)

    def refused(body: object, *, raw: bytes | None = None) -> str:
        kw: dict[str, object] = {"content": raw} if raw is not None else {"json": body}
        if raw is not None:
            kw["headers"] = {
                "Authorization": f"Bearer {runner.token}",
                "Content-Type": "application/json",
            }
            r = runner.http.post(f"/runner/v1/runs/{run_id}/metrics", **kw)  # type: ignore[arg-type]
        else:
            r = runner.call("POST", f"/runs/{run_id}/metrics", **kw)
        assert r.status_code == 422, r.text
        return str(r.json()["detail"])

    assert "starts with a letter" in refused({"points": [_point("bad key", 1, 1.0)]})
    assert "from 0 to" in refused({"points": [_point("loss", -1, 1.0)]})
    assert "one of sdk" in refused({"points": [_point("loss", 1, 1.0, "wandb")]})
    assert "Unix seconds" in refused({"points": [{**_point("loss", 1, 1.0), "time": 5.0}]})
    nan = b'{"points": [{"key": "loss", "step": 1, "value": NaN, "time": 1.7e9}]}'
    assert "leave NaN" in refused(None, raw=nan)
    assert "5000" in refused({"points": [_point("loss", s, 1.0) for s in range(5001)]})
    assert "points.0.value" in refused({"points": [{**_point("loss", 1, 1.0), "value": "x"}]})
    assert "points.0.step" in refused({"points": [{"key": "loss", "value": 1, "time": T0}]})
    assert "invalid batch" in refused(None, raw=b'{"points": [')
    assert "invalid batch" in refused([1, 2])
    # nothing of a refused batch was stored
    assert ann.get(f"/api/v1/runs/{run_id}/metrics").json()["keys"] == []
    bad_query = ann.get(f"/api/v1/runs/{run_id}/metrics", params={"max_points": 1})
    assert bad_query.status_code == 422 and "max_points" in bad_query.json()["detail"]
    # a run of another instance is not this runner's
    other = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).json()["id"]
    tick()
    runner_for(other).ready()
    theirs = ann.post(f"/api/v1/instances/{other}/runs", json={"command": "x"}).json()["id"]
    r = runner.call("POST", f"/runs/{theirs}/metrics", json={"points": [_point("loss", 1, 1)]})
    assert r.status_code == 404
    assert (
        runner.http.post(f"/runner/v1/runs/{run_id}/metrics", json={"points": []}).status_code
        == 401
    )
    assert instance_id != other


def test_points_go_only_to_a_run_of_the_token_and_leave_with_their_run(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    """Without a foreign key on the points, the ingest checks the run itself: an unknown
    token or a run that is not there stores nothing; a batch of known and new points stores
    the new ones; deleting a run deletes its points (a trigger), not another run's."""
    instance_id, run_id, runner = _running_run(ann, tick, runner_for)
    other = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "y"}).json()["id"]
    _send(runner, run_id, [_point("loss", s, 1.0) for s in range(3)])
    _send(runner, other, [_point("loss", 0, 5.0)])
    stranger = RunnerDouble(runner.http, "not-a-runner-token")
    r = stranger.call("POST", f"/runs/{run_id}/metrics", json={"points": [_point("loss", 9, 1)]})
    assert r.status_code == 401 and "unknown runner token" in r.json()["detail"], r.text
    r = runner.call("POST", "/runs/987654/metrics", json={"points": [_point("loss", 9, 1)]})
    assert r.status_code == 404 and "does not belong" in r.json()["detail"], r.text
    _send(runner, run_id, [_point("loss", s, 2.0) for s in range(1, 6)])  # 1, 2 are known
    with transaction(rt.sessions) as session:
        stored = session.execute(
            select(MetricPoint.run_id, MetricPoint.step, MetricPoint.value).order_by(
                MetricPoint.run_id, MetricPoint.step
            )
        ).all()
    mine = [(run_id, s, 1.0) for s in range(3)] + [(run_id, s, 2.0) for s in range(3, 6)]
    assert [tuple(row) for row in stored] == sorted(mine + [(other, 0, 5.0)])
    with transaction(rt.sessions) as session:
        session.execute(delete(Run).where(Run.id == run_id))
    with transaction(rt.sessions) as session:
        left = session.execute(select(MetricPoint.run_id, MetricPoint.step)).all()
    assert [tuple(row) for row in left] == [(other, 0)]


def test_a_batch_is_stored_as_sent_to_the_microsecond(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    """Times are stored as datetime.fromtimestamp rounds them (half to even at the
    microsecond, carried into the second), on both databases; of a batch's repeats of one
    (key, step, source) the first is kept; a point without a source is the SDK's."""
    _, run_id, runner = _running_run(ann, tick, runner_for)
    fractions = [0.0, 1 / 128, 3 / 128, 0.9999996, 0.9999994, 0.1234565, 0.5, 0.000001]
    fractions += [j / 128 for j in range(5, 128, 2)]  # each exactly half a microsecond over
    randomly = random.Random(7)
    fractions += [randomly.random() for _ in range(1000)]
    sent = [T0 + i + f for i, f in enumerate(fractions)]
    sent += [1_700_006_399.9999999, 1_700_006_400.25]  # rounded into the next day; in it
    batch = [_point("loss", i, i / 7, source="stdout") | {"time": t} for i, t in enumerate(sent)]
    batch.append(_point("loss", 0, 99.0, source="stdout"))  # a repeat: not kept
    batch.append({"key": "acc", "step": 3, "value": 1, "time": T0})
    _send(runner, run_id, batch)
    with transaction(rt.sessions) as session:
        rows = session.execute(
            select(MetricPoint.key, MetricPoint.step, MetricPoint.value, MetricPoint.time)
            .where(MetricPoint.run_id == run_id, MetricPoint.key == "loss")
            .order_by(MetricPoint.step)
        ).all()
        acc = session.execute(
            select(MetricPoint.source, MetricPoint.value).where(MetricPoint.key == "acc")
        ).one()
    assert [r.time for r in rows] == [datetime.fromtimestamp(t, UTC) for t in sent]
    assert [r.value for r in rows] == [i / 7 for i in range(len(sent))]
    assert tuple(acc) == ("sdk", 1.0)


def test_a_run_of_100000_points_draws_from_at_most_max_points(
    ann: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
    rt: Runtime,
) -> None:
    _, run_id, runner = _running_run(ann, tick, runner_for)
    values = {s: 1.0 + (s % 97) / 100.0 for s in range(100_000)}
    values[31_337], values[77_777] = -5.0, 42.0  # one dip and one spike of a single step
    _send(runner, run_id, [_point("loss", s, values[s]) for s in range(5000)])
    with transaction(rt.sessions) as session:  # the rest straight through the service
        run = session.get(Run, run_id)
        assert run is not None
        for start in range(5000, 100_000, 5000):
            batch = [PointIn("loss", s, values[s], T0 + s) for s in range(start, start + 5000)]
            assert metrics.ingest_points(session, run, batch) == 5000
    got = ann.get(f"/api/v1/runs/{run_id}/metrics", params={"max_points": 2000}).json()
    (loss,) = got["series"]
    assert loss["raw_count"] == 100_000 and loss["downsampled"]
    assert len(loss["steps"]) <= 2000 and len(loss["values"]) == len(loss["steps"])
    assert loss["steps"] == sorted(loss["steps"])
    assert loss["steps"][0] == 0 and loss["steps"][-1] == 99_999
    assert -5.0 in loss["values"] and 42.0 in loss["values"]
    assert loss["min"] == -5.0 and loss["max"] == 42.0
    assert all(values[s] == v for s, v in zip(loss["steps"], loss["values"], strict=True))
    # the raw points are all kept, exactly
    with transaction(rt.sessions) as session:
        stored = session.execute(
            select(MetricPoint.step, MetricPoint.value).where(MetricPoint.run_id == run_id)
        ).all()
    assert dict(stored) == values


def _events(body: str) -> list[tuple[str | None, str, str]]:
    """(id, event, data) of each SSE message in body."""
    out = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            out.append((fields.get("id"), fields["event"], fields.get("data", "")))
    return out


def test_the_stream_delivers_a_point_logged_after_connecting(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    _, run_id, runner = _running_run(ann, tick, runner_for)
    _send(runner, run_id, [_point("loss", 0, 2.0)])
    seen: list[tuple[str | None, str, str]] = []
    url = f"/api/v1/runs/{run_id}/stream"
    with ann.http.stream("GET", url, headers=ann.headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        buffer = ""
        lines = r.iter_lines()
        sent = False
        for line in lines:
            buffer += line + "\n"
            if line:
                continue
            seen.extend(_events(buffer))
            buffer = ""
            kinds = [e[1] for e in seen]
            if "status" in kinds and not sent:  # connected and caught up: log a new point
                sent = True
                _send(runner, run_id, [_point("loss", 1, 1.5)])
                chunk = {"seq": 0, "stream": "stdout", "data": "epoch 1\n", "time": T0}
                runner.call("POST", f"/runs/{run_id}/logs", json={"chunks": [chunk]})
            if sent and sum(k == "metric" for k in kinds) == 2 and "log" in kinds:
                runner.call("POST", f"/runs/{run_id}/exit", json={"exit_code": 0})
            if kinds and kinds[-1] == "end":
                break
    kinds = [e[1] for e in seen]
    metric_events = [json.loads(d) for _, k, d in seen if k == "metric"]
    assert [p["step"] for e in metric_events for p in e["points"]] == [0, 1]
    assert metric_events[1]["points"][0]["value"] == 1.5
    assert kinds[-1] == "end" and json.loads(seen[-1][2]) == {"status": "succeeded", "exit_code": 0}
    # every event carries the position after it; resuming from one sends only what follows
    after_first = next(i for i, k, _ in seen if k == "metric")
    with ann.http.stream("GET", url, headers={**ann.headers, "Last-Event-ID": after_first}) as r:
        rest = _events(r.read().decode())
    points = [p["step"] for _, k, d in rest if k == "metric" for p in json.loads(d)["points"]]
    assert points == [1]
    assert [k for _, k, _ in rest if k == "log"] == ["log"]
    since = ann.get(url, params={"since": seen[-1][0]}).text
    assert [k for _, k, _ in _events(since)] == ["status", "end"]
    assert ann.get(url, params={"since": "yesterday"}).status_code == 422


def test_compare_overlays_runs_and_refuses_what_is_not_yours(
    ann: Caller,
    bob: Caller,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, first, runner = _running_run(ann, tick, runner_for)
    second = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "y"}).json()["id"]
    _send(runner, first, [_point("loss", s, 1.0 - s / 10) for s in range(5)])
    _send(runner, second, [_point("loss", s, 2.0 - s / 10) for s in range(3)])
    got = ann.get("/api/v1/runs/compare", params={"ids": f"{first},{second}", "key": "loss"})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["key"] == "loss"
    assert [r["run"]["id"] for r in body["runs"]] == [first, second]
    assert [len(r["series"][0]["steps"]) for r in body["runs"]] == [5, 3]
    bad = ann.get("/api/v1/runs/compare", params={"ids": "1,x", "key": "loss"})
    assert bad.status_code == 422 and "ids=4,7,9" in bad.json()["detail"]
    # bob: every run and instance endpoint of ann's is simply not there
    _, bobs_run, _ = _running_run(bob, tick, runner_for, "A100-80GB:1")
    for url, params in (
        ("/api/v1/runs/compare", {"ids": f"{bobs_run},{first}", "key": "loss"}),
        (f"/api/v1/runs/{first}/metrics", {}),
        (f"/api/v1/runs/{first}/metrics.csv", {}),
        (f"/api/v1/runs/{first}/stream", {}),
        (f"/api/v1/instances/{instance_id}/gpus", {}),
        (f"/api/v1/instances/{instance_id}/gpus/stream", {}),
    ):
        r = bob.get(url, params=params)
        assert r.status_code == 404, (url, r.text)
    assert (
        ann.get(f"/api/v1/runs/{first}/metrics")
        .headers.get("content-type", "")
        .startswith("application/json")
    )
