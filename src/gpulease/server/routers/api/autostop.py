"""Automatic stop and start of instances, their schedules, resize, and the user's time zone."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.autostop import (
    AutostopPublic,
    AutostopUpdate,
    ScheduleCreate,
    SchedulePublic,
    TimezoneUpdate,
)
from gpulease.schemas.instances import InstancePublic, ResizeRequest
from gpulease.server.routers.api.clock import Now
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.deps import CurrentUser, IdPath, SessionDep, runtime
from gpulease.server.services.instances import autostop, lifecycle, resize, schedules

router = APIRouter(tags=["autostop"])


@router.get("/instances/{ref}/autostop")
def get_autostop(
    ref: str, session: SessionDep, user: CurrentUser, request: Request
) -> AutostopPublic:
    instance = lifecycle.get_instance(session, user, ref)
    return autostop.public(instance, runtime(request).settings.idle_stop_max_minutes)


@router.put("/instances/{ref}/autostop")
def set_autostop(
    ref: str, body: AutostopUpdate, session: SessionDep, user: CurrentUser, request: Request
) -> AutostopPublic:
    ceiling = runtime(request).settings.idle_stop_max_minutes
    instance = lifecycle.get_instance(session, user, ref)
    autostop.set_autostop(
        session,
        instance,
        idle_util=body.idle_util_pct,
        idle_minutes=body.idle_minutes,
        max_runtime_minutes=body.max_runtime_minutes,
        stop_after_run=body.stop_after_run,
        ceiling=ceiling,
    )
    return autostop.public(instance, ceiling)


@router.post("/instances/{ref}/schedules", status_code=201)
def add_schedule(
    ref: str, body: ScheduleCreate, session: SessionDep, user: CurrentUser, now: Now
) -> SchedulePublic:
    instance = lifecycle.get_instance(session, user, ref)
    schedule = schedules.add_schedule(
        session,
        user,
        instance,
        action=body.action,
        cron=body.cron,
        timezone=body.timezone,
        now=now,
    )
    return SchedulePublic.model_validate(schedule)


@router.get("/instances/{ref}/schedules")
def list_schedules(ref: str, session: SessionDep, user: CurrentUser) -> list[SchedulePublic]:
    instance = lifecycle.get_instance(session, user, ref)
    return [SchedulePublic.model_validate(s) for s in schedules.list_schedules(session, instance)]


@router.delete("/instances/{ref}/schedules/{schedule_id}", status_code=204)
def remove_schedule(
    ref: str, schedule_id: IdPath, session: SessionDep, user: CurrentUser
) -> Response:
    instance = lifecycle.get_instance(session, user, ref)
    schedules.remove_schedule(session, instance, schedule_id)
    return Response(status_code=204)


@router.post("/instances/{ref}/resize")
def resize_instance(
    ref: str, body: ResizeRequest, session: SessionDep, user: CurrentUser, request: Request
) -> InstancePublic:
    catalog = runtime(request).catalog
    instance = lifecycle.get_instance(session, user, ref)
    resize.resize(
        session,
        catalog,
        instance,
        gpu_model=body.gpu_model,
        gpu_count=body.gpu_count,
        no_gpu=body.no_gpu,
    )
    return instance_public(session, instance, catalog, lifecycle.queue_position_map(session))


@router.put("/me/timezone")
def set_timezone(
    body: TimezoneUpdate, session: SessionDep, user: CurrentUser, now: Now
) -> UserPublic:
    schedules.set_user_timezone(session, user, body.timezone, now)
    return UserPublic.model_validate(user)
