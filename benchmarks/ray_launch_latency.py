"""Launch latency on the Ray backend: from `gpulease run` to the command's first output line.

Measured against a real server on the Ray backend and a local Ray cluster on loopback (a
head and two simulated-GPU nodes, as the tests start it), beside a bare Ray actor start
timed in the same run on the same cluster: a detached actor pinned to a node with
NodeAffinitySchedulingStrategy, until its first method call returns. That is the floor
under any runner that Ray starts. Medians of N (default 5).

    .venv/bin/python benchmarks/ray_launch_latency.py [-n 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from launch_latency import first_line_seconds, wait_free  # noqa: E402

from processes import BIN, running_platform  # noqa: E402
from ray_support import local_ray_cluster  # noqa: E402  (sets Ray's loopback environment)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5)
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
            first_line_seconds([*run, "--", "echo warm"], platform.env())  # builds the env
            for _ in range(args.n):
                wait_free(platform, "A100-80GB")
                runs.append(first_line_seconds([*run, "--", "echo hi"], platform.env()))
    table = Table(title=f"Ray backend launch latency, median of {args.n}")
    table.add_column("what")
    table.add_column("median s", justify="right")
    table.add_column("min s", justify="right")
    table.add_row(
        "gpulease run → first line (Ray)", f"{statistics.median(runs):.2f}", f"{min(runs):.2f}"
    )
    table.add_row(
        "bare detached actor, pinned → first call",
        f"{statistics.median(bare):.2f}",
        f"{min(bare):.2f}",
    )
    console.print(table)


if __name__ == "__main__":
    main()
