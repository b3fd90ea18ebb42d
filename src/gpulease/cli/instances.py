"""Instance commands: create, list, show, stop, start, release; and waiting for one to start."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape

from gpulease.cli.autostop import IdleMinutesOption, MaxRuntimeOption, RefArgument
from gpulease.cli.catalog import share_text
from gpulease.cli.connection import fetch, logged_in_client
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    console,
    emit,
    err_console,
    fail,
    note,
    print_json,
    show_fields,
    show_rows,
    when,
)
from gpulease.client import GpuleaseClient, InstanceRef
from gpulease.core.durations import parse_minutes
from gpulease.schemas.instances import InstanceCreate, InstancePublic, InstanceStart

# How often waiting commands poll an instance that is queued or starting.
POLL_INTERVAL_S = 1.0
# A starting instance is moments from running: looked at this often, the run waiting on it
# (gpulease run, exec) streams its first line without losing most of an interval.
STARTING_POLL_S = 0.1
WAITING = frozenset({"queued", "starting"})

DatasetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--dataset", "-d", metavar="NAME", help="mount your dataset at /data/NAME (repeatable)"
    ),
]

MaxDurationOption = Annotated[
    str | None,
    typer.Option(
        "--max-duration",
        metavar="2h",
        help="how long it may run (2h, 90m, 1h30m): it stops then, and the queue counts on it",
    ),
]


def max_runtime_of(max_duration: str | None, max_runtime: int | None = None) -> int | None:
    """The maximum runtime in minutes from `--max-duration 2h` or `--max-runtime 120`."""
    if max_duration is None:
        return max_runtime
    if max_runtime is not None:
        fail("give --max-duration or --max-runtime, not both (they set the same limit)", 2)
    return parse_minutes(max_duration, "--max-duration")


def gpu_text(instance: InstancePublic) -> str:
    if instance.gpu_count == 0:
        return instance.gpu_model
    text = f"{instance.gpu_model}:{instance.gpu_count}"
    return text + " (simulated)" if instance.simulated else text


def status_text(instance: InstancePublic) -> str:
    """Where the instance stands, to follow 'instance NAME: ' as a sentence: 'queued, next
    to start', 'queued: needs 2 × A100, 1 free; 1 request ahead of you', 'starting: building
    environment', 'stopped by its owner', 'released: its run 4 ended'."""
    status = instance.status
    if status == "queued":
        if instance.status_message:  # the scheduler's why and when; it names no other user
            return f"queued: {instance.status_message}"
        ahead = (instance.queue_position or 1) - 1
        if ahead:
            return f"queued behind {ahead} other request{'s' if ahead != 1 else ''}"
        return "queued, being placed on a node"
    detail = instance.status_message if status in WAITING else instance.status_reason
    if not detail or detail.lower() == status:
        return status
    if detail.lower().startswith(status + " "):  # 'stopped by its owner', not 'stopped: stopped …'
        return detail
    return f"{status}: {detail}"


def wait_until_started(client: GpuleaseClient, ref: InstanceRef) -> InstancePublic:
    """Poll while the instance is queued or starting, showing its progress on stderr;
    returns it once it is running, or stopped, failed or released instead."""
    instance = client.instances.get(ref)
    if instance.status not in WAITING:
        return instance
    err = err_console()
    line = f"instance {instance.name}: {status_text(instance)}"
    # A terminal gets a spinner line; a log file gets each change once.
    spinner = err.status(escape(line)) if err.is_terminal else None
    if spinner is None:
        note(line)
    else:
        spinner.start()
    try:
        while instance.status in WAITING:
            queued = instance.status == "queued"
            time.sleep(POLL_INTERVAL_S if queued else min(STARTING_POLL_S, POLL_INTERVAL_S))
            instance = client.instances.get(ref)
            new_line = f"instance {instance.name}: {status_text(instance)}"
            if new_line != line:
                line = new_line
                if spinner is None:
                    note(line)
                else:
                    spinner.update(escape(line))
    finally:
        if spinner is not None:
            spinner.stop()
    return instance


