"""API schemas, named by intent. Routers build these from rows; rows never leave services."""

from __future__ import annotations

from datetime import date, datetime

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
    hourly_ncu: str = "0"
    daily_micro: int = 0
    daily: str = ""
    spot_hourly_micro: int = 0
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
    plan: str = Field(default="on_demand", max_length=16, description="on_demand, daily, spot")
    team: str | None = Field(default=None, max_length=64, description="charge a team's wallet")
    start_when_cheap: bool = False
    auto_renew: bool = False
    # Datasets mounted read-only at /data/NAME, each at its version when the instance is made.
    datasets: list[str] = Field(default_factory=list, max_length=32)


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
    user: str | None = Field(default=None, max_length=64)
    team: str | None = Field(default=None, max_length=64, description="grant to a team wallet")
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


# Estimates (issue 3, item 5): core.estimates figures per catalog model.


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


# Statements and revenue (issue 3, item 6). Amounts are signed from the wallet's side
# (charges negative) in lines and by_kind; `charged` and `credited` are both positive.


class UsageTotals(BaseModel):
    seconds: int
    gpu_seconds: int
    gpu_hours: float
    charged_micro: int
    charged: str
    credited_micro: int
    credited: str
    by_kind: dict[str, int]


class DayUsage(UsageTotals):
    day: date


class InstanceUsage(UsageTotals):
    instance_id: int
    name: str
    gpu_model: str
    gpu_count: int


class GpuModelUsage(UsageTotals):
    gpu_model: str


class KindTotal(BaseModel):
    kind: str
    transactions: int
    amount_micro: int
    amount: str


class StatementLine(BaseModel):
    day: date
    wallet: str
    instance_id: int | None
    instance: str | None
    gpu_model: str | None
    gpu_count: int
    kind: str
    seconds: int
    gpu_seconds: int
    amount_micro: int
    amount: str


class StatementPublic(BaseModel):
    user: str
    start: date
    end: date
    tz: str
    currency: str
    currency_symbol: str
    opening_balance_micro: int
    opening_balance: str
    closing_balance_micro: int
    closing_balance: str
    totals: UsageTotals
    by_kind: list[KindTotal]
    by_day: list[DayUsage]
    by_instance: list[InstanceUsage]
    by_gpu_model: list[GpuModelUsage]
    lines: list[StatementLine]


class RevenueTotals(BaseModel):
    gpu_seconds: int
    gpu_hours: float
    revenue_micro: int
    revenue: str
    by_kind: dict[str, int]


class RevenueDay(RevenueTotals):
    day: date


class RevenueModel(RevenueTotals):
    gpu_model: str | None


class RevenueModelDay(RevenueTotals):
    day: date
    gpu_model: str | None


class RevenueLine(BaseModel):
    day: date
    gpu_model: str | None
    kind: str
    gpu_seconds: int
    revenue_micro: int
    revenue: str


class RevenuePublic(BaseModel):
    start: date
    end: date
    tz: str
    currency: str
    currency_symbol: str
    totals: RevenueTotals
    by_gpu_model: list[RevenueModel]
    by_day: list[RevenueDay]
    """Every day of the period, empty ones too (a chart's x axis)."""
    by_model_day: list[RevenueModelDay]
    lines: list[RevenueLine]


# Datasets (services/datasets)


class DatasetPublic(Model):
    id: int
    name: str
    current_version: int | None
    file_count: int
    size_bytes: int
    created_at: datetime
    updated_at: datetime


class DatasetVersionPublic(Model):
    number: int
    file_count: int
    size_bytes: int
    chunk_count: int
    created_at: datetime


class DatasetUploadPublic(Model):
    id: int
    dataset_id: int
    state: str
    state_reason: str
    declared_files: int
    declared_bytes: int
    parts: int
    files_listed: int
    chunks_received: int
    bytes_received: int
    """What the server received through this push: a resumed push sends only the rest."""
    version: int | None
    created_at: datetime
    updated_at: datetime


class DatasetDetail(BaseModel):
    dataset: DatasetPublic
    versions: list[DatasetVersionPublic]
    pushes: list[DatasetUploadPublic]
    mounted_by: list[str]


