"""Launch latency on the Ray backend, and how fast the fleet follows nodes joining and dying.

Measured against a real server on the Ray backend and a local Ray cluster on loopback (a
head and two simulated-GPU nodes, as the tests start it):

- `gpulease run` → the command's first output line, beside a bare Ray actor start timed in
  the same run on the same cluster: a detached actor pinned to a node with
  NodeAffinitySchedulingStrategy, until its first method call returns. That is the floor
  under any runner that Ray starts. And beside the same `gpulease run` on the local
  backend (a server of its own on this host, one simulated A100), also in this run.
- a workspace move (docs/ray.md): an instance of 2 A100s with WS MiB of random files in its
  workspace (default 32) stops (its runner saves the workspace to the server: everything
  the first time, nothing once nothing changed), starts again on its own node, stops, and
  starts once more while another instance fills that node: it moves to the other node,
  whose runner fetches the whole workspace. Start → running with the move beside the start
  on its own node.
- node join → offered: from the start of a new GPU node (Cluster.add_node, which returns
  once Ray has registered it: timed too) to its GPUs counted in the catalog's total
  (`GET /api/v1/gpus`).
- node death → instance stopped: from SIGKILL of a node's raylet and processes to its
  instance failed with "node NAME left the cluster", beside the time Ray itself takes to
  declare the node dead (ray.nodes() says Alive: false). The test cluster's head checks
  node health every second and gives up after 3 misses; Ray's defaults (a check every 3 s,
  5 misses) make both figures about 15 s longer.

Medians of N (default 5).

    .venv/bin/python benchmarks/ray_launch_latency.py [-n 5] [--workspace-mib 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from launch_latency import line_seconds, wait_free  # noqa: E402
from results import emit  # noqa: E402

from gpulease.client import GpuleaseClient  # noqa: E402
from gpulease.schemas.accounts import RegisterRequest  # noqa: E402
from gpulease.schemas.instances import InstanceCreate  # noqa: E402
from processes import BIN, Platform, running_platform  # noqa: E402
from ray_support import RayCluster, local_ray_cluster  # noqa: E402  (Ray's loopback env)

POLL_S = 0.05
PASSWORD = "bench-pass-1"


class Ping:
    def ping(self) -> int:
        return 1


def bare_actor_seconds(address: str, n: int) -> list[float]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, namespace="bench", log_to_driver=False)
    try:
        node_id = next(n["NodeID"] for n in ray.nodes() if "gpulease/name:gpu-a" in n["Resources"])
        remote = ray.remote(Ping)
        samples = []
        for i in range(n):
            started = time.perf_counter()
            actor = remote.options(  # type: ignore[attr-defined]
                name=f"bench-{i}",
                lifetime="detached",
                num_cpus=0,
                num_gpus=1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            ray.get(actor.ping.remote())
            samples.append(time.perf_counter() - started)
            ray.kill(actor)
        return samples
    finally:
        ray.shutdown()


def until(probe: Callable[[], bool], timeout: float = 120.0) -> float:
    """Seconds until probe() is true, polled every POLL_S."""
    started = time.perf_counter()
    while not probe():
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"not there after {timeout:.0f} s")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def t4_total(client: GpuleaseClient) -> int:
    return next((m.total for m in client.catalog.gpus() if m.name == "T4"), 0)


def ray_says_dead(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes())


def fleet_seconds(
    cluster: RayCluster, client: GpuleaseClient, n: int
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per sample: a T4 node starts (seconds until Ray has it, and until gpulease offers its
    GPU), an instance starts on it, the node is killed (seconds until Ray says it is dead,
    and until the instance has failed)."""
    import ray

    joins, ray_joins, ray_deaths, stops = [], [], [], []
    ray.init(address=cluster.address, namespace="bench", log_to_driver=False)
    try:
        for i in range(n):
            name = f"bench-t4-{i}"
            before = t4_total(client)
            started = time.perf_counter()
            cluster.add_worker(name, gpus=1, model="T4")  # returns once Ray has the node
            ray_joins.append(time.perf_counter() - started)
            node_id = cluster.workers[name].node_id
            until(lambda: t4_total(client) > before)  # noqa: B023
            joins.append(time.perf_counter() - started)
            instance = client.instances.create(
                InstanceCreate(gpu="T4:1", template="python", name=f"bench-{i}")
            )
            until(lambda: client.instances.get(instance.id).status == "running")  # noqa: B023
            killed = time.perf_counter()
            cluster.kill_worker(name)
            until(lambda: ray_says_dead(node_id))  # noqa: B023
            ray_deaths.append(time.perf_counter() - killed)
            until(lambda: client.instances.get(instance.id).status == "failed")  # noqa: B023
            stops.append(time.perf_counter() - killed)
            client.instances.release(instance.id)
    finally:
        ray.shutdown()
    return joins, ray_joins, ray_deaths, stops


