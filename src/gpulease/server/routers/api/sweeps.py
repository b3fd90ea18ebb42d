"""Sweeps: start one (its trials' instances and runs), list them, show one with its trials
and best trial, and every trial's curve of one metric for overlaying."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Request

from gpulease.core.errors import InvalidInput
from gpulease.schemas.metrics import RunsCompared
from gpulease.schemas.sweeps import SweepCreate, SweepPublic
from gpulease.server.routers.deps import CurrentUser, IdPath, SessionDep, runtime
from gpulease.server.services import metrics, sweeps
from gpulease.server.services.metrics.points import check_max_points, parse_keys

router = APIRouter(tags=["sweeps"])


@router.post("/sweeps", status_code=201)
def create_sweep(
    body: SweepCreate,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    after: BackgroundTasks,
) -> SweepPublic:
    rt = runtime(request)
    sweep = sweeps.create_sweep(session, user, body, catalog=rt.catalog, settings=rt.settings)
    after.add_task(request.app.state.wake_reconcilers)  # once committed
    return sweeps.view(session, sweep, rt.catalog)


@router.get("/sweeps")
def list_sweeps(session: SessionDep, user: CurrentUser, request: Request) -> list[SweepPublic]:
    """Your sweeps, newest first (at most 100)."""
    catalog = runtime(request).catalog
    return [sweeps.view(session, s, catalog) for s in sweeps.list_sweeps(session, user)]


@router.get("/sweeps/{sweep_id}")
def show_sweep(
    sweep_id: IdPath,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    metric: str | None = None,
) -> SweepPublic:
    """The sweep and its trials; `metric` names the best by another key than the sweep's
    (422 once the sweep has ended without any trial reporting it)."""
    sweep = sweeps.get_sweep(session, user, sweep_id)
    return sweeps.view(session, sweep, runtime(request).catalog, metric)


@router.get("/sweeps/{sweep_id}/curves")
def sweep_curves(
    sweep_id: IdPath,
    session: SessionDep,
    user: CurrentUser,
    key: str | None = None,
    max_points: int = 500,
) -> RunsCompared:
    """Each trial's curve of one key (default: the sweep's metric), in trial order, as
    /runs/compare gives runs' curves."""
    sweep = sweeps.get_sweep(session, user, sweep_id)
    keys = parse_keys(key or sweep.metric or "loss")
    if keys is None or len(keys) != 1:
        raise InvalidInput("name one metric key, e.g. key=val_acc")
    check_max_points(max_points)
    found = sweeps.trial_runs(session, sweep)
    return RunsCompared(
        key=keys[0], runs=[metrics.series(session, run, keys, max_points) for _, run in found]
    )
