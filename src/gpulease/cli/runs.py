"""Run commands: exec a command in an instance, run a task end to end, read logs, list runs."""

from __future__ import annotations

import contextlib
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from gpulease.cli import gang_runs
from gpulease.cli.autostop import RefArgument
from gpulease.cli.catalog import share_text
from gpulease.cli.connection import logged_in_client
from gpulease.cli.instances import (
    WAITING,
    DatasetOption,
    MaxDurationOption,
    max_runtime_of,
    status_text,
    wait_until_settled,
    wait_until_started,
)
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    error,
    fail,
    note,
    print_json,
    show_rows,
    symbol_of,
    when,
)
from gpulease.cli.retry import MAX_RETRIES, Attempt, requeued_run, with_retries
from gpulease.client import (
    ClientError,
    EndEvent,
    GpuleaseClient,
    InstanceRef,
    LogEvent,
    RunStreamEvent,
    WorkdirArchive,
    pack_workdir,
    position,
)
from gpulease.client.runstream import ExecEvent
from gpulease.core.durations import span
from gpulease.core.money import format_credits
from gpulease.core.run_commands import command_text, first_line, own_command, shell_exit_code
from gpulease.core.taskspec import (
    AcceleratorChoice,
    Amount,
    TaskSpec,
    matching_models,
    parse_task,
)
from gpulease.schemas.catalog import GpuModelPublic
from gpulease.schemas.instances import InstanceCreate, InstancePublic
from gpulease.schemas.runs import ExecStarted, LogChunkPublic, RunCreate, RunPublic

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXIT_INTERRUPTED = 130
# How long `gpulease run` waits, after its run ended, to see its instance released.
RELEASE_WAIT_S = 30.0

EnvOption = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", metavar="KEY=VALUE", help="an environment variable (repeatable)"),
]
CommandArgument = Annotated[
    list[str],
    typer.Argument(
        metavar="-- COMMAND...", help="the command; put it after --", show_default=False
    ),
]


