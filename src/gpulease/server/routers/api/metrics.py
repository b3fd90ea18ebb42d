"""Metric points and GPU samples: the runner's ingest, series, CSV, live streams, heat map.

Event streams (text/event-stream) send a keep-alive comment every ~15 s when idle, wake on
the server's signals and re-read the database at least every second (replicas converge).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, FastAPI, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from gpulease.core.errors import InvalidInput
from gpulease.core.ids import MAX_ID, parse_id
from gpulease.schemas.metrics import (
    GpuHeatmap,
    GpuSamplePublic,
    InstanceGpus,
    MetricPointPublic,
    RunMetrics,
    RunsCompared,
)
from gpulease.schemas.runner import RUNNER_API, RunnerGpuSamples, RunnerMetrics
from gpulease.schemas.runs import LogChunkPublic, RunPublic
from gpulease.server.db import AsyncPool, async_pool
from gpulease.server.routers.deps import (
    AdminUser,
    CurrentUser,
    IdPath,
    RunnerInstance,
    SessionDep,
    current_user,
    runner_token,
    runtime,
    tx,
)
from gpulease.server.runtime import Runtime
from gpulease.server.services import metrics, runs
from gpulease.server.services.instances import lifecycle
from gpulease.server.services.metrics.points import check_max_points, parse_keys
from gpulease.server.signals import Broadcast


@asynccontextmanager
async def _ingest_pool(app: FastAPI) -> AsyncIterator[None]:
    """On PostgreSQL, the pool of async connections that runner batches are stored over from
    the event loop (app.state.ingest_pool), opened in the server's loop once the runtime is
    there (the app's own lifespan, which this one runs inside) and closed at shutdown,
    before the engine is disposed. SQLite: none (its batches go to a worker thread)."""
    rt = app.state.runtime
    pool = None
    if isinstance(rt, Runtime) and rt.engine.dialect.name == "postgresql":
        pool = async_pool(rt.engine)
        await pool.open(wait=True)  # fails the start if the database cannot be reached
    app.state.ingest_pool = pool
    try:
        yield
    finally:
        app.state.ingest_pool = None
        if pool is not None:
            await pool.close()


router = APIRouter(tags=["metrics"])
runner_router = APIRouter(prefix=RUNNER_API, tags=["runner"], lifespan=_ingest_pool)
KEEPALIVE_S = 15.0
REREAD_S = 1.0
MAX_COMPARE = 10
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# -- runner ingest -----------------------------------------------------------------------


@runner_router.post(
    "/runs/{run_id}/metrics",
    status_code=204,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RunnerMetrics.model_json_schema()}},
        }
    },
)
async def runner_metrics(run_id: IdPath, request: Request) -> Response:
    """A runner's batch, a RunnerMetrics, checked straight from its JSON bytes in one pass (a
    batch is up to thousands of points; a model object per point costs more than storing it).

    PostgreSQL: parsed and stored on the event loop itself, the one statement awaited over
    the app's pool of async connections (services.metrics.store_run_points_on_loop); only a
    batch that statement does not answer (a wrong token or run, a resent point) goes to a
    worker thread. SQLite: parsed and stored in one hop to a worker thread. Either way no
    sync dependency or background task, each of which would be a hop of its own (about a
    millisecond each on a loaded host)."""
    token = runner_token(request)  # 401 before the body is read
    raw = await request.body()
    sessions = runtime(request).unsynced_sessions
    pool: AsyncPool | None = getattr(request.app.state, "ingest_pool", None)
    if pool is None:
        stored = await run_in_threadpool(_store_batch, sessions, token, run_id, raw)
    else:
        points = metrics.parse_points(raw)
        on_loop = await metrics.store_run_points_on_loop(pool, token, run_id, points)
        if on_loop is None:
            on_loop = await run_in_threadpool(
                metrics.store_run_points, sessions, token, run_id, points
            )
        stored = on_loop
    if stored:
        request.app.state.signals.metrics.fire()  # committed already
    return Response(status_code=204)


def _store_batch(sessions: sessionmaker[Session], token: str, run_id: int, raw: bytes) -> int:
    return metrics.store_run_points(sessions, token, run_id, metrics.parse_points(raw))


@runner_router.post("/gpu-samples", status_code=204)
def runner_gpu_samples(
    body: RunnerGpuSamples,
    session: SessionDep,
    instance: RunnerInstance,
    request: Request,
    after: BackgroundTasks,
) -> Response:
    readings = [metrics.GpuReadingIn(**s.model_dump()) for s in body.samples]
    if metrics.ingest_instance_samples(session, instance, readings):
        after.add_task(request.app.state.signals.gpu.fire)  # once committed
    return Response(status_code=204)


# -- series and CSV ----------------------------------------------------------------------


@router.get("/runs/compare")
def compare_runs(
    session: SessionDep, user: CurrentUser, ids: str, key: str = "loss", max_points: int = 1000
) -> RunsCompared:
    """Each run's curve of one key, for overlaying: {"key", "runs": [RunMetrics, ...]} in
    the order of ids. Any id that is not one of the caller's runs answers 404."""
    parsed = [parse_id(part.strip()) for part in ids.split(",") if part.strip()]
    run_ids = [run_id for run_id in parsed if run_id is not None]
    if len(run_ids) != len(parsed):
        raise InvalidInput("ids must be run ids separated by commas, e.g. ids=4,7,9")
    if not 1 <= len(run_ids) <= MAX_COMPARE:
        raise InvalidInput(f"compare 1 to {MAX_COMPARE} runs: ids=4,7,9")
    keys = parse_keys(key)
    if keys is None or len(keys) != 1:
        raise InvalidInput("name one metric key to compare, e.g. key=loss")
    check_max_points(max_points)
    found = [runs.get_run(session, user, run_id) for run_id in run_ids]
    return RunsCompared(
        key=keys[0], runs=[metrics.series(session, run, keys, max_points) for run in found]
    )