def wait_until_settled(client: GpuleaseClient, ref: InstanceRef, seconds: float) -> InstancePublic:
    """Poll for up to about `seconds` until the instance is where it is going (its desired
    state: released after a `gpulease run`, say) or has failed; returns it as it is then."""
    instance = client.instances.get(ref)
    for _ in range(int(seconds / POLL_INTERVAL_S)):
        if instance.status in (instance.desired_state, "released", "failed"):
            break
        time.sleep(POLL_INTERVAL_S)
        instance = client.instances.get(ref)
    return instance


instance_app = typer.Typer(
    help="Rent GPUs: create, list, stop, start and release instances.", no_args_is_help=True
)


def _print_instance_line(instance: InstancePublic, verb: str = "") -> None:
    """'instance 3 box created: queued, being placed on a node' or 'instance 3 box: stopped'."""
    head = f"instance {instance.id} [bold]{escape(instance.name)}[/bold]"
    console().print(f"{head}{' ' + verb if verb else ''}: {escape(status_text(instance))}")


@instance_app.command("create")
def create(
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="MODEL:COUNT, e.g. A100-80GB:4; leave out for CPU only"),
    ] = None,
    template: Annotated[str, typer.Option("--template", help="see `gpulease templates`")] = (
        "pytorch"
    ),
    name: Annotated[str | None, typer.Option("--name", help="lowercase letters, digits, -")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait until it is running")] = False,
    dataset: DatasetOption = None,
    plan: Annotated[
        str, typer.Option("--plan", help="on_demand, daily or spot; see `gpulease plans`")
    ] = "on_demand",
    team: Annotated[str | None, typer.Option("--team", help="charge this team's wallet")] = None,
    when_cheap: Annotated[
        bool, typer.Option("--when-cheap", help="start only inside an off-peak window")
    ] = False,
    auto_renew: Annotated[
        bool, typer.Option("--auto-renew", help="daily plan: buy the next block at the end")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="accept the daily plan's rules")] = False,
    idle_minutes: IdleMinutesOption = None,
    max_runtime: MaxRuntimeOption = None,
    max_duration: MaxDurationOption = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Rent an instance. It is queued until its GPUs are free, then starts."""
    max_runtime = max_runtime_of(max_duration, max_runtime)
    with logged_in_client() as client:
        if plan == "daily" and not yes:
            (rules,) = [q.rules for q in client.billing.plans(gpu or "CPU") if q.plan == "daily"]
            err_console().print(rules, markup=False)
            if not typer.confirm("Buy a daily block on these terms?", err=True):
                fail("not created", 1)
        instance = client.instances.create(
            InstanceCreate(
                gpu=gpu,
                template=template,
                name=name,
                datasets=list(dataset or ()),
                plan=plan,
                team=team,
                start_when_cheap=when_cheap,
                auto_renew=auto_renew,
                idle_minutes=idle_minutes,
                max_runtime_minutes=max_runtime,
            )
        )
        if output is OutputFormat.table:
            _print_instance_line(instance, "created")
        if wait:
            instance = wait_until_started(client, instance.id)
    if output is OutputFormat.json:
        print_json(instance)
    elif wait:
        _print_instance_line(instance)
    if wait and instance.status != "running":
        fail(f"instance {instance.name} did not start: {status_text(instance)}")


@instance_app.command("ls")
def list_(
    all_: Annotated[bool, typer.Option("--all", "-a", help="include released instances")] = False,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Your instances."""
    emit(fetch(lambda client: client.instances.list(include_released=all_)), output, _show_list)


def _show_list(found: list[InstancePublic]) -> None:
    show_rows(
        found,
        ("ID", "NAME", "STATUS", "GPU", "TEMPLATE", "NODE", "PRICE/H", "CREATED", "EST. START"),
        lambda i: (
            i.id,
            i.name,
            _short_status(i),
            gpu_text(i),
            i.template,
            i.node,
            i.hourly,
            when(i.created_at),
            _eta_text(i),
        ),
        empty="no instances; create one with `gpulease instance create --gpu T4:1`",
    )