def parse_env(values: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise typer.BadParameter(f"{item!r}: write it as KEY=VALUE, e.g. --env LR=0.01")
        env[key] = value
    return env


def write_chunk(chunk: LogChunkPublic) -> None:
    """The job's bytes as they are (no Rich, no ANSI stripping), on the stream it used."""
    stream = sys.stderr if chunk.stream == "stderr" else sys.stdout
    stream.write(chunk.data)
    stream.flush()


class _ReconnectNotice:
    """Says that the log stream is reconnecting, at most every 30 s during an outage."""

    def __init__(self) -> None:
        self.last = -1e9

    def __call__(self, reason: str, delay: float) -> None:
        now = time.monotonic()
        if now - self.last >= 30:
            self.last = now
            note(f"lost the log stream ({reason}); reconnecting, the job keeps running")


def stream_run(
    client: GpuleaseClient,
    run_id: int,
    after: int = -1,
    write: Callable[[LogChunkPublic], None] = write_chunk,
) -> EndEvent:
    """Print the run's output live (with `write`) until it ends; survives server restarts."""
    events = client.runs.stream(
        run_id, position(after), metrics=False, on_reconnect=_ReconnectNotice()
    )
    for event in events:
        if isinstance(event, LogEvent):
            write(event.chunk)
        elif isinstance(event, EndEvent):
            return event
    raise ClientError(f"the log stream of run {run_id} ended without its end")  # not reached


def exit_code_of(client: GpuleaseClient, run_id: int, end: EndEvent) -> int:
    """The shell's view of the run: its exit code, 128+N for signal N, 1 when it failed
    without one (its instance stopped, say), which is then explained on stderr."""
    code = shell_exit_code(end.exit_code, end.status)
    if code is not None:
        return code
    run = client.runs.get(run_id)
    why = f": {run.status_reason}" if run.status_reason else " without an exit code"
    error(f"run {run_id} {run.status}{why}")
    return 1


def exec_(
    ref: RefArgument,
    command: CommandArgument,
    env: EnvOption = None,
) -> None:
    """Run a command in an instance and stream its output; exits with its exit code.

    gpulease exec my-box -- python train.py --epochs 3
    """
    body = RunCreate(command=command_text(command), env=parse_env(env))
    # The event generator is closed here, before its client: left to the garbage collector,
    # its open answer would be closed on whatever thread collects it.
    with (
        logged_in_client() as client,
        contextlib.closing(client.runs.exec(ref, body, on_reconnect=_ReconnectNotice())) as events,
    ):
        first = next(events)  # a refusal raises here
        if not isinstance(first, ExecEvent):
            raise ClientError("the server's exec answer did not start with its run")
        note(f"run {first.started.run.id} on instance {ref}")
        code = follow_exec(client, ref, first.started, events)
    raise typer.Exit(code)


def follow_exec(
    client: GpuleaseClient,
    ref: InstanceRef,
    started: ExecStarted,
    events: Iterator[ExecEvent | RunStreamEvent],
) -> int:
    """Print an exec's output until its run ends (once its instance runs, saying what a
    queued or starting one waits for); the exit code for the shell."""
    run_id = started.run.id
    try:
        if started.instance_status != "running":
            wait_until_started(client, ref)
        for event in events:
            if isinstance(event, LogEvent):
                write_chunk(event.chunk)
            elif isinstance(event, EndEvent):
                return exit_code_of(client, run_id, event)
    except KeyboardInterrupt:
        note(f"run {run_id} keeps running; follow it with `gpulease logs {run_id} -f`")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise ClientError(f"the log stream of run {run_id} ended without its end")


def resume_exec(ref: str, started_json: str, after: int) -> None:
    """The rest of an exec that cli/quick.py started and announced: from its run's event
    stream after log chunk `after`, through the SDK (its instance was not running yet, the
    answer broke, or the run ended without an exit code)."""
    started = ExecStarted.model_validate_json(started_json)
    with logged_in_client() as client:
        stream = client.runs.stream(
            started.run.id, position(after), metrics=False, on_reconnect=_ReconnectNotice()
        )
        with contextlib.closing(stream) as events:
            code = follow_exec(client, ref, started, events)
    raise typer.Exit(code)


def resume_run(
    command: list[str],
    gpu: str | None,
    template: str | None,
    env: dict[str, str],
    instance_id: int,
    run_id: int | None,
    streamed: tuple[int, dict[str, Any] | None] | None = None,
) -> None:
    """The rest of a `gpulease run --gpu G -- COMMAND` whose instance (and run, unless
    run_id is None: then it is made here) cli/entry.py's quick path made: as `run` from
    there on. streamed: the quick path printed the run's output up to chunk N already,
    and saw its end event (the JSON) or not."""
    spec, _ = load_task(command, gpu=gpu, template=template, env=env, workdir=None, name=None)
    with logged_in_client() as client:
        end: EndEvent | None = None
        if run_id is not None and streamed is not None:
            after, seen = streamed
            try:
                # The stream first: a stream that broke because the server is restarting is
                # resumed once it is back, where a plain GET would fail at once.
                if seen is None:
                    end = stream_run(client, run_id, after)
                else:
                    end = EndEvent(str(seen["status"]), seen.get("exit_code"))
            except KeyboardInterrupt:
                instance = client.instances.get(instance_id)
                raise typer.Exit(_interrupted(client, instance).code) from None
        instance = client.instances.get(instance_id)
        run = client.runs.get(run_id) if run_id is not None else None
        # no retries: the quick path takes no --retry and a command's task has none
        if run is None or end is None:
            raise typer.Exit(follow_task(client, spec, instance, None, run).code)
        raise typer.Exit(finish_task(client, instance, run, end).code)


def release_instance(instance_id: int, name: str) -> None:
    """Release the instance of a run that cli/entry.py's quick path could not send."""
    with logged_in_client() as client:
        _release(client, instance_id, name)


def instance_name_for(task_name: str | None) -> str | None:
    """'Cat Breeds v2' -> 'cat-breeds-v2-3f9a': a valid instance name that does not clash."""
    if not task_name:
        return None
    slug = re.sub(r"[^a-z0-9-]", "-", task_name.lower())
    slug = re.sub(r"-{2,}", "-", slug).strip("-")[:50].rstrip("-") or "task"
    if not slug[0].isalpha():
        slug = f"task-{slug}"  # instance names start with a letter
    return f"{slug}-{secrets.token_hex(2)}"


def load_task(
    args: list[str],
    *,
    gpu: str | None,
    template: str | None,
    env: dict[str, str],
    workdir: Path | None,
    name: str | None,
) -> tuple[TaskSpec, Path | None]:
    """The task to run and the directory to upload. A task file's workdir is relative to
    the file; options on the command line override the file's values."""
    if len(args) == 1 and args[0].endswith((".yaml", ".yml")):
        path = Path(args[0])
        if not path.is_file():
            fail(f"task file {path} not found", 2)
        spec = parse_task(path.read_text())
        if (warning := spec.ignored_warning()) is not None:
            note(warning)
        spec = replace(
            spec,
            name=name or spec.name,
            accelerators=gpu or spec.accelerators,
            accelerator_choices=() if gpu else spec.accelerator_choices,
            template=template or spec.template,
            envs={**spec.envs, **env},
        )
        directory = workdir
        if directory is None and spec.workdir:
            directory = path.parent / Path(spec.workdir).expanduser()
        return spec, directory
    if not args:
        fail(
            "give a task file or a command: `gpulease run task.yaml` or "
            "`gpulease run --gpu T4:1 -- python train.py`",
            2,
        )
    spec = TaskSpec(
        name=name,
        accelerators=gpu,
        envs=env,
        workdir=str(workdir) if workdir else None,
        run=command_text(args),
        template=template or "pytorch",
    )
    return spec, workdir


def run(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="TASK.yaml | -- COMMAND...",
            help="a task file (SkyPilot-style YAML), or a command after --",
            show_default=False,
        ),
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="MODEL:COUNT, e.g. T4:1")] = None,
    template: Annotated[str | None, typer.Option("--template", help="default: pytorch")] = None,
    env: EnvOption = None,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="upload this directory into the workspace first"),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="task name")] = None,
    dataset: DatasetOption = None,
    spot: Annotated[bool, typer.Option("--spot", help="the spot plan: cheaper, may stop")] = False,
    team: Annotated[str | None, typer.Option("--team", help="charge this team's wallet")] = None,
    when_cheap: Annotated[
        bool, typer.Option("--when-cheap", help="start only inside an off-peak window")
    ] = False,
    retry: Annotated[
        int | None,
        typer.Option(
            "--retry",
            min=0,
            max=MAX_RETRIES,
            help="run it again this many times if its instance fails (its node left, say)",
        ),
    ] = None,
    max_duration: MaxDurationOption = None,
) -> None:
    """Rent an instance for one task: upload the workdir, run, stream the output, release.

    gpulease run task.yaml
    gpulease run --gpu T4:1 --workdir . -- python train.py
    """
    spec, directory = load_task(
        args or [], gpu=gpu, template=template, env=parse_env(env), workdir=workdir, name=name
    )
    if dataset:
        spec = replace(spec, datasets=tuple(dict.fromkeys((*spec.datasets, *dataset))))
    spec = replace(
        spec,
        use_spot=spec.use_spot or spot,
        start_when_cheap=spec.start_when_cheap or when_cheap,
        team=team or spec.team,
        retries=spec.retries if retry is None else retry,
        max_duration_minutes=max_runtime_of(max_duration) or spec.max_duration_minutes,
    )
    archive = pack_workdir(directory) if directory is not None else None  # before renting
    try:
        with logged_in_client() as client:
            raise typer.Exit(
                with_retries(
                    client,
                    spec.retries,
                    lambda: _run_task(client, spec, archive),
                    lambda instance_id, name: _release(client, instance_id, name),
                )
            )
    finally:
        if archive is not None:
            archive.close()


