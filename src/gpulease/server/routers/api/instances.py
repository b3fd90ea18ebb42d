"""Instances: create, list, show, stop, start, release, upload a workdir, exec a run."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, BackgroundTasks, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gpulease.schemas.instances import InstanceCreate, InstancePublic, InstanceStart
from gpulease.schemas.runs import RunCreate, RunPublic
from gpulease.server.orm import Instance, User
from gpulease.server.routers.api import autostop as autostop_api
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.deps import CurrentUser, DetachedUser, SessionDep, runtime
from gpulease.server.services import runs
from gpulease.server.services.instances import gangs, lifecycle, opening, workdir

router = APIRouter(tags=["instances"])


def _public(request: Request, session: Session, instance: Instance) -> InstancePublic:
    positions = lifecycle.queue_position_map(session)
    return instance_public(session, instance, runtime(request).catalog, positions)


def _wake_after_commit(request: Request, after: BackgroundTasks) -> None:
    """Wake the reconcilers once the request's transaction has committed (background tasks
    run after the response, and so after SessionDep's commit), so they see the change."""
    after.add_task(request.app.state.wake_reconcilers)


@router.post("/instances", status_code=201)
def create_instance(
    body: InstanceCreate,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    after: BackgroundTasks,
) -> InstancePublic:
    rt = runtime(request)
    if body.num_nodes > 1:  # a gang: every member is created, rank 0 is returned
        instance = gangs.open_gang(session, user, body, catalog=rt.catalog, settings=rt.settings)[0]
    else:
        instance = opening.open_instance(
            session, user, body, catalog=rt.catalog, settings=rt.settings
        )
    _wake_after_commit(request, after)
    return _public(request, session, instance)


@router.get("/instances")
def list_instances(
    session: SessionDep, user: CurrentUser, request: Request, all: bool = False
) -> list[InstancePublic]:
    positions = lifecycle.queue_position_map(session)
    catalog = runtime(request).catalog
    return [
        instance_public(session, i, catalog, positions)
        for i in lifecycle.list_instances(session, user, include_released=all)
    ]


@router.get("/instances/{ref}")
def show_instance(
    ref: str, session: SessionDep, user: CurrentUser, request: Request
) -> InstancePublic:
    return _public(request, session, lifecycle.get_instance(session, user, ref))


def _change_state(
    request: Request,
    session: Session,
    user: User,
    ref: str,
    after: BackgroundTasks,
    change: Callable[[Session, Instance], object],
) -> InstancePublic:
    """Apply a state change to the user's instance `ref`, wake the reconcilers after the
    commit, and answer with the instance as it now is."""
    instance = lifecycle.get_instance(session, user, ref)
    change(session, instance)
    _wake_after_commit(request, after)
    return _public(request, session, instance)


@router.post("/instances/{ref}/stop")
def stop_instance(
    ref: str, session: SessionDep, user: CurrentUser, request: Request, after: BackgroundTasks
) -> InstancePublic:
    return _change_state(request, session, user, ref, after, lifecycle.stop_instance)


@router.post("/instances/{ref}/start")
def start_instance(
    ref: str,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    after: BackgroundTasks,
    body: InstanceStart | None = None,
) -> InstancePublic:
    rt = runtime(request)
    return _change_state(
        request,
        session,
        user,
        ref,
        after,
        lambda session, i: lifecycle.start_instance(
            session,
            i,
            catalog=rt.catalog,
            min_start_minutes=rt.settings.min_start_minutes,
            no_gpu=body is not None and body.no_gpu,
        ),
    )


@router.post("/instances/{ref}/release")
def release_instance(
    ref: str, session: SessionDep, user: CurrentUser, request: Request, after: BackgroundTasks
) -> InstancePublic:
    return _change_state(request, session, user, ref, after, lifecycle.release_instance)


@router.put("/instances/{ref}/workdir", status_code=204)
async def upload_workdir(ref: str, user: DetachedUser, request: Request) -> Response:
    """A gzip'd tar of the task's workdir; the runner unpacks it into the workspace. The
    body streams to disk outside any transaction."""
    rt = runtime(request)
    instance_id = await run_in_threadpool(workdir.find_instance_id, rt.sessions, user, ref)
    target = rt.settings.uploads_path / f"{instance_id}.tar.gz"
    await workdir.receive(request.stream(), target)
    await run_in_threadpool(workdir.record, rt.sessions, user, ref, target)
    request.app.state.wake_reconcilers()
    return Response(status_code=204)


@router.post("/instances/{ref}/runs", status_code=201)
def create_run(
    ref: str,
    body: RunCreate,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    after: BackgroundTasks,
) -> RunPublic:
    instance = lifecycle.get_instance(session, user, ref)
    run = runs.create_requested_run(session, instance, body)
    after.add_task(request.app.state.signals.runs.fire)  # after the commit: runners long-poll
    return RunPublic.model_validate(run)


router.include_router(autostop_api.router)  # autostop, schedules, resize, the user's zone