def _short_status(instance: InstancePublic) -> str:
    if instance.status == "queued" and instance.queue_position is not None:
        return f"{instance.status} (#{instance.queue_position})"
    return instance.status


def _eta_text(instance: InstancePublic) -> str:
    if instance.status != "queued":
        return "-"
    return when(instance.queue_eta) if instance.queue_eta else "not known yet"


def _queue_fields(i: InstancePublic) -> list[tuple[str, object]]:
    """Why a queued instance waits and until when, each on a line of its own."""
    if i.status != "queued" or not i.queue_reason:
        return []
    return [
        ("queue place", i.queue_position),
        ("waiting because", i.queue_reason),
        ("estimated start", _eta_text(i)),
        ("estimate from", i.queue_eta_basis or "nothing known of what runs ahead"),
    ]


def _gang_fields(i: InstancePublic) -> list[tuple[str, object]]:
    """A rank of a multi-node run: which rank of how many, and its fabric address if any."""
    if i.gang_size is None:
        return []
    fields: list[tuple[str, object]] = [
        ("multi-node run", f"rank {i.gang_rank} of {i.gang_size} (rank 0 is instance {i.gang_id})")
    ]
    if i.fabric_address:
        fields.append(("fabric address", i.fabric_address))
    return fields


@instance_app.command("show")
def show(ref: RefArgument, output: OutputOption = OutputFormat.table) -> None:
    """One instance in detail."""
    with logged_in_client() as client:
        i = client.instances.get(ref)
        models = (
            {m.name: m for m in client.catalog.gpus()} if output is not OutputFormat.json else {}
        )
    emit(
        i,
        output,
        lambda i: show_fields(
            [
                ("id", i.id),
                ("name", i.name),
                ("status", _short_status(i) if _queue_fields(i) else status_text(i)),
                *_queue_fields(i),
                ("expected duration", i.duration_basis),
                ("desired", i.desired_state),
                ("gpu", gpu_text(i)),
                (
                    "cpu and memory",
                    share_text(models[i.gpu_model], i.gpu_count) if i.gpu_model in models else "-",
                ),
                ("gpu indices", ", ".join(map(str, i.gpu_indices))),
                ("template", i.template),
                ("datasets", ", ".join(f"/data/{n} (v{v})" for n, v in i.datasets.items())),
                *_gang_fields(i),
                ("node", i.node),
                ("last node", i.last_node),
                ("workspace saved", when(i.workspace_saved_at)),
                ("price", f"{i.hourly}/h"),
                ("created", when(i.created_at)),
                ("started", when(i.started_at)),
            ]
        ),
    )


@instance_app.command("stop")
def stop(ref: RefArgument, output: OutputOption = OutputFormat.table) -> None:
    """Stop: the GPUs are freed and billing ends; the workspace is kept."""
    _act(ref, "stop", output)


@instance_app.command("start")
def start(
    ref: RefArgument,
    no_gpu: Annotated[
        bool,
        typer.Option("--no-gpu", help="CPU only, at the CPU price, for setup and data work"),
    ] = False,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Start a stopped instance again (it queues for its GPUs)."""
    _act(ref, "start-no-gpu" if no_gpu else "start", output)


@instance_app.command("release")
def release(ref: RefArgument, output: OutputOption = OutputFormat.table) -> None:
    """Release for good: stop it and delete its workspace."""
    _act(ref, "release", output)


def _act(ref: str, action: str, output: OutputFormat) -> None:
    with logged_in_client() as client:
        if action == "stop":
            instance = client.instances.stop(ref)
        elif action == "start":
            instance = client.instances.start(ref)
        elif action == "start-no-gpu":
            instance = client.instances.start(ref, InstanceStart(no_gpu=True))
        else:
            instance = client.instances.release(ref)
    emit(instance, output, _print_instance_line)
