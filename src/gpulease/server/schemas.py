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
    timezone: str = "UTC"


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


class TemplateAvailabilityPublic(BaseModel):
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
    read_at: datetime | None = None


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
    # streams the runner should connect: {"id", "kind": "terminal" | "jupyter", ...}
    streams: list[dict[str, str | int]] = Field(default_factory=list)
    # tasks for the runner: {"id": 3, "kind": "snapshot_env"} (services/templates)
    tasks: list[dict[str, str | int]] = Field(default_factory=list)


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


# Metrics and GPU samples (issue 6; services/metrics). Times are Unix seconds (floats),
# as uPlot and time.time() use them.


class RunnerMetricPoint(BaseModel):
    key: str = Field(max_length=200)
    step: int
    value: float
    time: float
    source: str = Field(default="sdk", max_length=16)


class RunnerMetrics(BaseModel):
    points: list[RunnerMetricPoint] = Field(max_length=5000)


class RunnerGpuSample(BaseModel):
    uuid: str = Field(max_length=80)
    time: float
    util_pct: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None


class RunnerGpuSamples(BaseModel):
    samples: list[RunnerGpuSample] = Field(max_length=1000)


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


# Notification channels and support tickets (issue 6)


class WebhookChannelPublic(BaseModel):
    url: str
    enabled: bool
    # None: every category of notification.
    kinds: list[str] | None
    # The last characters of the signing secret, to tell which one is in use.
    secret_hint: str


class EmailChannelPublic(BaseModel):
    address: str
    enabled: bool
    kinds: list[str] | None


class NotificationChannelsPublic(BaseModel):
    webhook: WebhookChannelPublic | None
    email: EmailChannelPublic | None
    # False when the server has no SMTP configured: email cannot be turned on.
    email_available: bool
    categories: list[str]
    # Shown once: set only in the answer that made or rotated the webhook's secret.
    webhook_secret: str | None = None


class NotificationChannelsUpdate(BaseModel):
    """Only the fields given change. An empty or null webhook_url or email removes it."""

    webhook_url: str | None = Field(default=None, max_length=2000)
    webhook_enabled: bool | None = None
    webhook_kinds: list[str] | None = None
    rotate_secret: bool = False
    email: str | None = Field(default=None, max_length=254)
    email_enabled: bool | None = None
    email_kinds: list[str] | None = None


class SupportMessagePublic(BaseModel):
    id: int
    author: str
    author_is_admin: bool
    body: str
    log_excerpt: str | None
    created_at: datetime


class SupportTicketPublic(BaseModel):
    id: int
    owner: str
    subject: str
    status: str
    instance: str | None
    run_id: int | None
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None


class SupportTicketDetail(SupportTicketPublic):
    messages: list[SupportMessagePublic]


class SupportTicketCreate(BaseModel):
    # Missing texts default to "" so that the service's message (not a bare 422) answers.
    subject: str = Field(default="", max_length=1000)
    body: str = ""
    # The instance's name or id, and a run of yours; attach_log adds the run's last lines.
    instance: str | None = Field(default=None, max_length=64)
    run_id: int | None = None
    attach_log: bool = False


class SupportReply(BaseModel):
    body: str = ""


# Automatic stop and start, resize and no-GPU mode (issue 4)


class AutostopUpdate(BaseModel):
    """The whole automatic-stop setting of an instance (PUT: a field left out turns it off)."""

    idle_util_pct: float | None = Field(
        default=None, description="GPU utilisation % under which it counts as idle (default 5)"
    )
    idle_minutes: int | None = Field(default=None, description="stop after this long idle")
    max_runtime_minutes: int | None = Field(
        default=None, description="stop after running this long"
    )
    stop_after_run: int | None = Field(default=None, description="stop when this run ends")


class AutostopPublic(BaseModel):
    instance_id: int
    idle_util_pct: float
    idle_minutes: int | None
    """What the owner set; None: not set."""
    idle_minutes_effective: int | None
    """What applies: the owner's setting under the operator's ceiling (None: no idle stop)."""
    idle_ceiling_minutes: int | None
    max_runtime_minutes: int | None
    stop_after_run: int | None
    last_activity_at: datetime | None
    idle_warned_at: datetime | None
    idle_stop_at: datetime | None
    """While warned: when the idle instance will be stopped."""
    max_runtime_stop_at: datetime | None


class ScheduleCreate(BaseModel):
    action: str = Field(max_length=8, description="start or stop")
    cron: str = Field(max_length=120, description='five fields, e.g. "0 9 * * 1-5"')
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone; default: your time zone"
    )


class SchedulePublic(Model):
    id: int
    instance_id: int
    action: str
    cron: str
    timezone: str
    next_fire_at: datetime
    last_fired_at: datetime | None
    created_at: datetime


class TimezoneUpdate(BaseModel):
    timezone: str = Field(max_length=64, description="IANA name, e.g. Europe/Berlin")


class ResizeRequest(BaseModel):
    gpu_model: str | None = Field(default=None, max_length=64, description="e.g. T4; CPU = none")
    gpu_count: int | None = Field(default=None, description="default 1")
    no_gpu: bool = False


class InstanceStart(BaseModel):
    # Start CPU only (the catalog's CPU price) for setup and data work; a later plain start
    # brings the instance's GPUs back.
    no_gpu: bool = False


# Own templates (services/templates)


class TemplateSave(BaseModel):
    name: str = Field(max_length=64, description="the new template's name; used as mine/NAME")


class RunnerTaskResult(BaseModel):
    """A runner's answer to a task: for snapshot_env the `pip freeze` lines, or an error."""

    packages: list[str] | None = Field(default=None, max_length=5000)
    python: str | None = Field(default=None, max_length=32)
    error: str | None = Field(default=None, max_length=8000)
