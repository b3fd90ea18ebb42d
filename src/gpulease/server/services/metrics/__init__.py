"""Metrics: runs' metric points and nodes' GPU samples (points.py, gpus.py)."""

from __future__ import annotations

from gpulease.server.services.metrics.gpus import (
    GpuReadingIn,
    gpu_heatmap,
    ingest_instance_samples,
    ingest_node_readings,
    instance_gpus,
    instance_samples_after,
    last_instance_sample_id,
    latest_gpu_samples,
)
from gpulease.server.services.metrics.points import (
    PointIn,
    WirePoint,
    ingest_points,
    parse_points,
    points_after,
    points_csv,
    series,
    store_points,
    store_run_points,
    store_run_points_on_loop,
)

__all__ = [
    "GpuReadingIn",
    "PointIn",
    "WirePoint",
    "gpu_heatmap",
    "ingest_instance_samples",
    "ingest_node_readings",
    "ingest_points",
    "instance_gpus",
    "instance_samples_after",
    "last_instance_sample_id",
    "latest_gpu_samples",
    "parse_points",
    "points_after",
    "points_csv",
    "series",
    "store_points",
    "store_run_points",
    "store_run_points_on_loop",
]