@router.get("/runs/{run_id}/metrics")
def run_metrics(
    run_id: IdPath,
    session: SessionDep,
    user: CurrentUser,
    keys: str | None = None,
    max_points: int = 2000,
) -> RunMetrics:
    """The run's curves, each at most max_points (see services.metrics.series)."""
    wanted = parse_keys(keys)
    return metrics.series(session, runs.get_run(session, user, run_id), wanted, max_points)


@router.get("/runs/{run_id}/metrics.csv")
def run_metrics_csv(run_id: IdPath, session: SessionDep, user: CurrentUser) -> Response:
    """Every raw point: key,step,value,time,source (time in ISO 8601 UTC)."""
    body = "".join(metrics.points_csv(session, runs.get_run(session, user, run_id)))
    return Response(
        body,
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="run-{run_id}-metrics.csv"'},
    )


# -- live streams ------------------------------------------------------------------------


async def _wait_any(broadcasts: list[Broadcast], timeout: float) -> None:
    waits = [asyncio.create_task(b.wait(timeout)) for b in broadcasts]
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


def _parse_cursor(text: str) -> tuple[int, int]:
    log_seq, sep, point_id = text.strip().partition(":")
    try:
        if not sep or not (log_seq.isascii() and point_id.isascii()):
            raise ValueError
        cursor = int(log_seq), int(point_id)
        if not (-1 <= cursor[0] <= MAX_ID and 0 <= cursor[1] <= MAX_ID):
            raise ValueError
        return cursor
    except ValueError:
        raise InvalidInput(
            f"since {text!r} is not a stream position: give LOG_SEQ:POINT_ID as in the "
            "events' ids (-1:0 for everything)"
        ) from None


