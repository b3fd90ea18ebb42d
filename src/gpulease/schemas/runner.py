"""The runner protocol's bodies (docs/runner-protocol.md): what a runner and the server exchange.

Both ends use these models: the server's routes take and return them, the runner builds its
bodies with them and reads the answers through them. RunnerSpec is what a backend hands a
runner at start.
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass

from gpulease.core.templates import Template

RUNNER_API = "/runner/v1"  # every runner call's path starts with it
# A runner's session token (POST /session): made by the runner, 256 bits, url-safe base64.
SESSION_TOKEN_PREFIX = "glr_"
SESSION_TOKEN_PATTERN = r"^glr_[A-Za-z0-9_-]{43,}$"


@dataclass(frozen=True)
class FabricLink:
    """A rank's interface on the job fabric (docs/ray.md): a macvlan of the node's fabric
    parent moved into the instance's network namespace before any job starts. The server
    gives the address and the peers; the node's own settings give the parent."""

    address: str  # the rank's address with the fabric's prefix length, "10.213.0.4/16"
    peers: tuple[str, ...] = ()  # the other ranks' addresses: all the interface may reach
    interface: str = "fabric0"  # its name in the namespace (GLOO_/NCCL_SOCKET_IFNAME)
    parent: str | None = None  # the node's GPULEASE_FABRIC_PARENT
    parent_netns: str | None = None  # the node's GPULEASE_FABRIC_NETNS; None: the host's


@dataclass(frozen=True)
class RunnerSpec:
    """Everything a runner needs to serve one instance. Written to a 0600 file in run_dir
    (never argv, never a path the sandbox binds); JSON through pydantic (to_json/from_json).

    `token` is the launch secret: it works until the runner opens its session
    (POST /session), which replaces it with a token only the runner process holds.
    """

    instance_id: int
    server_url: str
    token: str
    workspace: Path
    run_dir: Path  # the runner's own files: spec, log, state; outside the workspace
    env_cache: Path  # where template environments are built and shared between instances
    template: Template
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    heartbeat_interval_s: float = 2.0
    extra_env: dict[str, str] = field(default_factory=dict)
    # Run every job in the bubblewrap sandbox (runner/sandbox.py). False only on a server
    # started with GPULEASE_UNSANDBOXED_SINGLE_USER=true.
    sandbox: bool = False
    # PEM of the certificate the runner trusts for an https server_url, exactly it (the
    # server's self-signed one); None: the usual CA verification.
    server_certificate: str | None = None
    # Where dataset versions are materialised on the node (runner/datasets.py), shared by
    # the node's instances; None: beside run_dir's parent, in ../datasets.
    dataset_cache: Path | None = None
    # How often the runner samples its GPUs through NVML (runner/metrics.py); 0: never.
    gpu_sample_interval_s: float = 5.0
    # The server's Unix socket on this node (server/runner_socket.py): when set, every call
    # and stream goes over it and never over TCP, whatever server_url's host and port say
    # (the URL still gives the scheme, the Host header and the TLS name). None: TCP.
    server_socket: Path | None = None
    # The host uid the instance's jobs run as (runner/sandbox.py instance_uid: the server's
    # GPULEASE_SANDBOX_UID_BASE + instance id); None: the default base + instance id.
    sandbox_uid: int | None = None
    # The node the scheduler placed the instance on (its name in the node inventory): a
    # fleet backend (Ray) starts the runner there. None: the server's own host.
    node: str | None = None
    # The instance's CPU and memory share (runner/cgroups.py), from the pricing file's
    # vCPUs and RAM per GPU; None: derived on the node from its cores and memory times the
    # instance's part of node_gpus (the node's GPUs; 0: unknown, a CPU-only size).
    vcpus: float | None = None
    memory_bytes: int | None = None
    node_gpus: int = 0
    # A fleet backend's workspace moves (runner/workspace_sync.py): save the workspace's
    # changed chunks to the server at stop; restore the server's snapshot before ready (the
    # instance ran last on another node).
    workspace_save: bool = False
    workspace_restore: bool = False
    # With workspace_save: also save it every this many seconds while running (0: only at
    # stop), so that an instance whose node dies starts elsewhere from a recent copy.
    workspace_save_interval_s: float = 0.0
    # A rank of a multi-node run on a server with a job fabric (GPULEASE_FABRIC_CIDR); None:
    # none (the jobs reach out through slirp only).
    fabric: FabricLink | None = None

    def to_json(self) -> str:
        return _SPEC.dump_json(self).decode()

    @classmethod
    def from_json(cls, text: str) -> RunnerSpec:
        return _SPEC.validate_json(text)


