"""Wire models for instances: create, show, resize, start."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class InstanceCreate(BaseModel):
    gpu: str | None = Field(default=None, max_length=80, description="MODEL:COUNT; none = CPU only")
    template: str = Field(default="pytorch", max_length=64)
    name: str | None = Field(default=None, max_length=64)
    auto_release: bool = False
    # A workdir upload follows: keep the instance queued until it has arrived.
    awaiting_workdir: bool = False
    plan: str = Field(default="on_demand", max_length=16, description="on_demand, daily, spot")
    team: str | None = Field(default=None, max_length=64, description="charge a team's wallet")
    start_when_cheap: bool = False
    auto_renew: bool = False
    # Datasets mounted read-only at /data/NAME, each at its version when the instance is made.
    datasets: list[str] = Field(default_factory=list, max_length=32)
    # Automatic stop (see AutostopUpdate); None: off (or the operator's idle ceiling).
    idle_util_pct: float | None = None
    idle_minutes: int | None = None
    max_runtime_minutes: int | None = None
    # A multi-node run: this many instances, one per node, started all together (a gang).
    num_nodes: int = Field(default=1, ge=1, le=64)


class InstancePublic(BaseModel):
    id: int
    name: str
    status: str
    desired_state: str
    status_reason: str
    status_message: str
    gpu_model: str
    gpu_count: int
    gpu_indices: list[int]
    simulated: bool
    template: str
    node: str | None
    hourly_micro: int
    hourly: str
    queue_position: int | None
    created_at: datetime
    started_at: datetime | None
    plan: str = "on_demand"
    team: str | None = None
    start_when_cheap: bool = False
    auto_renew: bool = False
    reserved_until: datetime | None = None
    datasets: dict[str, int] = Field(default_factory=dict)
    """Mounted datasets: name -> version."""
    # A member of a multi-node run: its gang (rank 0's id), its rank, the gang's size.
    gang_id: int | None = None
    gang_rank: int | None = None
    gang_size: int | None = None
    # A rank's address on the job fabric (GPULEASE_FABRIC_CIDR), which its gang's other ranks
    # reach it at; given when its gang is placed, held while a rank of its gang is live.
    fabric_address: str | None = None
    # A queued instance: the scheduler's reason, estimated start and what that estimate
    # rests on (None otherwise); and, queued or holding GPUs, where its expected duration
    # comes from ("declared 2 h", "learned from your last 5 runs of train", "no duration known").
    queue_reason: str | None = None
    queue_eta: datetime | None = None
    queue_eta_basis: str | None = None
    duration_basis: str | None = None
    # The node it last ran on (also while stopped): a start goes back there when it has
    # the GPUs, else the workspace moves to a node that has them.
    last_node: str | None = None
    # When its runner last saved the workspace to the server (at a stop on a fleet backend).
    workspace_saved_at: datetime | None = None


class ResizeRequest(BaseModel):
    gpu_model: str | None = Field(default=None, max_length=64, description="e.g. T4; CPU = none")
    gpu_count: int | None = Field(default=None, description="default 1")
    no_gpu: bool = False


class InstanceStart(BaseModel):
    # Start CPU only (the catalog's CPU price) for setup and data work; a later plain start
    # brings the instance's GPUs back.
    no_gpu: bool = False
