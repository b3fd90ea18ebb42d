"""`gpulease sweep`: run a task once per point of a search space, watch the trials, name the
best; `gpulease sweep ls` and `gpulease sweep show`."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from gpulease.cli.connection import logged_in_client
from gpulease.cli.instances import DatasetOption, MaxDurationOption, max_runtime_of
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    console,
    emit,
    emit_rows,
    error,
    fail,
    note,
    show_rows,
    when,
)
from gpulease.cli.runs import EXIT_INTERRUPTED, EnvOption, load_task, parse_env, pick_accelerators
from gpulease.client import ClientError, GpuleaseClient, WorkdirArchive, pack_workdir
from gpulease.core.sweeps import make_space, params_text, parse_grid, parse_range
from gpulease.core.taskspec import TaskSpec
from gpulease.schemas.sweeps import (
    SweepCreate,
    SweepPublic,
    SweepRange,
    SweepSpace,
    SweepTask,
    SweepTrialPublic,
)

POLL_INTERVAL_S = 2.0


class _StartByDefault(TyperGroup):
    """`gpulease sweep task.yaml ...` is `gpulease sweep start task.yaml ...`: anything that
    is not one of the group's commands (or --help) starts a sweep."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["start", *args]
        result: list[str] = super().parse_args(ctx, args)
        return result


sweep_app = typer.Typer(
    cls=_StartByDefault,
    help="Hyperparameter sweeps: one task run once per point of a grid or of random draws, "
    "each trial on its own instance; `gpulease sweep task.yaml --grid lr=0.1,0.01`.",
    no_args_is_help=True,
)


@sweep_app.command("start")
def start(
    args: Annotated[
        list[str],
        typer.Argument(
            metavar="TASK.yaml | -- COMMAND...",
            help="a task file, or a command after --; ${name} in it takes each trial's value",
            show_default=False,
        ),
    ],
    grid: Annotated[
        list[str] | None,
        typer.Option("--grid", metavar="NAME=V1,V2", help="values to try (repeatable)"),
    ] = None,
    ranges: Annotated[
        list[str] | None,
        typer.Option(
            "--range", metavar="NAME=LOW:HIGH[:log|int]", help="drawn by --random (repeatable)"
        ),
    ] = None,
    random_trials: Annotated[
        int | None, typer.Option("--random", metavar="N", help="N random trials, not the grid")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="the random draws' seed")] = None,
    metric: Annotated[
        str | None, typer.Option("--metric", help="the metric that names the best trial")
    ] = None,
    maximise: Annotated[bool, typer.Option("--max", help="the highest is best (default)")] = False,
    minimise: Annotated[bool, typer.Option("--min", help="the lowest is best")] = False,
    stop_early: Annotated[
        bool,
        typer.Option("--stop-early", help="stop trials clearly behind (median stopping rule)"),
    ] = False,
    min_steps: Annotated[
        int, typer.Option("--min-steps", min=1, help="points a trial reports before it is judged")
    ] = 5,
    min_trials: Annotated[
        int,
        typer.Option("--min-trials", min=1, help="other trials it is judged against, at least"),
    ] = 2,
    gpu: Annotated[str | None, typer.Option("--gpu", help="MODEL:COUNT per trial")] = None,
    template: Annotated[str | None, typer.Option("--template", help="default: pytorch")] = None,
    env: EnvOption = None,
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="upload this directory into each trial")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="the sweep's name")] = None,
    dataset: DatasetOption = None,
    spot: Annotated[bool, typer.Option("--spot", help="the spot plan for every trial")] = False,
    team: Annotated[str | None, typer.Option("--team", help="charge this team's wallet")] = None,
    max_duration: MaxDurationOption = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="start the trials and return; no watching")
    ] = False,
) -> None:
    """Start a sweep: each trial runs the task on its own instance with its values as
    upper-case variables (lr → $LR) and in place of ${lr}; then watch them and name the best.

    gpulease sweep task.yaml --grid lr=0.1,0.01 --grid batch=32,64 --metric val_acc --max
    gpulease sweep task.yaml --random 8 --range lr=1e-4:1e-1:log --seed 1 --stop-early
    """
    if maximise and minimise:
        fail("give --max or --min, not both", 2)
    parsed_grid = dict(parse_grid(text) for text in grid or [])
    parsed_ranges = [parse_range(text) for text in ranges or []]
    make_space(parsed_grid, parsed_ranges, random_trials, seed or 0)  # refused before renting
    spec, directory = load_task(
        args, gpu=gpu, template=template, env=parse_env(env), workdir=workdir, name=None
    )
    if spec.num_nodes > 1:
        fail("a sweep runs each trial on one node; leave num_nodes out of the task file", 2)
    if dataset:
        spec = replace(spec, datasets=tuple(dict.fromkeys((*spec.datasets, *dataset))))
    body = SweepCreate(
        name=name,
        task=_sweep_task(spec, spot=spot, team=team, max_runtime=max_runtime_of(max_duration)),
        space=SweepSpace(
            grid={k: list(v) for k, v in parsed_grid.items()},
            ranges=[
                SweepRange(name=r.name, low=r.low, high=r.high, scale=r.scale)
                for r in parsed_ranges
            ],
            random=random_trials,
            seed=seed,
        ),
        metric=metric,
        goal="min" if minimise else "max",
        stop_early=stop_early,
        min_steps=min_steps,
        min_trials=min_trials,
    )
    archive = pack_workdir(directory) if directory is not None else None
    try:
        with logged_in_client() as client:
            sweep = _create(client, spec, body, archive)
            if detach:
                _show_trials(client.sweeps.get(sweep.id))
                note(f"follow it with `gpulease sweep show {sweep.id}`")
                return
            try:
                raise typer.Exit(watch(client, sweep))
            except KeyboardInterrupt:
                note(f"sweep {sweep.id} keeps running; see `gpulease sweep show {sweep.id}`")
                raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        if archive is not None:
            archive.close()


