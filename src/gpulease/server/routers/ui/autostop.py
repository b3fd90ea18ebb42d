"""Console forms of the instance page for automatic stop, schedules, resize and no-GPU start.

The instance page includes templates/instances/_autostop.html and _resize.html; they read
their content from the page's `panel` (instances.autostop_panel). Every form posts here and
comes back to /instances/{ref}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Form, Response

from gpulease.core.catalog import parse_accelerators
from gpulease.core.errors import InvalidInput
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance
from gpulease.server.routers.ui.forms import FormBody
from gpulease.server.routers.ui.guards import ConsolePage, FormViewer, console_router
from gpulease.server.routers.ui.instances import act_on_instance
from gpulease.server.services.instances import autostop, lifecycle, resize, schedules

router = console_router()

FormText = Annotated[str, Form()]


class AutostopForm(FormBody):
    """Automatic stop: each field empty for off."""

    idle_util_pct: str = ""
    idle_minutes: str = ""
    max_runtime_minutes: str = ""
    stop_after_run: str = ""


class ScheduleForm(FormBody):
    action: str = ""
    cron: str = ""
    timezone: str = ""
    """The viewer's time zone, saved as theirs when it changed."""


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


def _change(console: ConsolePage, ref: str, apply: Callable[[Instance], None]) -> Response:
    """Apply one form to the viewer's instance and go back to its page; a refusal is shown
    on a page of its own with the reason."""
    return act_on_instance(console, ref, apply, refused=console.refused)


@router.post("/instances/{ref}/autostop")
def set_autostop(ref: str, console: FormViewer, form: Annotated[AutostopForm, Form()]) -> Response:
    def apply(instance: Instance) -> None:
        autostop.set_autostop(
            console.session,
            instance,
            idle_util=_number(form.idle_util_pct, "the GPU utilisation", float),
            idle_minutes=_int(form.idle_minutes, "the idle minutes"),
            max_runtime_minutes=_int(form.max_runtime_minutes, "the maximum runtime"),
            stop_after_run=_int(form.stop_after_run, "the run"),
            ceiling=console.runtime.settings.idle_stop_max_minutes,
        )

    return _change(console, ref, apply)


@router.post("/instances/{ref}/schedules")
def add_schedule(ref: str, console: FormViewer, form: Annotated[ScheduleForm, Form()]) -> Response:
    def apply(instance: Instance) -> None:
        session, user = console.session, console.user
        zone = form.timezone.strip()
        if zone and zone != user.timezone:
            schedules.set_user_timezone(session, user, zone, utcnow())
        schedules.add_schedule(
            session, user, instance, action=form.action, cron=form.cron, timezone=None, now=utcnow()
        )

    return _change(console, ref, apply)


@router.post("/instances/{ref}/schedules/{schedule_id}/delete")
def remove_schedule(ref: str, schedule_id: int, console: FormViewer) -> Response:
    def apply(instance: Instance) -> None:
        schedules.remove_schedule(console.session, instance, schedule_id)

    return _change(console, ref, apply)


@router.post("/instances/{ref}/resize")
def resize_instance(
    ref: str, console: FormViewer, gpus: FormText = "", no_gpu: FormText = ""
) -> Response:
    def apply(instance: Instance) -> None:
        model, count = parse_accelerators(gpus) if gpus.strip() else (None, None)
        cpu = count == 0 or no_gpu == "on"
        resize.resize(
            console.session,
            console.runtime.catalog,
            instance,
            gpu_model=None if cpu else model,
            gpu_count=None if cpu else count,
            no_gpu=cpu,
        )

    return _change(console, ref, apply)


@router.post("/instances/{ref}/start-no-gpu")
def start_without_gpu(ref: str, console: FormViewer) -> Response:
    def apply(instance: Instance) -> None:
        rt = console.runtime
        lifecycle.start_instance(
            console.session,
            instance,
            catalog=rt.catalog,
            min_start_minutes=rt.settings.min_start_minutes,
            no_gpu=True,
        )

    return _change(console, ref, apply)