def workspace_seconds(
    platform: Platform, client: GpuleaseClient, n: int, mib: int
) -> dict[str, list[float]]:
    """Per sample, seconds of: the first stop (saves mib MiB), a start on its own node, a
    stop with nothing changed, a start that moves to the other node (fetches mib MiB)."""
    out: dict[str, list[float]] = {k: [] for k in ("save", "home", "resave", "move")}
    # the CLI (for exec) as the client's user
    platform.cli("login", "--server", platform.url, "--name", "fleet", "--password", PASSWORD)

    def status_after(ref: int, act: Callable[[], object], status: str) -> float:
        started = time.perf_counter()
        act()
        until(lambda: client.instances.get(ref).status == status)
        return time.perf_counter() - started

    for i in range(n):
        body = InstanceCreate(gpu="A100-80GB:2", template="python", name=f"ws-{i}")
        ws = client.instances.create(body)
        until(lambda: client.instances.get(ws.id).status == "running")  # noqa: B023
        write = f"head -c {mib * 2**20} /dev/urandom > data.bin"
        platform.cli("exec", str(ws.id), "--", "sh", "-c", write)
        home = client.instances.get(ws.id).node
        out["save"].append(status_after(ws.id, lambda: client.instances.stop(ws.id), "stopped"))  # noqa: B023
        out["home"].append(status_after(ws.id, lambda: client.instances.start(ws.id), "running"))  # noqa: B023
        assert client.instances.get(ws.id).node == home
        out["resave"].append(status_after(ws.id, lambda: client.instances.stop(ws.id), "stopped"))  # noqa: B023
        filler = client.instances.create(
            InstanceCreate(gpu="A100-80GB:2", template="python", name=f"filler-{i}")
        )
        until(lambda: client.instances.get(filler.id).status == "running")  # noqa: B023
        out["move"].append(status_after(ws.id, lambda: client.instances.start(ws.id), "running"))  # noqa: B023
        assert client.instances.get(ws.id).node != home
        for ref in (ws.id, filler.id):
            client.instances.release(ref)
        for ref in (ws.id, filler.id):
            until(lambda: client.instances.get(ref).status == "released")  # noqa: B023
    return out


def local_runs(root: Path, n: int) -> list[float]:
    """`gpulease run` → first line on the local backend (one simulated A100 on this host)."""
    samples = []
    root.mkdir(parents=True, exist_ok=True)
    with running_platform(root, f"sqlite:///{root / 'local.db'}", "A100-80GB:1") as platform:
        platform.cli(
            "register", "--server", platform.url, "--name", "bench", "--password", "bench-pass-1"
        )
        run = [str(BIN / "gpulease"), "run", "--gpu", "A100-80GB:1", "--template", "python"]
        line_seconds([*run, "--", "echo warm"], platform.env())
        for _ in range(n):
            wait_free(platform, "A100-80GB")
            samples.append(line_seconds([*run, "--", "echo hi"], platform.env()))
    return samples


