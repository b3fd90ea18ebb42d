"""The backend contract: place a runner for an instance, check it, stop it.

Everything after a runner starts is the same HTTP conversation with the server whatever the
backend, which is what lets the local and Ray backends behave alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpulease.core.templates import Template


@dataclass(frozen=True)
class RunnerSpec:
    """Everything a runner needs to serve one instance. Written to a 0600 file, never argv."""

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

    def to_json(self) -> str:
        return json.dumps(
            {
                "instance_id": self.instance_id,
                "server_url": self.server_url,
                "token": self.token,
                "workspace": str(self.workspace),
                "run_dir": str(self.run_dir),
                "env_cache": str(self.env_cache),
                "template": self.template.to_json(),
                "gpu_indices": list(self.gpu_indices),
                "gpu_uuids": list(self.gpu_uuids),
                "heartbeat_interval_s": self.heartbeat_interval_s,
                "extra_env": self.extra_env,
                "sandbox": self.sandbox,
                "server_certificate": self.server_certificate,
                "dataset_cache": str(self.dataset_cache) if self.dataset_cache else None,
                "gpu_sample_interval_s": self.gpu_sample_interval_s,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RunnerSpec:
        data = json.loads(text)
        return cls(
            instance_id=int(data["instance_id"]),
            server_url=str(data["server_url"]),
            token=str(data["token"]),
            workspace=Path(data["workspace"]),
            run_dir=Path(data["run_dir"]),
            env_cache=Path(data["env_cache"]),
            template=Template.from_json(data["template"]),
            gpu_indices=tuple(int(i) for i in data.get("gpu_indices", [])),
            gpu_uuids=tuple(str(u) for u in data.get("gpu_uuids", [])),
            heartbeat_interval_s=float(data.get("heartbeat_interval_s", 2.0)),
            extra_env={str(k): str(v) for k, v in data.get("extra_env", {}).items()},
            sandbox=bool(data.get("sandbox", False)),
            server_certificate=data.get("server_certificate"),
            dataset_cache=Path(data["dataset_cache"]) if data.get("dataset_cache") else None,
            gpu_sample_interval_s=float(data.get("gpu_sample_interval_s", 5.0)),
        )


class Backend(Protocol):
    """Where runners live. Implementations must be safe to call from any reconciler tick.

    A handle is an opaque string the backend returns from start() and the server stores
    in the database; it must identify the runner across server restarts (a pid alone does
    not: pids are reused).
    """

    name: str

    def start(self, spec: RunnerSpec) -> str:
        """Start a detached runner for spec and return its handle. The runner must outlive
        the server process (its own session), so a server restart never kills user jobs."""
        ...

    def alive(self, handle: str) -> bool:
        """True while the runner behind handle is still running. Cheap; no network."""
        ...

    def stop(self, handle: str, *, force: bool = False) -> None:
        """Ask the runner to stop (SIGTERM), or kill it and its jobs when force is set.
        Idempotent and fast: returns at once, also for a handle whose runner is gone."""
        ...
