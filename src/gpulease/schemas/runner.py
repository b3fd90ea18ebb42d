"""The runner protocol's bodies (docs/runner-protocol.md): what a runner and the server exchange."""

from __future__ import annotations

from pydantic import BaseModel, Field


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


class RunnerTaskResult(BaseModel):
    """A runner's answer to a task: for snapshot_env the `pip freeze` lines, or an error."""

    packages: list[str] | None = Field(default=None, max_length=5000)
    python: str | None = Field(default=None, max_length=32)
    error: str | None = Field(default=None, max_length=8000)