def _sweep_task(
    spec: TaskSpec, *, spot: bool, team: str | None, max_runtime: int | None
) -> SweepTask:
    return SweepTask(
        name=spec.name,
        run=spec.run or "",
        setup=spec.setup,
        envs=spec.envs,
        skypilot=spec.skypilot,
        gpu=spec.accelerators,
        template=spec.template,
        plan="spot" if spec.use_spot or spot else "on_demand",
        team=team or spec.team,
        datasets=list(spec.datasets),
        start_when_cheap=spec.start_when_cheap,
        max_runtime_minutes=max_runtime or spec.max_duration_minutes,
    )


def _create(
    client: GpuleaseClient, spec: TaskSpec, body: SweepCreate, archive: WorkdirArchive | None
) -> SweepPublic:
    """Start the sweep and upload the workdir into each trial; on a failed upload every
    trial's instance is released (nothing would run them as asked)."""
    if spec.accelerator_choices:
        picked, line = pick_accelerators(
            spec.accelerator_choices, client.catalog.gpus(), spec.cpus, spec.memory_gb
        )
        if line is not None:
            note(line)
        body.task.gpu = picked
    body.task.awaiting_workdir = archive is not None
    sweep = client.sweeps.create(body)
    gpu = body.task.gpu or "CPU"
    note(
        f"sweep {sweep.id}: {len(sweep.trials)} trials on {gpu} each, estimated "
        f"{sweep.estimated} in all"
    )
    if archive is not None:
        try:
            for trial in sweep.trials:
                client.instances.upload_workdir(trial.instance_id, archive)
        except ClientError as exc:
            for trial in sweep.trials:
                try:
                    client.instances.release(trial.instance_id)
                except ClientError:
                    error(f"could not release instance {trial.instance_name}")
            raise ClientError(
                f"the workdir upload failed, so the sweep's trials were released: {exc.message}"
            ) from exc
        note(f"workdir uploaded to {len(sweep.trials)} trials ({archive.size:,} bytes each)")
    return sweep


