"""Wire models for the catalog: GPU models, nodes and their GPUs, templates."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpulease.schemas.base import Model


class GpuModelPublic(BaseModel):
    name: str
    is_gpu: bool
    memory_gb: float
    peak_tflops: float
    ncu_factor: str
    hourly_micro: int
    hourly: str
    hourly_ncu: str = "0"
    daily_micro: int = 0
    daily: str = ""
    spot_hourly_micro: int = 0
    free: int
    total: int
    simulated: int
    # The CPU and memory share one GPU comes with (a CPU-only instance's for CPU), enforced
    # on the node; None: no node has this model.
    vcpus_per_gpu: float | None = None
    ram_gb_per_gpu: float | None = None


class GpuPublic(Model):
    index: int
    uuid: str
    nvml_name: str
    model: str | None
    memory_mb: int
    simulated: bool
    instance_id: int | None


class NodePublic(Model):
    id: int
    name: str
    backend: str
    hostname: str
    driver_version: str | None
    cuda_version: str | None
    cpu_count: int
    memory_mb: int
    status: str
    last_seen_at: datetime
    gpus: list[GpuPublic]


class TemplateAvailabilityPublic(Model):
    """Whether instances of one GPU model can run a template (services/templates)."""

    model: str
    available: bool
    reason: str | None = None  # why not, for people
    note: str | None = None  # how it runs when reduced (on the CPU, minor-version compat)
    free: int = 0  # free GPUs of the model on nodes that run the template
    total: int = 0


class TemplatePublic(BaseModel):
    name: str
    description: str
    python: str
    packages: list[str]
    cuda: str | None
    label: str = ""  # "PyTorch 2.14 cu130"
    extra_index_urls: list[str] = Field(default_factory=list)
    own: bool = False  # one of the caller's own templates (mine/NAME)
    status: str = "ready"  # own templates: pending | ready | failed
    error: str | None = None
    availability: list[TemplateAvailabilityPublic] = Field(default_factory=list)


class TemplateSave(BaseModel):
    name: str = Field(max_length=64, description="the new template's name; used as mine/NAME")