def short_of(
    model: GpuModelPublic, count: int, cpus: Amount | None, memory_gb: Amount | None
) -> str | None:
    """What of the task's `cpus:` and `memory:` an instance of count GPUs of model (a
    CPU-only one for CPU) does not come with, in words; None when it has enough (or the
    server does not say what it comes with)."""
    if model.vcpus_per_gpu is None or model.ram_gb_per_gpu is None:
        return None
    units = max(count, 1)
    missing = []
    if cpus is not None and model.vcpus_per_gpu * units < cpus.value:
        missing.append(f"cpus: {cpus}")
    if memory_gb is not None and model.ram_gb_per_gpu * units < memory_gb.value:
        missing.append(f"memory: {memory_gb}")
    if not missing:
        return None
    what = f"{model.name}:{count}" if count else f"a {model.name}-only instance"
    return f"{' and '.join(missing)} but {what} comes with {share_text(model, count)}"


def pick_accelerators(
    choices: tuple[AcceleratorChoice, ...],
    models: list[GpuModelPublic],
    cpus: Amount | None = None,
    memory_gb: Amount | None = None,
) -> tuple[str, str | None]:
    """The GPUs to rent for a task's choices ('A100:1', or any of several): each name
    stands for its catalog models (matching_models); of those whose CPU and memory share
    meets the task's cpus and memory, one with enough GPUs free now, then the cheapest,
    then the first written. Returns 'MODEL:COUNT' and, when that took a choice, the line
    that says what was picked and why. Exits with a message when none will do."""
    by_name = {m.name: m for m in models if m.is_gpu}
    candidates: list[tuple[GpuModelPublic, int]] = []
    for choice in choices:
        for name in matching_models(choice.name, list(by_name)):
            candidates.append((by_name[name], choice.count))
    wanted = ", ".join(str(c) for c in choices)
    if not candidates:
        fail(
            f"resources.accelerators: {wanted}: no such GPU here; this server has "
            f"{', '.join(by_name) or 'no GPUs'} (`gpulease gpus`)",
            2,
        )
    shortfalls = [short_of(m, n, cpus, memory_gb) for m, n in candidates]
    fitting = [(i, c) for i, c in enumerate(candidates) if shortfalls[i] is None]
    if not fitting:
        fail(
            f"resources: {shortfalls[0]}; ask for more GPUs (the share comes with each) "
            "or less CPU and memory",
            2,
        )
    _, (model, count) = min(
        fitting,
        key=lambda item: (
            item[1][0].free < item[1][1],
            item[1][0].hourly_micro * item[1][1],
            item[0],
        ),
    )
    picked = f"{model.name}:{count}"
    written = [str(c) for c in choices]
    if len(candidates) == 1 and written == [picked]:
        return picked, None
    why = "free now" if model.free >= count else f"none has {count} free now, so it queues"
    price = format_credits(model.hourly_micro * count, symbol_of(model.hourly, model.hourly_micro))
    return picked, f"accelerators {wanted}: {picked} ({why}, {price}/h)"