class StorageUsage(BaseModel):
    used_bytes: int
    quota_bytes: int


class DatasetList(BaseModel):
    datasets: list[DatasetPublic]
    usage: StorageUsage


class DatasetUploadCreate(BaseModel):
    name: str = Field(max_length=1000)  # the service says what a valid name is
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)


class DatasetFileEntry(BaseModel):
    path: str = Field(max_length=4096)
    size: int = Field(ge=0)
    chunks: list[str] = Field(max_length=1_000_000)
    """SHA-256 (hex) of each 4 MiB chunk, in order; none for an empty file."""


class DatasetFilesPart(BaseModel):
    files: list[DatasetFileEntry] = Field(max_length=10_000)


class DatasetMissingChunks(BaseModel):
    missing: list[str]
    missing_bytes: int


class DatasetChunksReceived(BaseModel):
    chunks: int
    bytes: int
    new_chunks: int


class DatasetCommit(BaseModel):
    parts: int = Field(ge=0)
    files: int = Field(ge=0)
    bytes: int = Field(ge=0)


class RunnerDatasetMount(BaseModel):
    name: str
    dataset_id: int
    owner_id: int
    version: int
    file_count: int
    size_bytes: int


class RunnerDatasets(BaseModel):
    datasets: list[RunnerDatasetMount]


class RunnerChunkRequest(BaseModel):
    chunks: list[str] = Field(max_length=4096)


class DatasetRemoved(BaseModel):
    name: str
    freed_chunks: int
    freed_bytes: int


# Billing (issue 3)


class OffPeakCreate(BaseModel):
    weekdays: str = Field(default="all", max_length=40, description="mon-fri, sat,sun, all")
    start: str = Field(max_length=5, description="HH:MM local time")
    end: str = Field(max_length=5, description="HH:MM local time; before start = past midnight")
    discount: str = Field(max_length=8, description="percent, e.g. '40' or '40%'")


class OffPeakPublic(BaseModel):
    id: int
    weekdays: list[str]
    start: str
    end: str
    discount_percent: str
    tz: str


class VoucherCreate(BaseModel):
    amount: str = Field(max_length=40)
    code: str | None = Field(default=None, max_length=64)
    expires_at: datetime | None = None
    max_redemptions: int = 1
    per_user_limit: int = 1


class VoucherPublic(BaseModel):
    id: int
    code: str
    amount_micro: int
    amount: str
    expires_at: datetime | None
    max_redemptions: int
    per_user_limit: int
    used: int


class VoucherRedeem(BaseModel):
    code: str = Field(max_length=64)


class LimitsUpdate(BaseModel):
    """Amounts as decimal strings; null removes a cap."""

    max_hourly: str | None = Field(default=None, max_length=40)
    monthly_budget: str | None = Field(default=None, max_length=40)
    low_balance: str | None = Field(default=None, max_length=40)


class AdminLimitsUpdate(BaseModel):
    max_hourly: str | None = Field(default=None, max_length=40)
    monthly_budget: str | None = Field(default=None, max_length=40)


class LimitsPublic(BaseModel):
    max_hourly_micro: int | None
    monthly_budget_micro: int | None
    admin_max_hourly_micro: int | None
    admin_monthly_budget_micro: int | None
    low_balance_micro: int | None
    effective_max_hourly_micro: int | None
    effective_monthly_budget_micro: int | None
    hourly_spend_micro: int
    month_spend_micro: int


class TeamCreate(BaseModel):
    name: str = Field(max_length=64)


class TeamMemberUpdate(BaseModel):
    monthly_limit: str | None = Field(default=None, max_length=40)


class TeamMemberPublic(BaseModel):
    user: str
    monthly_limit_micro: int | None
    month_spend_micro: int


class TeamPublic(BaseModel):
    name: str
    owner: str
    balance_micro: int
    balance: str
    members: list[TeamMemberPublic]


class PlanQuote(BaseModel):
    plan: str
    hourly_micro: int
    hourly: str
    hourly_ncu: str
    block_micro: int | None
    rules: str
