"""Runs and their logs, page by page, and exec: a run created and followed in one request.
The live view of a run (logs, metrics, status) is its one event stream, GET
/runs/{id}/stream (routers/api/metrics.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from gpulease.schemas.runs import ExecStarted, LogChunkPublic, LogPage, RunCreate, RunPublic
from gpulease.server.routers.api.metrics import SSE_HEADERS, stream_run
from gpulease.server.routers.deps import (
    CurrentUser,
    IdPath,
    IdQuery,
    SessionDep,
    current_user,
    tx,
)
from gpulease.server.services import runs
from gpulease.server.services.instances import lifecycle

router = APIRouter(tags=["runs"])
MAX_LOG_PAGE = 5000


@router.get("/runs")
def list_runs(
    session: SessionDep, user: CurrentUser, instance_id: IdQuery | None = None
) -> list[RunPublic]:
    return [RunPublic.model_validate(r) for r in runs.list_runs(session, user, instance_id)]


@router.get("/runs/{run_id}")
def show_run(run_id: IdPath, session: SessionDep, user: CurrentUser) -> RunPublic:
    return RunPublic.model_validate(runs.get_run(session, user, run_id))


@router.get("/runs/{run_id}/logs")
def read_logs(
    run_id: IdPath, session: SessionDep, user: CurrentUser, after: int = -1, limit: int = 1000
) -> LogPage:
    """Chunks with seq > after, at most `limit` (1 to 5000); `next_after` pages on."""
    run = runs.get_run(session, user, run_id)
    chunks = runs.read_logs(session, run, after, min(max(limit, 1), MAX_LOG_PAGE))
    return LogPage(
        run=RunPublic.model_validate(run),
        chunks=[LogChunkPublic.model_validate(c) for c in chunks],
        next_after=chunks[-1].seq if chunks else after,
    )


@router.post("/instances/{ref}/exec")
async def exec_run(ref: str, body: RunCreate, request: Request) -> StreamingResponse:
    """Run body.command in the instance and follow it in the answer: the events of GET
    /runs/{id}/stream without metric points, after a first `run` event (ExecStarted: the
    run and its instance's status; its id `-1:0`, the position before everything). A
    client that loses the answer resumes with GET /runs/{id}/stream from the last id it
    got, never by posting again. Refusals (no such instance, a released one, a bad body)
    come before the stream, as for POST /instances/{ref}/runs."""

    def create() -> ExecStarted:
        with tx(request) as session:
            instance = lifecycle.get_instance(session, current_user(session, request), ref)
            run = runs.create_requested_run(session, instance, body)
            return ExecStarted(run=RunPublic.model_validate(run), instance_status=instance.status)

    started = await run_in_threadpool(create)  # committed: the runner's long poll has it
    request.app.state.signals.runs.fire()
    events = await stream_run(started.run.id, request, with_metrics=False)

    async def answer() -> AsyncIterator[str | bytes | memoryview]:
        yield f"id: -1:0\nevent: run\ndata: {started.model_dump_json()}\n\n"
        async for message in events.body_iterator:
            yield message

    return StreamingResponse(answer(), media_type="text/event-stream", headers=SSE_HEADERS)