def _run_task(client: GpuleaseClient, spec: TaskSpec, archive: WorkdirArchive | None) -> Attempt:
    if spec.accelerator_choices or spec.cpus or spec.memory_gb:
        models = client.catalog.gpus()
        if spec.accelerator_choices:
            picked, line = pick_accelerators(
                spec.accelerator_choices, models, spec.cpus, spec.memory_gb
            )
            if line is not None:
                note(line)
            spec = replace(spec, accelerators=picked)
        elif not spec.accelerators:
            cpu = next((m for m in models if not m.is_gpu), None)
            short = cpu and short_of(cpu, 0, spec.cpus, spec.memory_gb)
            if short:
                fail(
                    f"resources: {short}; the operator sets the size "
                    "of CPU-only instances (pricing file, cpu.vcpus and cpu.ram_gb), or ask "
                    "for a GPU",
                    2,
                )
    instance = client.instances.create(
        InstanceCreate(
            gpu=spec.accelerators,
            template=spec.template,
            name=instance_name_for(spec.name),
            auto_release=True,
            awaiting_workdir=archive is not None,
            datasets=spec.datasets,
            plan="spot" if spec.use_spot else "on_demand",
            team=spec.team,
            start_when_cheap=spec.start_when_cheap,
            max_runtime_minutes=spec.max_duration_minutes,
            num_nodes=spec.num_nodes,
        )
    )
    if instance.gang_size:
        return gang_runs.run_gang(
            client,
            spec,
            instance,
            archive,
            lambda i, name: _release(client, i, name),
            lambda run_id, write: stream_run(client, run_id, write=write),
            lambda run_id, i: finish_line(client, run_id, i),
            lambda run_id, end: exit_code_of(client, run_id, end),
        )
    return follow_task(client, spec, instance, archive)


