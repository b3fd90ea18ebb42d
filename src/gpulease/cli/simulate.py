"""`gpulease simulate`: replay a cluster trace through the scheduling policies, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpulease.cli.output import OutputFormat, OutputOption, console, fail, note

ROWS = (
    ("avg_jct", "JCT, average", "time"),
    ("median_jct", "JCT, median", "time"),
    ("p95_jct", "JCT, p95", "time"),
    ("avg_queue", "queueing delay, average", "time"),
    ("median_queue", "queueing delay, median", "time"),
    ("p95_queue", "queueing delay, p95", "time"),
    ("utilisation", "GPU utilisation", "pct"),
    ("fragmentation", "fragmentation", "pct"),
    ("fairness", "Jain's fairness (slowdown)", "ratio"),
    ("eta_within_10min", "first ETA within 10 min", "pct"),
    ("eta_within_25pct", "first ETA within 25 %", "pct"),
    ("eta_jobs", "jobs the ETA figures are over", "int"),
    ("preemptions", "preemptions", "int"),
)


def _cell(value: float, kind: str) -> str:
    if kind == "time":
        return f"{value:,.0f} s"
    if kind == "pct":
        return f"{value * 100:.1f} %"
    if kind == "ratio":
        return f"{value:.3f}"
    return f"{value:,.0f}"


def simulate(
    trace: Annotated[Path, typer.Argument(help="CSV trace, one job a row")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs in the simulated cluster")] = 2048,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node")] = 8,
    policy: Annotated[
        str, typer.Option("--policy", help="comma-separated: fifo,backfill,default,las,srtf")
    ] = "fifo,backfill,default,las,srtf",
    columns: Annotated[
        str,
        typer.Option(
            "--columns",
            help="FIELD=COLUMN pairs for submit, duration, gpus, user (and team, plan)",
        ),
    ] = "submit=timestamp,duration=duration,gpus=num_gpus,user=user",
    half_life: Annotated[
        float, typer.Option("--half-life", help="fair-share half-life in hours")
    ] = 168.0,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="PNG of queue length and utilisation")
    ] = None,
    eta_sample: Annotated[
        int,
        typer.Option(
            "--eta-sample",
            help="estimate the first start of every Nth job only (ETAs never change a "
            "decision; each is a forward simulation of the queue)",
        ),
    ] = 1,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Replay TRACE through the same schedule() the server runs, one policy at a time."""
    from gpulease.scheduler.model import Config
    from gpulease.scheduler.policy import POLICIES
    from gpulease.scheduler.simulator import simulate as run
    from gpulease.scheduler.traces import load_trace, parse_columns

    names = [p.strip() for p in policy.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if not names or unknown:
        fail(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from {', '.join(POLICIES)}", 2
        )
    if gpus_per_node < 1 or gpus < gpus_per_node:
        fail("--gpus-per-node must be at least 1 and --gpus at least one node's worth", 2)
    if eta_sample < 1:
        fail("--eta-sample must be at least 1 (1: every job)", 2)
    if half_life <= 0:
        fail("--half-life must be a positive number of hours", 2)
    if plot is not None:
        try:
            import PIL  # noqa: F401
        except ImportError:
            fail("--plot needs Pillow: pip install pillow (or drop --plot)", 2)
    jobs = load_trace(trace, parse_columns(columns))
    nodes = gpus // gpus_per_node
    results = []
    for name in names:
        note(f"simulating {name}: {len(jobs):,} jobs on {nodes} × {gpus_per_node} GPUs")
        config = Config(policy=name, half_life=half_life * 3600)
        results.append(
            run(
                jobs,
                nodes,
                gpus_per_node,
                config,
                samples=1000 if plot else 0,
                eta_sample=eta_sample,
            )
        )
    if results[0].dropped:
        note(f"{results[0].dropped} jobs need more GPUs than the cluster has; left out")
    if plot is not None:
        from gpulease.scheduler.plot import write_png

        write_png(plot, results)
        note(f"wrote {plot}")
    if output is OutputFormat.json:
        for r in results:
            typer.echo(json.dumps(r.figures()))
        return
    from rich.table import Table

    table = Table("", *(r.policy for r in results))
    for key, label, kind in ROWS:
        table.add_row(label, *(_cell(float(r.figures()[key]), kind) for r in results))
    console().print(table)
