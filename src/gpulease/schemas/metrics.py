"""Wire models for metric series and GPU samples.

Times are Unix seconds (floats), as uPlot and time.time() use them.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from gpulease.schemas.runs import RunPublic

# A metric key (docs/metrics.md): the runner parses and filters with it, the server refuses
# a batch with a key outside it. gpulease.track, which must stay standard-library only inside
# instances, carries the same pattern (tests check that they agree).
METRIC_KEY = r"[A-Za-z_][A-Za-z0-9_./-]{0,63}"
METRIC_KEY_PATTERN = re.compile(rf"^{METRIC_KEY}$")


class MetricSeries(BaseModel):
    """One key's curve, at most max_points of it (min and max of each stretch kept)."""

    key: str
    raw_count: int  # stored points of this key, every source
    count: int  # distinct steps before downsampling
    downsampled: bool
    steps: list[int]
    values: list[float]
    times: list[float]
    last_step: int | None
    last_value: float | None
    min: float | None
    max: float | None


class RunMetrics(BaseModel):
    run: RunPublic
    keys: list[str]  # every key the run has
    max_points: int
    last_point_id: int  # stream with since=-1:<this> for only newer points
    series: list[MetricSeries]


class RunsCompared(BaseModel):
    key: str
    runs: list[RunMetrics]


class MetricPointPublic(BaseModel):
    id: int
    key: str
    step: int
    value: float
    time: float
    source: str


class GpuSamplePublic(BaseModel):
    id: int
    uuid: str
    instance_id: int | None
    time: float
    util_pct: float | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    power_w: float | None
    temperature_c: float | None


class GpuSeries(BaseModel):
    times: list[float]
    util_pct: list[float | None]
    memory_used_mb: list[float | None]
    power_w: list[float | None]
    temperature_c: list[float | None]


class InstanceGpu(BaseModel):
    uuid: str
    index: int | None = None
    model: str | None = None
    nvml_name: str | None = None
    memory_mb: int | None = None
    simulated: bool
    held: bool  # the instance holds it now
    latest: GpuSamplePublic | None
    series: GpuSeries


class InstanceGpus(BaseModel):
    instance_id: int
    minutes: int
    last_sample_id: int
    gpus: list[InstanceGpu]


class HeatmapGpu(BaseModel):
    uuid: str
    index: int
    model: str | None
    nvml_name: str
    memory_mb: int
    simulated: bool
    instance_id: int | None
    util: list[float | None]


class HeatmapNode(BaseModel):
    id: int
    name: str
    gpus: list[HeatmapGpu]


class GpuHeatmap(BaseModel):
    start: float
    end: float
    bucket_s: int
    buckets: list[float]
    nodes: list[HeatmapNode]
