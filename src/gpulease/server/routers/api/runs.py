"""Runs and their logs: pages for scripts, a server-sent event stream for people."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from gpulease.schemas.runs import LogChunkPublic, LogPage, RunPublic
from gpulease.server.routers.deps import current_user, tx
from gpulease.server.services import runs

router = APIRouter(tags=["runs"])
KEEPALIVE_S = 15.0  # below the 60 s idle cut of common proxies


@router.get("/runs")
def list_runs(request: Request, instance_id: int | None = None) -> list[RunPublic]:
    with tx(request) as session:
        user = current_user(session, request)
        return [RunPublic.model_validate(r) for r in runs.list_runs(session, user, instance_id)]


@router.get("/runs/{run_id}")
def show_run(run_id: int, request: Request) -> RunPublic:
    with tx(request) as session:
        user = current_user(session, request)
        return RunPublic.model_validate(runs.get_run(session, user, run_id))


@router.get("/runs/{run_id}/logs")
def read_logs(run_id: int, request: Request, after: int = -1, limit: int = 1000) -> LogPage:
    with tx(request) as session:
        user = current_user(session, request)
        run = runs.get_run(session, user, run_id)
        chunks = runs.read_logs(session, run, after, min(max(limit, 1), 5000))
        return LogPage(
            run=RunPublic.model_validate(run),
            chunks=[LogChunkPublic.model_validate(c) for c in chunks],
            next_after=chunks[-1].seq if chunks else after,
        )


@router.get("/runs/{run_id}/logs/stream")
async def stream_logs(run_id: int, request: Request, after: int = -1) -> StreamingResponse:
    """Server-sent events: `log` for each chunk, `status` when it changes, `end` at the end."""

    def _page(after: int) -> tuple[list[LogChunkPublic], RunPublic]:
        with tx(request) as session:
            user = current_user(session, request)
            run = runs.get_run(session, user, run_id)
            chunks = runs.read_logs(session, run, after, 2000)
            return [LogChunkPublic.model_validate(c) for c in chunks], RunPublic.model_validate(run)

    first = await run_in_threadpool(_page, after)  # 401/404 before the stream starts
    signals = request.app.state.signals

    async def events() -> AsyncIterator[str]:
        nonlocal after
        chunks, run = first
        last_status = None
        quiet_since = time.monotonic()
        while True:
            if chunks:
                quiet_since = time.monotonic()
            for c in chunks:
                after = c.seq
                yield f"event: log\ndata: {c.model_dump_json()}\n\n"
            if run.status != last_status:
                last_status = run.status
                yield f"event: status\ndata: {run.model_dump_json()}\n\n"
            if run.status in ("succeeded", "failed") and not chunks:
                end = json.dumps({"status": run.status, "exit_code": run.exit_code})
                yield f"event: end\ndata: {end}\n\n"
                return
            if not chunks:
                if await request.is_disconnected():
                    return
                await signals.logs.wait(0.5)
                if time.monotonic() - quiet_since > KEEPALIVE_S:
                    quiet_since = time.monotonic()
                    yield ": keep-alive\n\n"
            chunks, run = await run_in_threadpool(_page, after)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
