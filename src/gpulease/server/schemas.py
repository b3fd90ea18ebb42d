"""API schemas, named by intent. Routers build these from rows; rows never leave services."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class UserPublic(Model):
    id: int
    name: str
    role: str
    created_at: datetime


class RegisterRequest(BaseModel):
    name: str = Field(max_length=64)
    password: str = Field(max_length=1024)
    email: str | None = Field(default=None, max_length=254)


class LoginRequest(BaseModel):
    name: str = Field(max_length=64)
    password: str = Field(max_length=1024)
    token_name: str = Field(default="cli login", max_length=100)


class TokenPublic(Model):
    id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreate(BaseModel):
    name: str = Field(max_length=100)


class TokenCreated(BaseModel):
    token: str
    info: TokenPublic


class AuthResult(BaseModel):
    token: str
    user: UserPublic


class GpuModelPublic(BaseModel):
    name: str
    is_gpu: bool
    memory_gb: float
    peak_tflops: float
    ncu_factor: str
    hourly_micro: int
    hourly: str
    free: int
    total: int
    simulated: int


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


class TemplatePublic(BaseModel):
    name: str
    description: str
    python: str
    packages: list[str]
    cuda: str | None


class InstanceCreate(BaseModel):
    gpu: str | None = Field(default=None, max_length=80, description="MODEL:COUNT; none = CPU only")
    template: str = Field(default="pytorch", max_length=64)
    name: str | None = Field(default=None, max_length=64)
    auto_release: bool = False
    # A workdir upload follows: keep the instance queued until it has arrived.
    awaiting_workdir: bool = False


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


class RunCreate(BaseModel):
    command: str
    env: dict[str, str] = Field(default_factory=dict)
    stop_instance_on_exit: bool = False


class RunPublic(Model):
    id: int
    instance_id: int
    command: str
    status: str
    status_reason: str
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class LogChunkPublic(Model):
    seq: int
    stream: str
    data: str
    time: datetime


class LogPage(BaseModel):
    run: RunPublic
    chunks: list[LogChunkPublic]
    next_after: int


class Balance(BaseModel):
    balance_micro: int
    balance: str
    currency: str
    ncu: str


class LedgerLine(BaseModel):
    id: int
    kind: str
    memo: str
    amount_micro: int
    amount: str
    instance_id: int | None
    created_at: datetime


class UsageSegmentPublic(Model):
    id: int
    instance_id: int
    gpu_model: str
    gpu_count: int
    hourly_micro: int
    started_at: datetime
    ended_at: datetime | None
    billed_seconds: int
    charged_micro: int


class Usage(BaseModel):
    segments: list[UsageSegmentPublic]
    ledger: list[LedgerLine]


class GrantCreate(BaseModel):
    user: str = Field(max_length=64)
    amount: str = Field(max_length=40, description="credits, e.g. '25.00'")
    memo: str = Field(default="admin grant", max_length=200)


class NotificationPublic(Model):
    id: int
    kind: str
    message: str
    created_at: datetime


# Runner protocol bodies (docs/runner-protocol.md)


class RunnerStatus(BaseModel):
    message: str = Field(default="", max_length=2000)


class RunnerReady(BaseModel):
    pid: int | None = None
    python: str | None = None


class RunnerHeartbeat(BaseModel):
    running_runs: list[int] = Field(default_factory=list)


class RunnerAction(BaseModel):
    action: str


class RunnerRun(BaseModel):
    id: int
    command: str
    env: dict[str, str]


class RunnerCommands(BaseModel):
    runs: list[RunnerRun]


class RunnerStarted(BaseModel):
    pid: int | None = None


class RunnerLogChunk(BaseModel):
    seq: int
    stream: str = Field(max_length=8)
    data: str
    time: float


class RunnerLogs(BaseModel):
    chunks: list[RunnerLogChunk] = Field(max_length=10_000)


class RunnerExit(BaseModel):
    exit_code: int


class RunnerFailed(BaseModel):
    reason: str = Field(max_length=20_000)
