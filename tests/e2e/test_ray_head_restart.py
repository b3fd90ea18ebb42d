"""A Ray head whose GCS restarts, its tables in Redis (GCS fault tolerance): the runner actor
and its job live on, the server carries on with the new GCS, and the run is billed once.

A cluster of its own (a head and one node), not the session's shared one: its GCS keeps its
tables in Redis under a namespace of its own, and this test kills that GCS.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulease.core.money import cost_for_seconds
from processes import Platform
from ray_support import RayCluster, local_ray_cluster, running_ray_platform

# A cluster of its own costs most of this test: 38-52 s in all (median 45 s of 4) on the
# project's 2-core machine, of which 20-31 s is the cluster's and the server's start and
# 14-16 s the run and the restart; more than CI's time allows. GPULEASE_TEST_RAY_HEAD_RESTART=1
# runs it; benchmarks/ray_head_restart.py shows the same with figures.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("GPULEASE_TEST_RAY_HEAD_RESTART") != "1",
        reason="a Ray cluster of its own costs about 45 s: set GPULEASE_TEST_RAY_HEAD_RESTART=1",
    ),
]
pytest.importorskip("ray", reason="Ray is not installed: pip install 'gpulease[ray]'")
REDIS = "127.0.0.1:6379"
TICKS = 12  # half a second each


def _redis_answers() -> bool:
    host, _, port = REDIS.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def fault_tolerant(sqlite_migrated: Path, tmp_path: Path) -> Iterator[tuple[RayCluster, Platform]]:
    """A head whose GCS keeps its tables in Redis, node gpu-r (2 simulated A100-80GB), and a
    server on them (SQLite: the database is not what this test is about)."""
    if not _redis_answers():
        pytest.skip(f"no Redis at {REDIS} for the head's GCS tables: start redis-server")
    shutil.copyfile(sqlite_migrated, tmp_path / "gpulease.db")
    with (
        local_ray_cluster(workers=("gpu-r",), redis=REDIS) as cluster,
        running_ray_platform(cluster, tmp_path, f"sqlite:///{tmp_path / 'gpulease.db'}") as p,
    ):
        yield cluster, p


def test_a_run_outlives_a_restart_of_the_ray_head_and_is_billed_once(
    fault_tolerant: tuple[RayCluster, Platform], tmp_path: Path
) -> None:
    cluster, platform = fault_tolerant
    platform.cli(
        "register", "--server", platform.url, "--name", "ann", "--password", "password-123"
    )
    script = f"echo pid $$; for i in $(seq 1 {TICKS}); do echo tick $i; sleep 0.5; done"
    follower = platform.popen_cli(
        "run", "--gpu", "A100-80GB:1", "--template", "python", "--", script,
        stderr_path=tmp_path / "cli.err",
    )  # fmt: skip
    assert follower.stdout is not None
    first = follower.stdout.readline() + follower.stdout.readline()
    assert first.splitlines()[-1] == "tick 1", first  # the job is running and streaming
    (instance,) = platform.cli_json("instance", "ls")  # type: ignore[misc]
    home = cluster.node_home / "gpu-r"
    assert (home / "runners" / str(instance["id"])).is_dir()

    cluster.restart_gcs(down_s=1.0)
    with follower.stdout:
        out = follower.stdout.read()
    assert follower.wait(120) == 0, (tmp_path / "cli.err").read_text()
    lines = (first + out).splitlines()
    assert lines[0].startswith("pid ") and not [x for x in lines[1:] if x.startswith("pid ")]
    ticks = [line for line in lines if line.startswith("tick")]
    assert ticks == [f"tick {i}" for i in range(1, TICKS + 1)], ticks  # one job, every line

    # the server works with the new GCS: it stopped and released the instance (Ray calls),
    # and a task pinned to the node deleted its runner's files
    got: Any = platform.wait_status(str(instance["id"]), "released", timeout=60)
    assert "left the cluster" not in got["status_reason"] and "runner" not in got["status_reason"]
    deadline = time.monotonic() + 20
    while (home / "runners" / str(instance["id"])).exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not (home / "runners" / str(instance["id"])).exists()
    gpus: Any = {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]
    assert gpus["A100-80GB"]["free"] == gpus["A100-80GB"]["total"] == 2  # the fleet as it was

    # billed once, for all of it
    usage: Any = platform.cli_json("usage")
    (segment,) = usage["segments"]
    assert segment["charged_micro"] == cost_for_seconds(
        segment["hourly_micro"], segment["billed_seconds"]
    )
    charged = -sum(line["amount_micro"] for line in usage["ledger"] if line["kind"] == "usage")
    assert charged == segment["charged_micro"]
    assert segment["billed_seconds"] >= TICKS * 0.5
