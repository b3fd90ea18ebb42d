"""Training-time and cost estimates for an image classifier on each catalog GPU model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from gpulease.core import estimates
from gpulease.core.catalog import Catalog
from gpulease.core.money import format_credits
from gpulease.schemas.estimates import EstimatePublic, EstimateRowPublic
from gpulease.server.routers.deps import CurrentUser, runtime

router = APIRouter(tags=["estimates"])

NOTES = (
    "Compute only, at published (tuned, mixed-precision) throughput: setup, uploads, "
    "evaluation and idle time are not included; a plain PyTorch loop is often slower.",
    "NCU is the cost in A100-days at this server's prices (1 NCU = one A100 for 24 hours).",
    "basis: published = NVIDIA's measured ResNet-50 figure for that GPU; derived = scaled "
    "from published figures (other GPUs, other models); rough = order of magnitude.",
)


def estimate_public(found: estimates.Estimate, catalog: Catalog) -> EstimatePublic:
    symbol = catalog.currency_symbol
    req = found.request
    notes = list(NOTES)
    if found.skipped:
        notes.append(f"no throughput figure for: {', '.join(found.skipped)}")
    return EstimatePublic(
        model=req.model.name,
        images=req.images,
        epochs=req.epochs,
        image_size=req.image_size,
        gpus=req.gpus,
        train_gflops_per_image=round(found.train_gflops_per_image, 3),
        total_pflops=round(found.total_pflops, 3),
        scaling_efficiency=round(found.scaling_efficiency, 3),
        currency=catalog.currency_name,
        currency_symbol=symbol,
        rows=[
            EstimateRowPublic(
                gpu_model=row.gpu_model,
                is_gpu=row.is_gpu,
                devices=row.devices,
                images_per_second=round(row.images_per_second, 1),
                basis=row.basis,
                source=row.source,
                gpu_hours=round(row.gpu_hours, 4),
                wall_seconds=row.wall_seconds,
                hourly_micro=row.hourly_micro,
                cost_micro=row.cost_micro,
                cost=format_credits(row.cost_micro, symbol),
                ncu=f"{row.ncu:.6f}",
            )
            for row in found.rows
        ],
        skipped=list(found.skipped),
        notes=notes,
    )


Text = Annotated[str | None, Query(max_length=64)]


@router.get("/estimate")
def estimate(
    _: CurrentUser,
    request: Request,
    model: Text = None,
    images: Text = None,
    epochs: Text = None,
    image_size: Text = None,
    gpus: Text = None,
) -> EstimatePublic:
    """GPU-hours, wall time, cost and NCU of training `model` on every catalog GPU model.
    Inputs are parsed here rather than by FastAPI so that a refusal lists what is valid."""
    catalog = runtime(request).catalog
    req = estimates.parse_request(model, images, epochs, image_size, gpus)
    return estimate_public(estimates.estimate(catalog, req), catalog)
