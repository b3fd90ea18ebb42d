"""`gpulease metrics RUN_ID`: the latest value, range and count of each metric of a run."""

from __future__ import annotations

from typing import Annotated

import typer

from gpulease.cli.connection import fetch
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    emit,
    show_rows,
)
from gpulease.schemas.metrics import RunMetrics


def _number(value: float | None) -> str | None:
    return None if value is None else f"{value:.6g}"


def metrics(
    run_id: Annotated[int, typer.Argument(metavar="RUN_ID", help="the run (see `gpulease runs`)")],
    key: Annotated[
        list[str] | None,
        typer.Option("--key", "-k", help="only this metric (repeatable), e.g. --key loss"),
    ] = None,
    max_points: Annotated[
        int, typer.Option("--max-points", help="points per curve in -o json (10 to 20000)")
    ] = 2000,
    output: OutputOption = OutputFormat.table,
) -> None:
    """The metrics a run logged: latest step and value, lowest, highest, how many points.

    A step that came by more than one way (the SDK and a stdout line) is one point, with
    the SDK's value (then TensorBoard's, then stdout's). -o json prints each curve too
    (downsampled to --max-points, extremes kept).
    """
    emit(
        fetch(lambda client: client.runs.metrics(run_id, key or None, max_points=max_points)),
        output,
        lambda f: _show_metrics(f, run_id, key),
    )


def _show_metrics(found: RunMetrics, run_id: int, key: list[str] | None) -> None:
    show_rows(
        [s for s in found.series if s.raw_count],
        ("KEY", "STEP", "LATEST", "MIN", "MAX", "POINTS"),
        lambda s: (
            s.key,
            s.last_step,
            _number(s.last_value),
            _number(s.min),
            _number(s.max),
            s.count,
        ),
        title=f"run {run_id}",
        empty=f"run {run_id} has no metrics"
        + (f" named {', '.join(key)}" if key else "")
        + " yet; log some with `from gpulease import track; track.log(step, loss=…)`",
    )
