"""`gpulease estimate`: what training an image classifier would take on each GPU model."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

import typer

from gpulease.cli.connection import fetch
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    console,
    emit,
    note,
    show_rows,
)
from gpulease.core.durations import span
from gpulease.core.estimates import MODELS
from gpulease.schemas.estimates import EstimatePublic, EstimateRowPublic


def wall_time(seconds: int) -> str:
    """An estimate's wall time, to the minute past the first: '45 s', '20 min', '3 h 12 min'."""
    return span(seconds if seconds < 60 else round(seconds / 60) * 60)


def ncu_text(value: str) -> str:
    amount = Decimal(value)
    if 0 < amount < Decimal("0.0001"):
        return "<0.0001"
    return f"{amount:.4f}"


MODEL_HELP = "one of: " + ", ".join(m.name for m in MODELS)


def estimate(
    model: Annotated[str, typer.Option("--model", "-m", help=MODEL_HELP)],
    images: Annotated[int, typer.Option("--images", help="training images per epoch")],
    epochs: Annotated[int, typer.Option("--epochs", help="passes over the images")],
    image_size: Annotated[int, typer.Option("--image-size", help="pixels per side")] = 224,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per instance")] = 1,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Expected GPU-hours, wall time, NCU and cost of training an image classifier, for
    every GPU model in this server's catalog, at its prices."""
    emit(
        fetch(
            lambda client: client.estimates.get(
                model, images, epochs, image_size=image_size, gpus=gpus
            )
        ),
        output,
        _show_estimate,
    )


def _gpu_cell(row: EstimateRowPublic) -> str:
    if row.is_gpu and row.devices > 1:
        return f"{row.gpu_model} × {row.devices}"
    return row.gpu_model if row.is_gpu else f"{row.gpu_model} (rough)"


def _show_estimate(found: EstimatePublic) -> None:
    title = (
        f"{found.model}: {found.images:,} images × {found.epochs:,} epochs at "
        f"{found.image_size}×{found.image_size}, {found.gpus} GPU"
        + ("s" if found.gpus > 1 else "")
        + f" ({found.total_pflops:,.1f} PFLOP)"
    )
    show_rows(
        found.rows,
        ("GPU", "IMG/S", "GPU-HOURS", "WALL TIME", "NCU", "COST", "BASIS"),
        lambda row: (
            _gpu_cell(row),
            f"{row.images_per_second:,.0f}",
            f"{row.gpu_hours:,.3f}",
            wall_time(row.wall_seconds),
            ncu_text(row.ncu),
            row.cost,
            row.basis,
        ),
        empty="the catalog has no models to estimate",
        title=title,
    )
    if found.gpus > 1:
        console().print(
            f"{found.gpus} GPUs at {found.scaling_efficiency:.0%} scaling efficiency",
            markup=False,
        )
    for line in found.notes:
        note(line)
