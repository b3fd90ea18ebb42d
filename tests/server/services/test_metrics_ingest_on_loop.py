"""A runner's metric batches on PostgreSQL: stored over the app's pool of async connections
from the event loop (routers/api/metrics.py, services.metrics.store_run_points_on_loop);
SQLite has no such pool and keeps its worker thread. The same answers either way."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select, text
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.server.app import create_app
from gpulease.server.db import ASYNC_APPLICATION_NAME, AsyncPool, transaction
from gpulease.server.orm import MetricPoint
from gpulease.server.runtime import Runtime
from gpulease.server.settings import Settings

T0 = 1.7e9
BACKENDS_OF_THE_POOL = (
    "SELECT pid FROM pg_stat_activity "
    "WHERE application_name = :name AND datname = current_database()"
)


@pytest.fixture
def running(
    ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> tuple[int, RunnerDouble]:
    """A started run of a running instance, and its instance's runner."""
    instance_id, runner = make_running_instance(ann, tick, runner_for)
    run = ann.post(f"/api/v1/instances/{instance_id}/runs", json={"command": "python t.py"})
    run_id = int(run.json()["id"])
    assert runner.call("POST", f"/runs/{run_id}/started", json={"pid": 2}).status_code == 204
    return run_id, runner


def _points(steps: range, value: float = 1.0) -> list[dict[str, object]]:
    return [
        {"key": "loss", "step": s, "value": value, "time": T0 + s, "source": "sdk"} for s in steps
    ]


def _send(runner: RunnerDouble, run_id: int, points: list[dict[str, object]]) -> None:
    r = runner.call("POST", f"/runs/{run_id}/metrics", json={"points": points})
    assert r.status_code == 204, r.text


def _stored(rt: Runtime) -> list[tuple[int, float]]:
    with transaction(rt.sessions) as session:
        rows = session.execute(
            select(MetricPoint.step, MetricPoint.value).order_by(MetricPoint.step)
        ).all()
    return [(int(step), float(value)) for step, value in rows]


def _pool(http: TestClient) -> AsyncPool | None:
    pool: AsyncPool | None = http.app.state.ingest_pool  # type: ignore[attr-defined]
    return pool


def _backends(rt: Runtime) -> list[int]:
    with rt.engine.connect() as conn:
        pids = [
            int(pid)
            for (pid,) in conn.execute(text(BACKENDS_OF_THE_POOL), {"name": ASYNC_APPLICATION_NAME})
        ]
        conn.commit()
    return pids


def test_batches_go_over_the_loops_pool_on_postgres_and_answer_as_before(
    running: tuple[int, RunnerDouble], rt: Runtime, http: TestClient
) -> None:
    """Every answer of the route on both databases: new points, an empty batch, a resent
    batch with new points, an unknown token, a run that is not the token's; on PostgreSQL
    each of those requests took a connection of the loop's pool, on SQLite there is none."""
    run_id, runner = running
    pool = _pool(http)
    postgres = rt.engine.dialect.name == "postgresql"
    assert (pool is not None) is postgres
    asked = pool.get_stats().get("requests_num", 0) if pool else 0
    _send(runner, run_id, _points(range(3)))
    _send(runner, run_id, [])
    _send(runner, run_id, _points(range(1, 5), 2.0))  # 1, 2 are known: those stay 1.0
    stranger = RunnerDouble(runner.http, "not-a-runner-token")
    for batch in ([], _points(range(9, 10))):
        r = stranger.call("POST", f"/runs/{run_id}/metrics", json={"points": batch})
        assert r.status_code == 401 and "unknown runner token" in r.json()["detail"], r.text
        r = runner.call("POST", "/runs/987654/metrics", json={"points": batch})
        assert r.status_code == 404 and "does not belong" in r.json()["detail"], r.text
    assert _stored(rt) == [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    if pool is not None:
        assert pool.get_stats()["requests_num"] - asked == 7


def test_a_batch_that_stored_points_wakes_the_streams_and_one_that_did_not_does_not(
    running: tuple[int, RunnerDouble], http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics signal (which wakes SSE listeners) fires once for each batch that stored
    a point, whichever way it was stored, and not for an empty or wholly resent batch."""
    run_id, runner = running
    fired: list[int] = []
    signal = http.app.state.signals.metrics  # type: ignore[attr-defined]
    monkeypatch.setattr(signal, "fire", lambda: fired.append(1))
    _send(runner, run_id, _points(range(3)))  # new points: the one statement
    assert len(fired) == 1
    _send(runner, run_id, [])
    _send(runner, run_id, _points(range(3)))  # all known: the general way stores none
    assert len(fired) == 1
    _send(runner, run_id, _points(range(2, 5)))  # some known: the general way stores two
    assert len(fired) == 2


def test_extreme_numbers_and_several_keys_and_sources_are_stored_as_sent(
    running: tuple[int, RunnerDouble], rt: Runtime
) -> None:
    """The binary arrays of the PostgreSQL path (and SQLite's rows) carry every number as
    sent: the largest step, the extremes of a double, keys and sources
    interleaved."""
    run_id, runner = running
    sent = [
        ("loss", 2**63 - 1, -1.7976931348623157e308, "sdk"),
        ("val/acc", 0, 5e-324, "stdout"),
        ("loss", 7, -2.5e-300, "tensorboard"),
        ("a.b-c_d/E9", 1, 1 / 3, "sdk"),
    ]
    points = [
        {"key": k, "step": s, "value": v, "time": T0 + i / 3, "source": src}
        for i, (k, s, v, src) in enumerate(sent)
    ]
    _send(runner, run_id, points)
    with transaction(rt.sessions) as session:
        rows = session.execute(
            select(MetricPoint.key, MetricPoint.step, MetricPoint.value, MetricPoint.source)
        ).all()
    assert sorted(tuple(r) for r in rows) == sorted(sent)


def test_a_pooled_connection_whose_backend_was_terminated_is_replaced(
    running: tuple[int, RunnerDouble], rt: Runtime, http: TestClient
) -> None:
    """PostgreSQL ends the pool's backends (as a restart does): the next batch meets a dead
    connection, which the pool throws away, and is stored once over a new one."""
    if rt.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no pool of async connections: its batches use worker threads")
    run_id, runner = running
    _send(runner, run_id, _points(range(2)))
    pool = _pool(http)
    assert pool is not None
    killed = _backends(rt)
    assert killed
    with rt.engine.connect() as conn:
        for pid in killed:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        conn.commit()
    while set(killed) & set(_backends(rt)):  # pg_terminate_backend only signals it
        pass
    _send(runner, run_id, _points(range(2, 4)))
    _send(runner, run_id, [])
    assert _stored(rt) == [(s, 1.0) for s in range(4)]
    assert pool.get_stats().get("returns_bad", 0) >= 1  # the dead one was met and dropped
    alive = _backends(rt)
    assert alive and not set(alive) & set(killed)


def test_the_pool_is_opened_and_closed_with_the_server(settings: Settings, rt: Runtime) -> None:
    app = create_app(settings, runtime=rt, reconcilers=False)
    with TestClient(app):
        pool: AsyncPool | None = app.state.ingest_pool
        if rt.engine.dialect.name != "postgresql":
            assert pool is None
            return
        assert pool is not None and not pool.closed
        assert _backends(rt)  # opened: its first connection is there
    assert pool.closed and app.state.ingest_pool is None
    while _backends(rt):  # closed: each backend ends once its connection is closed
        pass