def watch(client: GpuleaseClient, sweep: SweepPublic) -> int:
    """Print each trial's changes until every trial has ended, then the best trial. The
    exit code: 0, or 1 when the sweep's metric names no best trial."""
    seen = {t.index: t.status for t in sweep.trials}
    while not sweep.finished:
        time.sleep(POLL_INTERVAL_S)
        sweep = client.sweeps.get(sweep.id)
        for trial in sweep.trials:
            if seen.get(trial.index) != trial.status:
                seen[trial.index] = trial.status
                note(f"trial {trial.index} ({params_text(trial.params)}): {trial.status}")
    _show_trials(sweep)
    return _say_best(sweep)


def _say_best(sweep: SweepPublic) -> int:
    if sweep.metric is None:
        return 0
    best = next((t for t in sweep.trials if t.index == sweep.best_trial), None)
    if best is None:
        error(sweep.metric_note or f"no trial reported {sweep.metric}")
        return 1
    console().print(
        f"best: trial {best.index} ({params_text(best.params)}), {sweep.metric} {best.best:.6g}"
        f" ({sweep.goal}), run {best.run_id}",
        markup=False,
    )
    return 0


def _metric_cell(trial: SweepTrialPublic) -> str:
    return "" if trial.best is None else f"{trial.best:.6g}"


def _show_trials(sweep: SweepPublic) -> None:
    metric = sweep.metric or "METRIC"
    show_rows(
        sweep.trials,
        ("TRIAL", "PARAMS", "INSTANCE", "RUN", "STATUS", f"BEST {metric.upper()}", "STEP"),
        lambda t: (
            f"{t.index}{' *' if t.index == sweep.best_trial else ''}",
            params_text(t.params),
            t.instance_name,
            t.run_id,
            t.status,
            _metric_cell(t),
            t.last_step,
        ),
        empty="no trials",
        title=f"sweep {sweep.id}" + (f" {sweep.name}" if sweep.name else ""),
    )


def _counts_text(sweep: SweepPublic) -> str:
    return ", ".join(f"{n} {state.replace('_', ' ')}" for state, n in sorted(sweep.counts.items()))


@sweep_app.command("ls")
def ls(output: OutputOption = OutputFormat.table) -> None:
    """Your sweeps, newest first."""
    with logged_in_client() as client:
        found = client.sweeps.list()
    emit_rows(
        found,
        output,
        ("ID", "NAME", "TRIALS", "STATE", "METRIC", "BEST TRIAL", "ESTIMATED", "CREATED"),
        lambda s: (
            s.id,
            s.name,
            len(s.trials),
            _counts_text(s),
            f"{s.metric} ({s.goal})" if s.metric else "",
            s.best_trial,
            s.estimated,
            when(s.created_at),
        ),
        empty="no sweeps yet; start one with `gpulease sweep task.yaml --grid lr=0.1,0.01`",
    )


@sweep_app.command("show")
def show(
    sweep_id: Annotated[
        int, typer.Argument(metavar="SWEEP", help="sweep id (`gpulease sweep ls`)")
    ],
    metric: Annotated[
        str | None, typer.Option("--metric", help="rank the trials by this metric instead")
    ] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """A sweep's trials, their status and best value of the metric, and the best trial."""
    with logged_in_client() as client:
        sweep = client.sweeps.get(sweep_id, metric=metric)
    emit(sweep, output, _show_sweep)
    if output is OutputFormat.table and sweep.finished and _best_missing(sweep):
        raise typer.Exit(1)


def _best_missing(sweep: SweepPublic) -> bool:
    return sweep.metric is not None and sweep.best_trial is None


def _show_sweep(sweep: SweepPublic) -> None:
    _show_trials(sweep)
    state = "ended" if sweep.finished else "running"
    stop = f"; stops trials behind after {sweep.min_steps} points" if sweep.stop_early else ""
    console().print(
        f"{state}: {_counts_text(sweep)}; estimated {sweep.estimated}{stop}", markup=False
    )
    if sweep.metric is not None:
        if sweep.best_trial is not None:
            _say_best(sweep)
        elif sweep.metric_note:
            (error if sweep.finished else note)(sweep.metric_note)
