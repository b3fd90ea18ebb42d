"""Wire models for cost and time estimates per catalog model."""

from __future__ import annotations

from pydantic import BaseModel


class EstimateRowPublic(BaseModel):
    gpu_model: str
    is_gpu: bool
    devices: int
    images_per_second: float
    basis: str  # published | derived | rough
    source: str
    gpu_hours: float
    wall_seconds: int
    hourly_micro: int
    cost_micro: int
    cost: str
    ncu: str


class EstimatePublic(BaseModel):
    model: str
    images: int
    epochs: int
    image_size: int
    gpus: int
    train_gflops_per_image: float
    total_pflops: float
    scaling_efficiency: float
    currency: str
    currency_symbol: str
    rows: list[EstimateRowPublic]
    skipped: list[str]
    notes: list[str]
