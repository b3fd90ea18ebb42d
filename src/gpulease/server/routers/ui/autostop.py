"""Console forms of the instance page for automatic stop, schedules, resize and no-GPU start.

The instance page includes templates/instances/_autostop.html and _resize.html; they read
their content through the `autostop_panel` template global, inside the page's transaction.
Every form posts here and comes back to /instances/{ref}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session, object_session

from gpulease.core.catalog import parse_accelerators
from gpulease.core.errors import GpuleaseError, InvalidInput
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.autostop import AutostopPublic, SchedulePublic
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, User
from gpulease.server.routers.deps import runtime, same_origin, tx
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render, templates
from gpulease.server.services.instances import autostop, lifecycle, resize, schedules
from gpulease.server.services.instances.resize import RESIZABLE

router = APIRouter()


@dataclass(frozen=True)
class AutostopPanel:
    autostop: AutostopPublic
    schedules: list[SchedulePublic]
    timezone: str
    gpu_models: list[str]
    resizable: bool
    no_gpu_resume: str | None
    """While started without GPUs: the GPUs a plain start brings back ('T4:2')."""


def autostop_panel(request: Request, instance: Instance) -> AutostopPanel:
    """What the two partials show, read in the instance page's own session."""
    session = object_session(instance)
    assert session is not None, "the instance page renders inside its transaction"
    rt = runtime(request)
    owner = session.get(User, instance.owner_id)
    found = schedules.list_schedules(session, instance)
    resume = None
    if instance.resume_gpu_model is not None:
        resume = f"{instance.resume_gpu_model}:{instance.resume_gpu_count or 1}"
    return AutostopPanel(
        autostop=autostop.public(instance, rt.settings.idle_stop_max_minutes),
        schedules=[SchedulePublic.model_validate(s) for s in found],
        timezone=owner.timezone if owner is not None else "UTC",
        gpu_models=[m.name for m in rt.catalog.models if m.is_gpu],
        resizable=instance.status in RESIZABLE,
        no_gpu_resume=resume,
    )


templates.env.globals["autostop_panel"] = autostop_panel


FormText = Annotated[str, Form()]
Action = Callable[[Session, User, Instance], None]


def _number(text: str, what: str, kind: Callable[[str], float]) -> float | None:
    if not text.strip():
        return None
    try:
        return kind(text.strip())
    except ValueError:
        raise InvalidInput(
            f"{what} must be a whole number, e.g. 30; leave it empty to turn it off"
        ) from None


def _int(text: str, what: str) -> int | None:
    value = _number(text, what, int)
    return None if value is None else int(value)


def _act(request: Request, ref: str, action: Action) -> Response:
    """Run one form's action on the viewer's instance and go back to its page; a refusal
    is shown on a page of its own with the reason."""
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        if not same_origin(request):
            return cross_site_refusal(request)
        public = UserPublic.model_validate(user)
    try:
        with tx(request) as session:
            owner = session.get(User, public.id)
            assert owner is not None
            instance = lifecycle.get_instance(session, owner, ref)
            action(session, owner, instance)
            target = f"/instances/{instance.id}"
    except GpuleaseError as exc:
        context = {"title": "Not changed", "message": exc.message}
        return render(request, "errors/error.html", context, user=public, status_code=exc.status)
    request.app.state.wake_reconcilers()
    return RedirectResponse(target, status_code=303)


@router.post("/instances/{ref}/autostop")
def set_autostop(
    ref: str,
    request: Request,
    idle_util_pct: FormText = "",
    idle_minutes: FormText = "",
    max_runtime_minutes: FormText = "",
    stop_after_run: FormText = "",
) -> Response:
    def apply(session: Session, user: User, instance: Instance) -> None:
        autostop.set_autostop(
            session,
            instance,
            idle_util=_number(idle_util_pct, "the GPU utilisation", float),
            idle_minutes=_int(idle_minutes, "the idle minutes"),
            max_runtime_minutes=_int(max_runtime_minutes, "the maximum runtime"),
            stop_after_run=_int(stop_after_run, "the run"),
            ceiling=runtime(request).settings.idle_stop_max_minutes,
        )

    return _act(request, ref, apply)


@router.post("/instances/{ref}/schedules")
def add_schedule(
    ref: str, request: Request, action: FormText = "", cron: FormText = "", timezone: FormText = ""
) -> Response:
    def apply(session: Session, user: User, instance: Instance) -> None:
        zone = timezone.strip()
        if zone and zone != user.timezone:
            schedules.set_user_timezone(session, user, zone, utcnow())
        schedules.add_schedule(
            session, user, instance, action=action, cron=cron, timezone=None, now=utcnow()
        )

    return _act(request, ref, apply)


@router.post("/instances/{ref}/schedules/{schedule_id}/delete")
def remove_schedule(ref: str, schedule_id: int, request: Request) -> Response:
    def apply(session: Session, user: User, instance: Instance) -> None:
        schedules.remove_schedule(session, instance, schedule_id)

    return _act(request, ref, apply)


@router.post("/instances/{ref}/resize")
def resize_instance(
    ref: str, request: Request, gpus: FormText = "", no_gpu: FormText = ""
) -> Response:
    def apply(session: Session, user: User, instance: Instance) -> None:
        model, count = parse_accelerators(gpus) if gpus.strip() else (None, None)
        cpu = count == 0 or no_gpu == "on"
        resize.resize(
            session,
            runtime(request).catalog,
            instance,
            gpu_model=None if cpu else model,
            gpu_count=None if cpu else count,
            no_gpu=cpu,
        )

    return _act(request, ref, apply)


@router.post("/instances/{ref}/start-no-gpu")
def start_without_gpu(ref: str, request: Request) -> Response:
    def apply(session: Session, user: User, instance: Instance) -> None:
        rt = runtime(request)
        lifecycle.start_instance(
            session,
            instance,
            catalog=rt.catalog,
            min_start_minutes=rt.settings.min_start_minutes,
            no_gpu=True,
        )

    return _act(request, ref, apply)