def _event(kind: str, data: str, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {data}\n\n"


async def _keepalive_loop(
    request: Request,
    read: Callable[[], Any],
    emit: Callable[[Any], tuple[list[str], bool]],
    broadcasts: list[Broadcast],
    first: Any,
) -> AsyncIterator[str]:
    """Yield emit(batch) until emit says the stream is over or the client left; between
    batches that brought nothing, wait for a signal (at most REREAD_S) and re-read."""
    batch = first
    quiet_since = time.monotonic()
    while True:
        messages, done = emit(batch)
        for message in messages:
            yield message
        if done:
            return
        if messages:
            quiet_since = time.monotonic()
        else:
            if await request.is_disconnected():
                return
            await _wait_any(broadcasts, REREAD_S)
            if time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keep-alive\n\n"
        batch = await run_in_threadpool(read)


@router.get("/runs/{run_id}/stream")
async def stream_run(
    run_id: IdPath,
    request: Request,
    since: str = "-1:0",
    keys: str | None = None,
    logs: bool = True,
    with_metrics: Annotated[bool, Query(alias="metrics")] = True,
) -> StreamingResponse:
    """Server-sent events of a run, from the position `since` (or the Last-Event-ID header,
    which wins): LOG_SEQ:POINT_ID, "-1:0" for everything. Every event's id is the position
    after it, so a reconnect resumes without loss or repeats. Events:

    - `status`: RunPublic JSON, first and whenever the status changes;
    - `log`: LogChunkPublic JSON (seq, stream, data, time), one per chunk (unless logs=false);
    - `metric`: {"points": [{"id", "key", "step", "value", "time", "source"}, ...]}, the
      points stored since the last event (only `keys` when given; none with metrics=false);
    - `end`: {"status", "exit_code"} once the run is over and everything was sent.
    """
    log_after, point_after = _parse_cursor(request.headers.get("last-event-id") or since)
    wanted = parse_keys(keys)

    def read() -> tuple[list[LogChunkPublic], list[MetricPointPublic], RunPublic]:
        # a stream outlives any one transaction: each read is its own and checks the
        # caller's token again, so a revoked token ends the stream
        with tx(request) as session:
            user = current_user(session, request)
            run = runs.get_run(session, user, run_id)
            chunks = runs.read_logs(session, run, log_after, 2000) if logs else []
            points = []
            if with_metrics:
                points = metrics.points_after(session, run, point_after, 5000, wanted)
            return (
                [LogChunkPublic.model_validate(c) for c in chunks],
                points,
                RunPublic.model_validate(run),
            )

    first = await run_in_threadpool(read)  # 401/404 before the stream starts
    last_status: list[str | None] = [None]

    def emit(
        batch: tuple[list[LogChunkPublic], list[MetricPointPublic], RunPublic],
    ) -> tuple[list[str], bool]:
        nonlocal log_after, point_after
        chunks, points, run = batch
        out = []
        for c in chunks:
            log_after = c.seq
            out.append(_event("log", c.model_dump_json(), f"{log_after}:{point_after}"))
        if points:
            point_after = points[-1].id
            data = json.dumps({"points": [p.model_dump() for p in points]})
            out.append(_event("metric", data, f"{log_after}:{point_after}"))
        if run.status != last_status[0]:
            last_status[0] = run.status
            out.append(_event("status", run.model_dump_json(), f"{log_after}:{point_after}"))
        if run.status in ("succeeded", "failed") and not chunks and not points:
            end = json.dumps({"status": run.status, "exit_code": run.exit_code})
            out.append(_event("end", end, f"{log_after}:{point_after}"))
            return out, True
        return out, False

    signals = request.app.state.signals
    return StreamingResponse(
        _keepalive_loop(request, read, emit, [signals.logs, signals.metrics], first),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


# -- GPUs --------------------------------------------------------------------------------


@router.get("/instances/{ref}/gpus")
def instance_gpus(
    ref: str, session: SessionDep, user: CurrentUser, minutes: int = 15, max_points: int = 300
) -> InstanceGpus:
    """The instance's GPUs: newest sample and the last `minutes` of readings for each
    (simulated ones flagged, without readings). See services.metrics.instance_gpus."""
    if not 10 <= max_points <= 5000:
        raise InvalidInput("max_points must be from 10 to 5000")
    instance = lifecycle.get_instance(session, user, ref)
    return metrics.instance_gpus(session, instance, minutes, max_points)


@router.get("/instances/{ref}/gpus/stream")
async def stream_instance_gpus(ref: str, request: Request, since: int = -1) -> StreamingResponse:
    """Server-sent events `sample`: {"samples": [GpuSamplePublic, ...]} for each batch of new
    samples of the instance's GPUs; the event id is the last sample's id (resume with the
    Last-Event-ID header or since=ID; -1: from now on, 0: everything kept)."""
    header = request.headers.get("last-event-id")
    after = since
    if header:
        parsed = 0 if header == "0" else parse_id(header)
        if parsed is None:
            raise InvalidInput("Last-Event-ID must be a sample id as sent in the events")
        after = parsed
    if not -1 <= after <= MAX_ID:
        raise InvalidInput("since must be a sample id as sent in the events, or -1 (from now on)")

    def read() -> list[GpuSamplePublic]:
        nonlocal after
        with tx(request) as session:
            user = current_user(session, request)
            instance = lifecycle.get_instance(session, user, ref)
            if after < 0:
                after = metrics.last_instance_sample_id(session, instance)
                return []
            return metrics.instance_samples_after(session, instance, after)

    first = await run_in_threadpool(read)

    def emit(samples: list[GpuSamplePublic]) -> tuple[list[str], bool]:
        nonlocal after
        if not samples:
            return [], False
        after = samples[-1].id
        data = json.dumps({"samples": [s.model_dump() for s in samples]})
        return [_event("sample", data, str(after))], False

    return StreamingResponse(
        _keepalive_loop(request, read, emit, [request.app.state.signals.gpu], first),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


@router.get("/admin/gpu-heatmap")
def gpu_heatmap(
    session: SessionDep, _: AdminUser, minutes: int = 60, bucket_s: int = 60
) -> GpuHeatmap:
    """Mean GPU utilisation per node × GPU × time bucket (admins only); see
    services.metrics.gpu_heatmap for the shape."""
    return metrics.gpu_heatmap(session, minutes, bucket_s)
