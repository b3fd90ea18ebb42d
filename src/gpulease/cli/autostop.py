"""Instance commands for automatic stop, scheduled start and stop, and resize."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from gpulease.cli import output as out
from gpulease.cli.connection import fetch, logged_in_client
from gpulease.core.catalog import parse_accelerators
from gpulease.core.errors import InvalidInput
from gpulease.schemas.autostop import (
    AutostopPublic,
    AutostopUpdate,
    ScheduleCreate,
    SchedulePublic,
    TimezoneUpdate,
)
from gpulease.schemas.instances import InstancePublic, ResizeRequest

RefArgument = Annotated[str, typer.Argument(metavar="REF", help="instance id or name")]
IdleMinutesOption = Annotated[
    int | None, typer.Option("--idle-minutes", help="stop it after this many idle minutes")
]
MaxRuntimeOption = Annotated[
    int | None, typer.Option("--max-runtime", help="stop it after running this many minutes")
]

schedule_app = typer.Typer(
    help="Start and stop an instance on a timetable (cron, in your time zone).",
    no_args_is_help=True,
)


def register(instance_app: typer.Typer) -> None:
    """Add `autostop`, `schedule` and `resize` to `gpulease instance`."""
    instance_app.command("autostop")(autostop)
    instance_app.add_typer(schedule_app, name="schedule")
    instance_app.command("resize")(resize)


def _show_autostop(a: AutostopPublic) -> None:
    idle = "off"
    if a.idle_minutes_effective is not None:
        idle = f"under {a.idle_util_pct:g}% GPU for {a.idle_minutes_effective} min"
        if a.idle_minutes is None:
            idle += " (the server's ceiling)"
    out.show_fields(
        [
            ("idle stop", idle),
            ("max runtime", f"{a.max_runtime_minutes} min" if a.max_runtime_minutes else "off"),
            ("stop after run", a.stop_after_run),
            ("last activity", out.when(a.last_activity_at)),
            ("idle warning", f"stops at {out.when(a.idle_stop_at)}" if a.idle_warned_at else ""),
        ]
    )


def autostop(
    ref: RefArgument,
    idle_util: Annotated[
        float | None,
        typer.Option("--idle-util", help="GPU utilisation % under which it is idle (default 5)"),
    ] = None,
    idle_minutes: IdleMinutesOption = None,
    max_runtime: MaxRuntimeOption = None,
    after_run: Annotated[
        int | None, typer.Option("--after-run", help="stop when this run ends")
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="only show the setting")] = False,
    output: out.OutputOption = out.OutputFormat.table,
) -> None:
    """Stop it when idle, after a maximum runtime, or when a run ends (workspace kept).

    Sets all of them at once: an option left out turns its part off."""
    with logged_in_client() as client:
        if show:
            result = client.autostop.get(ref)
        else:
            result = client.autostop.set(
                ref,
                AutostopUpdate(
                    idle_util_pct=idle_util,
                    idle_minutes=idle_minutes,
                    max_runtime_minutes=max_runtime,
                    stop_after_run=after_run,
                ),
            )
    out.emit(result, output, _show_autostop)


@schedule_app.command("add")
def schedule_add(
    ref: RefArgument,
    start: Annotated[
        str | None, typer.Option("--start", help='cron, e.g. "0 9 * * 1-5" (09:00 weekdays)')
    ] = None,
    stop: Annotated[str | None, typer.Option("--stop", help='cron, e.g. "0 19 * * 1-5"')] = None,
    timezone: Annotated[
        str | None, typer.Option("--timezone", help="IANA zone; default: yours")
    ] = None,
    output: out.OutputOption = out.OutputFormat.table,
) -> None:
    """Add a scheduled start and/or stop."""
    if start is None and stop is None:
        out.fail('give --start and/or --stop, e.g. --start "0 9 * * 1-5" --stop "0 19 * * 1-5"', 2)
    with logged_in_client() as client:
        made = [
            client.autostop.add_schedule(
                ref, ScheduleCreate(action=action, cron=cron, timezone=timezone)
            )
            for action, cron in (("start", start), ("stop", stop))
            if cron is not None
        ]
    out.emit(made, output, _show_made)


def _show_made(made: list[SchedulePublic]) -> None:
    for s in made:
        out.console().print(
            f"schedule {s.id}: {s.action} at {escape(repr(s.cron))} ({escape(s.timezone)}), "
            f"next {out.when(s.next_fire_at)}"
        )


@schedule_app.command("ls")
def schedule_ls(ref: RefArgument, output: out.OutputOption = out.OutputFormat.table) -> None:
    """The instance's schedules and when each fires next."""
    out.emit_rows(
        fetch(lambda client: client.autostop.schedules(ref)),
        output,
        ("ID", "ACTION", "CRON", "TIME ZONE", "NEXT", "LAST"),
        lambda s: (
            s.id,
            s.action,
            s.cron,
            s.timezone,
            out.when(s.next_fire_at),
            out.when(s.last_fired_at),
        ),
        empty='no schedules; add one with --start "0 9 * * 1-5"',
    )


@schedule_app.command("rm")
def schedule_rm(
    ref: RefArgument,
    schedule_id: Annotated[int, typer.Argument(metavar="ID", help="see `schedule ls`")],
) -> None:
    """Remove a schedule."""
    with logged_in_client() as client:
        client.autostop.remove_schedule(ref, schedule_id)
    out.note(f"schedule {schedule_id} removed")


@schedule_app.command("timezone")
def schedule_timezone(
    zone: Annotated[str, typer.Argument(metavar="ZONE", help="IANA name, e.g. Europe/Berlin")],
) -> None:
    """Set your time zone; schedules that followed your old one follow the new one."""
    with logged_in_client() as client:
        user = client.auth.set_timezone(TimezoneUpdate(timezone=zone))
    out.console().print(f"time zone: {escape(user.timezone)}")


def resize(
    ref: RefArgument,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="MODEL:COUNT, e.g. T4:2 (or MODEL for one)")
    ] = None,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="CPU only")] = False,
    output: out.OutputOption = out.OutputFormat.table,
) -> None:
    """Give a stopped instance other GPUs (or none); its workspace is kept."""
    if (gpus is None) == (not no_gpu):
        out.fail("give either --gpus MODEL:COUNT (e.g. --gpus T4:2) or --no-gpu", 2)
    model: str | None = None
    count: int | None = None
    if gpus is not None:
        try:
            model, count = parse_accelerators(gpus)
        except InvalidInput as exc:
            out.fail(exc.message, 2)
        if count == 0:
            model, count, no_gpu = None, None, True
    with logged_in_client() as client:
        instance = client.instances.resize(
            ref, ResizeRequest(gpu_model=model, gpu_count=count, no_gpu=no_gpu)
        )
    out.emit(instance, output, _show_resized)


def _show_resized(instance: InstancePublic) -> None:
    gpu = "CPU only" if instance.gpu_count == 0 else f"{instance.gpu_model}:{instance.gpu_count}"
    out.console().print(
        f"instance {instance.id} [bold]{escape(instance.name)}[/bold]: {escape(gpu)}, "
        f"{escape(instance.hourly)}/h; start it with "
        f"`gpulease instance start {escape(instance.name)}`"
    )
