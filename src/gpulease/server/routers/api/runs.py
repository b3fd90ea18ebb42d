"""Runs and their logs, page by page. The live view of a run (logs, metrics, status) is
its one event stream, GET /runs/{id}/stream (routers/api/metrics.py)."""

from __future__ import annotations

from fastapi import APIRouter

from gpulease.schemas.runs import LogChunkPublic, LogPage, RunPublic
from gpulease.server.routers.deps import CurrentUser, IdPath, IdQuery, SessionDep
from gpulease.server.services import runs

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