def follow_task(
    client: GpuleaseClient,
    spec: TaskSpec,
    instance: InstancePublic,
    archive: WorkdirArchive | None,
    run: RunPublic | None = None,
) -> Attempt:
    """The task on its new instance: the workdir uploaded and its run made (unless run is
    given, made already), its output streamed, its end and cost said."""
    note(f"instance {instance.id} {instance.name}: {status_text(instance)}")
    try:
        try:
            if archive is not None:
                client.instances.upload_workdir(instance.id, archive)
                note(f"workdir uploaded ({archive.files} files, {archive.size:,} bytes)")
            if run is None:
                run = client.runs.create(instance.id, RunCreate.of_task(spec))
        except ClientError as exc:
            explained = _explained(client, instance.id, exc)
            _release(client, instance.id, instance.name)  # nothing would ever release it
            raise explained from exc
        instance = wait_until_started(client, instance.id)
        task = f"task {spec.name!r}: " if spec.name else ""
        if instance.status == "running":
            note(f"instance {instance.name} is running; run {run.id}, {task}{first_line(spec.run)}")
        elif client.runs.get(run.id).started_at is not None:
            # A short run can start and end (and its instance be released) between two
            # polls: it still gets the line that says which run and command it was.
            note(f"run {run.id}, {task}{first_line(spec.run)}")
        end = stream_run(client, run.id)
    except KeyboardInterrupt:
        return _interrupted(client, instance)
    return finish_task(client, instance, run, end)


def finish_task(
    client: GpuleaseClient, instance: InstancePublic, run: RunPublic, end: EndEvent
) -> Attempt:
    """After the run's end: the runs the server queued again in its place followed, then
    its exit code for the shell and its one last line."""
    try:
        while (again := requeued_run(client, instance.id, run)) is not None:
            note(f"run {run.id} was interrupted; instance {instance.name} is queued again")
            run = again
            wait_until_started(client, instance.id)
            note(f"run {run.id} resumes the task:")
            end = stream_run(client, run.id)
    except KeyboardInterrupt:
        return _interrupted(client, instance)
    code = exit_code_of(client, run.id, end)
    try:
        note(finish_line(client, run.id, instance.id))
    except ClientError as exc:  # the run's own exit code still stands
        note(f"run {run.id} ended; its cost could not be read: {exc.message}")
    return Attempt(code, instance.id, instance.name, end)


def _interrupted(client: GpuleaseClient, instance: InstancePublic) -> Attempt:
    note(f"interrupted: releasing instance {instance.name}")
    _release(client, instance.id, instance.name)
    return Attempt(EXIT_INTERRUPTED, instance.id, instance.name, None)


