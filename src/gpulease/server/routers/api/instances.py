"""Instances: create, list, show, stop, start, release, upload a workdir, exec a run."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gpulease.core.errors import InvalidInput
from gpulease.schemas.instances import InstanceCreate, InstancePublic, InstanceStart
from gpulease.schemas.runs import RunCreate, RunPublic
from gpulease.server.orm import Instance
from gpulease.server.routers.api import autostop as autostop_api
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.deps import current_user, runtime, tx
from gpulease.server.services import runs
from gpulease.server.services.datasets import mounts
from gpulease.server.services.instances import autostop, lifecycle

router = APIRouter(tags=["instances"])
MAX_WORKDIR_BYTES = 512 * 1024 * 1024


def _public(request: Request, session: Session, instance: Instance) -> InstancePublic:
    positions = lifecycle.queue_position_map(session)
    return instance_public(session, instance, runtime(request).catalog, positions)


@router.post("/instances", status_code=201)
def create_instance(body: InstanceCreate, request: Request) -> InstancePublic:
    rt = runtime(request)
    with tx(request) as session:
        user = current_user(session, request)
        instance = lifecycle.create_instance(
            session,
            user,
            catalog=rt.catalog,
            gpu=body.gpu,
            template=body.template,
            name=body.name,
            auto_release=body.auto_release,
            awaiting_workdir=body.awaiting_workdir,
            plan=body.plan,
            team=body.team,
            start_when_cheap=body.start_when_cheap,
            auto_renew=body.auto_renew,
            min_start_minutes=rt.settings.min_start_minutes,
            workspaces=rt.settings.workspaces_path,
        )
        if body.datasets:
            mounts.attach_datasets(session, user, instance, body.datasets)
        wanted = (body.idle_util_pct, body.idle_minutes, body.max_runtime_minutes)
        if any(v is not None for v in wanted):
            autostop.set_autostop(
                session,
                instance,
                idle_util=body.idle_util_pct,
                idle_minutes=body.idle_minutes,
                max_runtime_minutes=body.max_runtime_minutes,
                stop_after_run=None,
                ceiling=rt.settings.idle_stop_max_minutes,
            )
        result = _public(request, session, instance)
    request.app.state.wake_reconcilers()
    return result


@router.get("/instances")
def list_instances(request: Request, all: bool = False) -> list[InstancePublic]:
    with tx(request) as session:
        user = current_user(session, request)
        positions = lifecycle.queue_position_map(session)
        catalog = runtime(request).catalog
        return [
            instance_public(session, i, catalog, positions)
            for i in lifecycle.list_instances(session, user, include_released=all)
        ]


@router.get("/instances/{ref}")
def show_instance(ref: str, request: Request) -> InstancePublic:
    with tx(request) as session:
        user = current_user(session, request)
        return _public(request, session, lifecycle.get_instance(session, user, ref))


@router.post("/instances/{ref}/stop")
def stop_instance(ref: str, request: Request) -> InstancePublic:
    with tx(request) as session:
        user = current_user(session, request)
        instance = lifecycle.get_instance(session, user, ref)
        lifecycle.stop_instance(session, instance)
        result = _public(request, session, instance)
    request.app.state.wake_reconcilers()
    return result


@router.post("/instances/{ref}/start")
def start_instance(ref: str, request: Request, body: InstanceStart | None = None) -> InstancePublic:
    rt = runtime(request)
    with tx(request) as session:
        user = current_user(session, request)
        instance = lifecycle.get_instance(session, user, ref)
        lifecycle.start_instance(
            session,
            instance,
            catalog=rt.catalog,
            min_start_minutes=rt.settings.min_start_minutes,
            no_gpu=body is not None and body.no_gpu,
        )
        result = _public(request, session, instance)
    request.app.state.wake_reconcilers()
    return result


@router.post("/instances/{ref}/release")
def release_instance(ref: str, request: Request) -> InstancePublic:
    with tx(request) as session:
        user = current_user(session, request)
        instance = lifecycle.get_instance(session, user, ref)
        lifecycle.release_instance(session, instance)
        result = _public(request, session, instance)
    request.app.state.wake_reconcilers()
    return result


@router.put("/instances/{ref}/workdir", status_code=204)
async def upload_workdir(ref: str, request: Request) -> Response:
    """A gzip'd tar of the task's workdir; the runner unpacks it into the workspace."""
    rt = runtime(request)

    def _find() -> int:
        with tx(request) as session:
            user = current_user(session, request)
            return lifecycle.get_instance(session, user, ref).id

    instance_id = await run_in_threadpool(_find)
    target = rt.settings.uploads_path / f"{instance_id}.tar.gz"
    partial = target.with_suffix(".partial")
    size = 0
    with partial.open("wb") as out:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_WORKDIR_BYTES:
                out.close()
                partial.unlink(missing_ok=True)
                raise InvalidInput(
                    "the workdir is larger than 512 MiB; push big data as a dataset instead"
                )
            out.write(chunk)
    if size == 0:
        partial.unlink(missing_ok=True)
        raise InvalidInput("the workdir upload is empty; send a gzip'd tar of the directory")
    partial.replace(target)

    def _record() -> None:
        with tx(request) as session:
            user = current_user(session, request)
            instance = lifecycle.get_instance(session, user, ref)
            instance.workdir_upload = str(target)
            if instance.awaiting_workdir:
                instance.awaiting_workdir = False
                instance.status_message = ""

    await run_in_threadpool(_record)
    request.app.state.wake_reconcilers()
    return Response(status_code=204)


@router.post("/instances/{ref}/runs", status_code=201)
def create_run(ref: str, body: RunCreate, request: Request) -> RunPublic:
    with tx(request) as session:
        user = current_user(session, request)
        instance = lifecycle.get_instance(session, user, ref)
        run = runs.create_run(
            session,
            instance,
            body.command,
            body.env,
            stop_instance_on_exit=body.stop_instance_on_exit,
        )
        result = RunPublic.model_validate(run)
    request.app.state.signals.runs.fire()
    return result


router.include_router(autostop_api.router)  # autostop, schedules, resize, the user's zone
