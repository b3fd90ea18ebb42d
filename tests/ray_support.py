"""A real local Ray cluster for the Ray backend's tests: a head and worker nodes on loopback.

Several nodes on one host are what Ray's own `ray.cluster_utils.Cluster` gives (`ray start`
refuses a second node on a host whose only address is loopback). Every process binds to
127.0.0.1 only: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray from swapping 127.0.0.1 for
the host's other address. The cluster is shared by all Ray tests of a session; tests add
and kill nodes of their own and leave gpu-a and gpu-b as they found them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fabric_support
from processes import ADMIN_PASSWORD, Platform, running_platform

RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # loopback only
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
}
# A killed node is declared dead after about 3 s instead of about 30 s.
FAST_DEATH = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
}
MiB = 1024 * 1024
# Every worker's job fabric (docs/ray.md): the veth parent of tests/fabric_support.py in the
# namespace of this test process, which the fabric tests make (without it, and without a
# server that sets GPULEASE_FABRIC_CIDR, nothing reads these).
FABRIC_NODE_ENV = {
    "GPULEASE_FABRIC_PARENT": fabric_support.PARENT,
    "GPULEASE_FABRIC_NETNS": fabric_support.namespace_name(),
}
# Ray reads these when it is imported, and any test module may import it first.
for _key, _value in RAY_ENV.items():
    os.environ.setdefault(_key, _value)


def worker_resources(
    name: str, gpus: int = 2, model: str = "A100-80GB", simulated: bool = True
) -> dict[str, float]:
    """The resources `ray start --resources` gives a GPU node (docs/ray.md)."""
    resources = {
        f"gpulease/{model}": float(gpus),
        f"gpulease/name:{name}": 1.0,
        "gpulease/driver:550.54.15": 1.0,
        "gpulease/cuda:12.4": 1.0,
    }
    if simulated:
        resources["gpulease/simulated"] = 1.0
    return resources


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    root: Path  # node homes live under root/nodes/<name>
    workers: dict[str, Any] = field(default_factory=dict)
    gcs_env: dict[str, str] = field(default_factory=dict)  # where the GCS keeps its tables

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    @property
    def node_home(self) -> Path:
        return self.root / "nodes"

    def add_worker(
        self, name: str, gpus: int = 2, model: str = "A100-80GB", simulated: bool = True
    ) -> None:
        """A worker node; its raylet (and so its runners) has the fabric settings of
        FABRIC_NODE_ENV, used only by a server with GPULEASE_FABRIC_CIDR."""
        with _environment(FABRIC_NODE_ENV):
            self.workers[name] = self.cluster.add_node(
                node_ip_address="127.0.0.1",
                num_cpus=1,
                num_gpus=gpus,
                object_store_memory=80 * MiB,
                resources=worker_resources(name, gpus, model, simulated),
            )

    def kill_worker(self, name: str) -> None:
        """The node dies as a host would: its raylet and Ray workers are SIGKILLed, and so
        is every runner that lives under its home, with its jobs."""
        self.cluster.remove_node(self.workers.pop(name), allow_graceful=False)
        kill_processes_under(self.node_home / name)

    def restart_gcs(self, down_s: float = 1.0) -> None:
        """The head's GCS is SIGKILLed and, down_s later, started again on the same port, as
        a restarted head pod's is. With its tables in Redis (gcs_env) it takes up the same
        cluster: nodes, detached actors and their processes stay as they were."""
        head = self.cluster.head_node
        head.kill_gcs_server()
        time.sleep(down_s)
        with _environment(self.gcs_env):
            head.start_gcs_server()


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with values set, as it was on the way out (Ray's processes inherit it)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def kill_processes_under(home: Path) -> None:
    """SIGKILL every process whose command line names a path under home, and their sessions."""
    from gpulease.backends.procfs import all_stats

    marker = f"{home}/".encode()
    leaders = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "cmdline").read_bytes():
                leaders.add(int(entry.name))
    victims = leaders | {s.pid for s in all_stats() if s.session in leaders}
    victims.discard(os.getpid())
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# The platform core's whole-system tests on the local backend, on both databases, and on the
# Ray backend on SQLite only: the local runs cover the database side on both, the Ray run is
# about the backend (runner actors on the cluster's nodes), and each run costs seconds.
ON_BOTH_BACKENDS = pytest.mark.parametrize(
    ("backend", "database_url"),
    [("local", "sqlite"), ("local", "postgres"), ("ray", "sqlite")],
    ids=["sqlite", "postgres", "ray-sqlite"],
    indirect=["database_url"],
)


@contextmanager
def running_ray_platform(
    cluster: RayCluster,
    tmp_path: Path,
    database_url: str,
    extra_env: dict[str, str] | None = None,
) -> Iterator[Platform]:
    """A gpulease server on the Ray backend of cluster (its nodes are the fleet; the server's
    host offers no GPUs), with the CLI logged in as admin, once its node inventory lists
    the cluster's workers (the fleet reconciler's first ticks). extra_env: more settings."""
    env = {
        "GPULEASE_BACKEND": "ray",
        "GPULEASE_RAY_ADDRESS": cluster.address,
        "GPULEASE_RAY_NODE_HOME": str(cluster.node_home),
        "GPULEASE_HEARTBEAT_TIMEOUT_S": "60",  # node death must be told by the fleet check
        **(extra_env or {}),
    }
    with running_platform(tmp_path, database_url, "", env) as p:
        p.cli("login", "--server", p.url, "--name", "admin", "--password", ADMIN_PASSWORD)
        deadline = time.monotonic() + 15
        while not set(cluster.workers) <= _ready_nodes(p):
            assert time.monotonic() < deadline, f"nodes not listed: {p.cli('nodes').stdout}"
            time.sleep(0.3)
        yield p


def _ready_nodes(platform: Platform) -> set[str]:
    listed: Any = platform.cli_json("nodes")
    return {n["name"] for n in listed if n["status"] == "ready"}


@contextmanager
def local_ray_cluster(
    workers: tuple[str, ...] = ("gpu-a", "gpu-b"), redis: str | None = None
) -> Iterator[RayCluster]:
    """A head (no GPUs, not offered) and worker nodes with 2 simulated A100-80GB each, on
    loopback, in a temporary directory; on the way out every process of it is stopped.

    redis: HOST:PORT of a Redis where the head's GCS keeps its tables (GCS fault tolerance),
    under a key namespace of this cluster's own, deleted on the way out; None: in memory."""
    from ray.cluster_utils import Cluster

    root = Path(tempfile.mkdtemp(prefix="gpl-ray-"))
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(root / "tmp")
    (root / "tmp" / "ray").mkdir(parents=True)
    gcs_env = {}
    if redis is not None:
        gcs_env = {
            "RAY_REDIS_ADDRESS": redis,
            "RAY_external_storage_namespace": f"gpulease-test-{root.name}",
        }
    with _environment(gcs_env):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "node_ip_address": "127.0.0.1",
                "dashboard_host": "127.0.0.1",
                "include_dashboard": False,
                "num_cpus": 1,
                "object_store_memory": 80 * MiB,
                "temp_dir": str(root / "tmp"),
                "_system_config": FAST_DEATH,
            },
        )
    ray_cluster = RayCluster(cluster=cluster, root=root, gcs_env=gcs_env)
    try:
        for name in workers:
            ray_cluster.add_worker(name)
        yield ray_cluster
    finally:
        kill_processes_under(ray_cluster.node_home)
        cluster.shutdown()
        if redis is not None:
            _delete_gcs_tables(redis, gcs_env["RAY_external_storage_namespace"])
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(root, ignore_errors=True)


def _delete_gcs_tables(redis: str, namespace: str) -> None:
    """Delete the keys a GCS kept in Redis under namespace (Ray's own clean-up call)."""
    from ray._private.gcs_utils import cleanup_redis_storage

    host, _, port = redis.rpartition(":")
    cleanup_redis_storage(host, int(port), "", False, namespace)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """gpu-a and gpu-b (local_ray_cluster), started once per session: a start costs about
    15 s here."""
    try:
        import ray.cluster_utils  # noqa: F401
    except ImportError:
        pytest.skip("Ray is not installed: pip install 'gpulease[ray]'")
    with local_ray_cluster() as cluster:
        yield cluster
