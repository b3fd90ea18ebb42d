"""The console's instance page: live status, stop/start/release, its runs, GPU charts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Form, Response
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import GpuleaseError, NotFound
from gpulease.schemas.autostop import AutostopPublic, SchedulePublic
from gpulease.schemas.instances import InstancePublic
from gpulease.schemas.runs import RunPublic
from gpulease.server.orm import Instance, User
from gpulease.server.routers.api.presenters import instance_public
from gpulease.server.routers.ui.guards import (
    ConsolePage,
    FormViewer,
    PageViewer,
    PartialViewer,
    console_router,
)
from gpulease.server.runtime import Runtime
from gpulease.server.services import runs
from gpulease.server.services.instances import autostop, lifecycle, schedules, states
from gpulease.server.services.instances.resize import RESIZABLE

router = console_router()

FormText = Annotated[str, Form()]
INSTANCE_RUNS = 50
REFRESH_MS = 2000
MAX_REF = 64


@dataclass(frozen=True)
class GpuCard:
    index: int
    uuid: str
    model: str
    memory_mb: int
    simulated: bool


@dataclass(frozen=True)
class InstanceView:
    instance: InstancePublic
    runs: list[RunPublic]
    gpus: list[GpuCard]
    can_stop: bool
    can_start: bool
    can_release: bool
    can_run: bool


@dataclass(frozen=True)
class AutostopPanel:
    """What the automatic-stop and resize partials show (templates/instances/_autostop.html,
    _resize.html)."""

    autostop: AutostopPublic
    schedules: list[SchedulePublic]
    timezone: str
    gpu_models: list[str]
    resizable: bool
    no_gpu_resume: str | None
    """While started without GPUs: the GPUs a plain start brings back ('T4:2')."""


def autostop_panel(session: Session, rt: Runtime, instance: Instance) -> AutostopPanel:
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


def load_instance(
    session: Session, user: User, catalog: Catalog, ref: str
) -> tuple[Instance, InstanceView]:
    """The instance page's content; someone else's instance is NotFound, as is a bad ref."""
    if not ref or len(ref) > MAX_REF:
        raise NotFound(f"you have no instance {ref[:MAX_REF]!r}; see the dashboard")
    instance = lifecycle.get_instance(session, user, ref)
    positions = lifecycle.queue_position_map(session)
    public = instance_public(session, instance, catalog, positions)
    found = runs.list_runs(session, user, instance.id, limit=INSTANCE_RUNS)
    status = instance.status
    view = InstanceView(
        instance=public,
        runs=[RunPublic.model_validate(r) for r in found],
        gpus=[
            GpuCard(g.index, g.uuid, g.model or g.nvml_name, g.memory_mb, g.simulated)
            for g in instance.gpus
        ],
        can_stop=status in states.ACTIVE,
        can_start=status in states.RESTARTABLE,
        can_release=status != states.RELEASED and instance.desired_state != "released",
        can_run=status in states.ACTIVE and instance.desired_state == "running",
    )
    return instance, view


def _page(
    console: ConsolePage, ref: str, refusal: GpuleaseError | None = None, *, command: str = ""
) -> Response:
    """The instance page; the partials of other areas (terminal, autostop, support) get
    `instance` (InstancePublic) and `panel`."""
    rt = console.runtime
    try:
        instance, view = load_instance(console.session, console.user, rt.catalog, ref)
    except NotFound as exc:
        return console.refused(exc, "Instance not found")
    context = {
        "view": view,
        "instance": view.instance,
        "panel": autostop_panel(console.session, rt, instance),
        # empty: console forms are guarded by their Origin (routers/ui/guards.same_site)
        "csrf": "",
        "command": command,
        "refresh_ms": REFRESH_MS,
    }
    return console.form_page(
        "instances/page.html", context, refusal, page="instance", terminal=True
    )


@router.get("/instances/{ref}")
def instance_page(ref: str, console: PageViewer) -> Response:
    return _page(console, ref)


@router.get("/partials/instances/{ref}")
def instance_live(ref: str, console: PartialViewer) -> Response:
    """The instance page's live parts (status, runs), re-rendered for live.js."""
    try:
        _, view = load_instance(console.session, console.user, console.runtime.catalog, ref)
    except NotFound as exc:
        return Response(exc.message, status_code=404, media_type="text/plain")
    return console.render("instances/live.html", {"view": view})


def act_on_instance(
    console: ConsolePage,
    ref: str,
    action: Callable[[Instance], object],
    *,
    command: str = "",
    refused: Callable[[GpuleaseError], Response] | None = None,
) -> Response:
    """A form's POST on the viewer's instance: `action` goes through a service and may say
    where to go next (a path; anything else: back to the instance page); once committed,
    the reconcilers wake, then a 303 there. A refusal shows the instance page again with
    the message (and `command` as typed), or refused(exc) where given."""

    def act() -> str:
        if not ref or len(ref) > MAX_REF:
            raise NotFound(f"you have no instance {ref[:MAX_REF]!r}")
        target = action(lifecycle.get_instance(console.session, console.user, ref))
        console.wake_reconcilers()
        return target if isinstance(target, str) else f"/instances/{ref}"

    return console.act(act, refused or (lambda exc: _page(console, ref, exc, command=command)))


@router.post("/instances/{ref}/stop")
def stop(ref: str, console: FormViewer) -> Response:
    return act_on_instance(console, ref, lambda i: lifecycle.stop_instance(console.session, i))


@router.post("/instances/{ref}/start")
def start(ref: str, console: FormViewer) -> Response:
    rt = console.runtime
    return act_on_instance(
        console,
        ref,
        lambda i: lifecycle.start_instance(
            console.session,
            i,
            catalog=rt.catalog,
            min_start_minutes=rt.settings.min_start_minutes,
        ),
    )


@router.post("/instances/{ref}/release")
def release(ref: str, console: FormViewer) -> Response:
    return act_on_instance(console, ref, lambda i: lifecycle.release_instance(console.session, i))


@router.post("/instances/{ref}/runs")
def start_run(ref: str, console: FormViewer, command: FormText = "") -> Response:
    """Start a command in the instance (as `gpulease exec`), then go to the run's page. The
    box's lines come as a browser sends a textarea, ended by CR LF: the script gets LF, or
    bash would read each line's command with a stray CR."""
    script = command.replace("\r\n", "\n")

    def action(instance: Instance) -> str:
        run = runs.create_run(console.session, instance, script, {})
        console.after(console.request.app.state.signals.runs.fire)
        return f"/runs/{run.id}"

    return act_on_instance(console, ref, action, command=command)