def finish_line(client: GpuleaseClient, run_id: int, instance_id: int) -> str:
    """The one line `gpulease run` ends with: 'run 7 succeeded in 2 min 5 s, cost $0.0125;
    instance cat-3f9a released' (once its instance has settled, or said to be releasing)."""
    instance = wait_until_settled(client, instance_id, RELEASE_WAIT_S)
    run = client.runs.get(run_id)
    if run.status == "succeeded":
        outcome = "succeeded"
    elif run.exit_code is not None:
        outcome = f"failed with exit code {run.exit_code}"
    else:
        outcome = f"{run.status}: {run.status_reason}" if run.status_reason else run.status
    took = ""
    if run.started_at is not None and run.finished_at is not None:
        took = f" in {span(int((run.finished_at - run.started_at).total_seconds()))}"
    segments = client.billing.usage().segments
    charged = sum(s.charged_micro for s in segments if s.instance_id == instance_id)
    wallet = client.billing.balance()
    cost = format_credits(charged, symbol_of(wallet.balance, wallet.balance_micro))
    if instance.status == "released":
        where = f"instance {instance.name} released"
    elif instance.desired_state == "released":
        cost += " so far"
        where = f"instance {instance.name} is being released"
    else:
        where = f"instance {instance.name} {status_text(instance)}"
    return f"run {run.id} {outcome}{took}, cost {cost}; {where}"


def _explained(client: GpuleaseClient, instance_id: int, exc: ClientError) -> ClientError:
    """A refusal because the instance failed already (its runner could not start, say) is
    better told by the instance's own reason."""
    try:
        instance = client.instances.get(instance_id)
    except ClientError:
        return exc
    if instance.status == "failed":
        return ClientError(f"instance {instance.name} {status_text(instance)}")
    return exc


def _release(client: GpuleaseClient, instance_id: int, name: str) -> None:
    try:
        client.instances.release(instance_id)
    except ClientError as exc:
        error(
            f"could not release instance {name}: {exc.message}; "
            f"release it with `gpulease instance release {name}`"
        )


def logs(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="run id (see `gpulease runs`)")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new output")] = (
        False
    ),
) -> None:
    """Print a run's output (stdout and stderr as the job wrote them)."""
    with logged_in_client() as client:
        if follow:
            try:
                pending = client.runs.get(run_id)
                if pending.status == "pending":  # say what its instance waits for
                    wait_until_started(client, pending.instance_id)
                stream_run(client, run_id)
            except KeyboardInterrupt:
                raise typer.Exit(EXIT_INTERRUPTED) from None
            return
        after = -1
        while True:
            page = client.runs.logs(run_id, after, limit=5000)
            for chunk in page.chunks:
                write_chunk(chunk)
            if not page.chunks:
                return
            after = page.next_after


def runs(
    instance: Annotated[
        str | None, typer.Option("--instance", "-i", metavar="REF", help="only this instance's")
    ] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Your runs, newest first."""
    with logged_in_client() as client:
        instance_id = client.instances.get(instance).id if instance is not None else None
        found = client.runs.list(instance_id=instance_id)
        if output is OutputFormat.json:
            print_json(found)
            return
        held = {i.id: i for i in client.instances.list(include_released=True)}
    show_rows(
        found,
        ("ID", "INSTANCE", "TASK", "STATUS", "EXIT", "COMMAND", "CREATED", "FINISHED"),
        lambda r: (
            r.id,
            held[r.instance_id].name if r.instance_id in held else r.instance_id,
            r.task_name,
            _run_status(r, held.get(r.instance_id)),
            r.exit_code,
            first_line(own_command(r.command)),
            when(r.created_at),
            when(r.finished_at),
        ),
        empty="no runs yet",
    )


def _run_status(run: RunPublic, instance: InstancePublic | None) -> str:
    """A run's status; a pending one on a queued or starting instance says what it waits
    for ('pending: instance queued behind 2 other requests')."""
    if run.status == "pending" and instance is not None and instance.status in WAITING:
        return f"pending: instance {status_text(instance)}"
    return run.status