_SPEC: TypeAdapter[RunnerSpec] = TypeAdapter(RunnerSpec)


class RunnerSession(BaseModel):
    """POST /session: the token the runner uses from now on; the one it called with stops
    working."""

    token: str = Field(pattern=SESSION_TOKEN_PATTERN, max_length=200)


class RunnerStatus(BaseModel):
    message: str = Field(default="", max_length=2000)


class RunnerReady(BaseModel):
    pid: int | None = None
    python: str | None = None


class RunnerHeartbeat(BaseModel):
    running_runs: list[int] = Field(default_factory=list)


class RunnerAction(BaseModel):
    action: str
    # With "stop": the instance was preempted; the runner writes its jobs' notice, sends
    # SIGTERM and gives them this many seconds to checkpoint (runner/preempt.py).
    preempt_grace_s: float | None = Field(default=None, ge=0, le=3600)


class RunnerRun(BaseModel):
    id: int
    command: str
    env: dict[str, str] = Field(default_factory=dict)


class RunnerStreamEntry(BaseModel):
    """A stream the runner should connect (runner/streams.py). Kinds it does not know
    ("terminal" and "jupyter" today) it ignores; cols and rows are a terminal's size."""

    model_config = ConfigDict(extra="ignore")

    id: str
    kind: str
    cols: int | None = None
    rows: int | None = None


class RunnerTask(BaseModel):
    """A task for the runner (services/templates): kind "snapshot_env" today."""

    id: int
    kind: str


class RunnerCommands(BaseModel):
    runs: list[RunnerRun]
    streams: list[RunnerStreamEntry] = Field(default_factory=list)
    tasks: list[RunnerTask] = Field(default_factory=list)
    # The instance is stopping: stop every run, call /stopped and exit (as a heartbeat's
    # "stop"); the long poll answers at once with it.
    stop: bool = False
    # With stop: a preemption, as RunnerAction's preempt_grace_s.
    preempt_grace_s: float | None = Field(default=None, ge=0, le=3600)


class RunnerStarted(BaseModel):
    pid: int | None = None


# What an INTEGER column holds, and Unix times from 1970 to 2100: bounds that make a hostile
# runner's huge number a 422 rather than an overflow in the database or in datetime.
INT32_MAX = 2**31 - 1
UNIX_TIME_MAX = 4_102_444_800.0


class RunnerLogChunk(BaseModel):
    seq: int = Field(ge=0, le=INT32_MAX)
    stream: str = Field(max_length=8)
    data: str
    time: float = Field(ge=0, le=UNIX_TIME_MAX, allow_inf_nan=False)


class RunnerLogs(BaseModel):
    chunks: list[RunnerLogChunk] = Field(max_length=10_000)


class RunnerExit(BaseModel):
    exit_code: int = Field(ge=-INT32_MAX - 1, le=INT32_MAX)


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


class RunnerWorkspaceChunks(BaseModel):
    """POST /workspace/missing: [sha256, size] of chunks; the answer names those the server
    lacks (RunnerWorkspaceMissing)."""

    chunks: list[tuple[str, int]] = Field(max_length=20_000)


class RunnerWorkspaceMissing(BaseModel):
    missing: list[str]


class RunnerWorkspaceFile(BaseModel):
    path: str = Field(max_length=4096)
    size: int
    mode: int
    mtime: float
    chunks: list[str]


class RunnerWorkspaceSnapshot(BaseModel):
    """PUT /workspace/snapshot (and its GET): every regular file of the workspace, and its
    empty directories (those holding no file or directory listed)."""

    files: list[RunnerWorkspaceFile]
    dirs: list[str] = Field(default_factory=list, max_length=200_000)


class RunnerWorkspaceSaved(BaseModel):
    """PUT /workspace/snapshot's answer, and POST /workspace/unchanged's body: the snapshot
    the server now holds. A runner whose next save finds the same files names it, and the
    server takes the copy as saved again now unless another snapshot replaced it (409)."""

    snapshot: str = Field(max_length=255)


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