def user_client(platform: Platform) -> GpuleaseClient:
    client = GpuleaseClient(platform.url)
    token = client.auth.register(RegisterRequest(name="fleet", password=PASSWORD)).token
    return GpuleaseClient(platform.url, token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--workspace-mib", type=int, default=32)
    args = parser.parse_args()
    console = Console()
    with local_ray_cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bare = bare_actor_seconds(cluster.address, args.n)
        env = {
            "GPULEASE_BACKEND": "ray",
            "GPULEASE_RAY_ADDRESS": cluster.address,
            "GPULEASE_RAY_NODE_HOME": str(cluster.node_home),
        }
        runs = []
        with running_platform(root, f"sqlite:///{root / 'gpulease.db'}", "", env) as platform:
            platform.cli(
                "register",
                "--server",
                platform.url,
                "--name",
                "bench",
                "--password",
                "bench-pass-1",
            )
            run = [str(BIN / "gpulease"), "run", "--gpu", "A100-80GB:1", "--template", "python"]
            line_seconds([*run, "--", "echo warm"], platform.env())  # builds the env
            for _ in range(args.n):
                wait_free(platform, "A100-80GB")
                runs.append(line_seconds([*run, "--", "echo hi"], platform.env()))
            client = user_client(platform)
            moves = workspace_seconds(platform, client, args.n, args.workspace_mib)
            fleet = fleet_seconds(cluster, client, args.n)
        local = local_runs(root / "local", args.n)
    joins, ray_joins, ray_deaths, stops = fleet
    table = Table(title=f"Ray backend: launch latency and the fleet, median of {args.n}")
    table.add_column("what")
    table.add_column("median s", justify="right")
    table.add_column("min s", justify="right")
    table.add_row(
        "gpulease run → first line (Ray)", f"{statistics.median(runs):.2f}", f"{min(runs):.2f}"
    )
    table.add_row(
        "gpulease run → first line (local backend)",
        f"{statistics.median(local):.2f}",
        f"{min(local):.2f}",
    )
    mib = args.workspace_mib
    for key, what in (
        ("save", f"stop → stopped, saving {mib} MiB"),
        ("resave", "stop → stopped, nothing changed"),
        ("home", "start → running on its own node"),
        ("move", f"start → running on the other node, fetching {mib} MiB"),
    ):
        got = moves[key]
        table.add_row(what, f"{statistics.median(got):.2f}", f"{min(got):.2f}")
    table.add_row(
        "bare detached actor, pinned → first call",
        f"{statistics.median(bare):.2f}",
        f"{min(bare):.2f}",
    )
    table.add_row(
        "node start → its GPUs offered", f"{statistics.median(joins):.2f}", f"{min(joins):.2f}"
    )
    table.add_row(
        "node start → Ray has it (add_node returns)",
        f"{statistics.median(ray_joins):.2f}",
        f"{min(ray_joins):.2f}",
    )
    table.add_row(
        "node killed → instance failed with the reason",
        f"{statistics.median(stops):.2f}",
        f"{min(stops):.2f}",
    )
    table.add_row(
        "node killed → Ray says it is dead",
        f"{statistics.median(ray_deaths):.2f}",
        f"{min(ray_deaths):.2f}",
    )
    console.print(table)
    emit(
        "`gpulease run` → first line (Ray backend)",
        f"{statistics.median(runs):.2f} s",
        f"bare pinned actor {statistics.median(bare):.2f} s",
        f"{statistics.median(runs) / statistics.median(bare):.1f}×",
        "",
        None,
    )
    emit(
        "`gpulease run` → first line, Ray beside the local backend",
        f"{statistics.median(runs):.2f} s",
        f"local backend {statistics.median(local):.2f} s",
        f"{statistics.median(runs) / statistics.median(local):.1f}×",
        "",
        None,
    )
    move, home = statistics.median(moves["move"]), statistics.median(moves["home"])
    emit(
        f"start with a workspace move ({mib} MiB fetched)",
        f"{move:.2f} s",
        f"start on its own node {home:.2f} s",
        f"+{move - home:.2f} s",
        "",
        None,
    )
    emit(
        "Ray node start → its GPUs offered in the catalog",
        f"{statistics.median(joins):.2f} s",
        f"Ray has the node after {statistics.median(ray_joins):.2f} s",
        f"+{statistics.median(joins) - statistics.median(ray_joins):.2f} s",
        "within seconds",
        statistics.median(joins) < 10,
    )
    emit(
        "Ray node killed → its instance failed with the reason",
        f"{statistics.median(stops):.2f} s",
        f"Ray declares it dead after {statistics.median(ray_deaths):.2f} s",
        f"+{statistics.median(stops) - statistics.median(ray_deaths):.2f} s",
        "about 30 s",
        statistics.median(stops) < 30,
    )


if __name__ == "__main__":
    main()
