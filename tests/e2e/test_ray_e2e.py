"""The whole system on the Ray backend: a real server whose runners are actors on the nodes of
a real local Ray cluster (a head and simulated-GPU nodes, tests/ray_support.py)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpulease.client import GpuleaseClient
from gpulease.client.config import load_saved
from gpulease.schemas.instances import InstanceCreate
from processes import Platform
from ray_support import RayCluster, running_ray_platform
from wheels import make_wheel

pytestmark = pytest.mark.e2e
pytest.importorskip("ray", reason="Ray is not installed: pip install 'gpulease[ray]'")


SAVE_OFTEN = {"GPULEASE_WORKSPACE_SAVE_INTERVAL_S": "3"}


@pytest.fixture(scope="module")
def platform(
    ray_cluster: RayCluster, sqlite_migrated: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Platform]:
    """One server on the Ray backend for this module (on SQLite: the database is not what
    these tests are about, and each server start costs seconds)."""
    tmp_path = tmp_path_factory.mktemp("ray-platform")
    shutil.copyfile(sqlite_migrated, tmp_path / "gpulease.db")
    database = f"sqlite:///{tmp_path / 'gpulease.db'}"
    # running workspaces saved every 3 s: a node's death loses at most that much of one
    with running_ray_platform(ray_cluster, tmp_path, database, SAVE_OFTEN) as p:
        yield p


def wait_for(probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    got = probe()
    while not got and time.monotonic() < deadline:
        time.sleep(0.3)
        got = probe()
    return got


def actor_processes() -> list[int]:
    """Ray worker processes that host a runner actor (Ray titles them ray::RunnerActor)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cmdline").read_bytes().startswith(b"ray::RunnerActor"):
                    found.append(int(entry.name))
    return found


def nodes(platform: Platform) -> dict[str, Any]:
    return {n["name"]: n for n in platform.cli_json("nodes")}  # type: ignore[union-attr]


def gpus(platform: Platform) -> dict[str, Any]:
    return {g["name"]: g for g in platform.cli_json("gpus")}  # type: ignore[union-attr]


def test_the_node_inventory_follows_the_cluster(
    platform: Platform, ray_cluster: RayCluster
) -> None:
    assert wait_for(lambda: {"gpu-a", "gpu-b"} <= set(nodes(platform)), 10)
    listed = nodes(platform)
    assert set(listed) == {"gpu-a", "gpu-b"}  # not the server's host, not the Ray head
    assert listed["gpu-a"]["backend"] == "ray" and listed["gpu-a"]["status"] == "ready"
    assert gpus(platform)["A100-80GB"]["total"] == 4

    ray_cluster.add_worker("gpu-c", gpus=1, model="T4")
    joined = time.monotonic()
    assert wait_for(lambda: nodes(platform).get("gpu-c", {}).get("status") == "ready", 10)
    assert time.monotonic() - joined < 10
    assert gpus(platform)["T4"]["total"] == 1
    ray_cluster.kill_worker("gpu-c")
    assert wait_for(lambda: nodes(platform)["gpu-c"]["status"] == "gone", 30)
    assert gpus(platform)["T4"]["total"] == 0


def test_a_run_on_a_ray_node_streams_its_log_back(
    platform: Platform, ray_cluster: RayCluster
) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "ann", "--password", "password-123"
    )
    result = platform.cli(
        "run", "--gpu", "A100-80GB:2", "--template", "python", "--",
        "echo hello from a ray node; echo $GPULEASE_NODE",
    )  # fmt: skip
    assert "hello from a ray node" in result.stdout
    node = result.stdout.split()[-1]
    (instance,) = platform.cli_json("instance", "ls", "--all")  # type: ignore[misc]
    platform.wait_status(str(instance["id"]), "released")
    # its runner lived on the node, its files under that node's home, deleted at release
    home = ray_cluster.node_home / node
    assert (home / "runners").is_dir() and (home / "workspaces").is_dir()
    mine = [home / "runners" / str(instance["id"]), home / "workspaces" / str(instance["id"])]
    assert wait_for(lambda: not any(p.exists() for p in mine), 10), mine
    # the actor ended with its runner: its Ray worker process is gone
    assert wait_for(lambda: not actor_processes(), 20), actor_processes()


def test_a_two_node_run_starts_one_rank_on_each_node_with_its_variables(
    platform: Platform, tmp_path: Path
) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "dan", "--password", "password-123"
    )
    task = tmp_path / "task.yaml"
    task.write_text(
        "num_nodes: 2\nresources: {accelerators: 'A100-80GB:1'}\ntemplate: python\n"
        "run: echo rank=$NODE_RANK size=$WORLD_SIZE master=$MASTER_ADDR"
        ' node=$GPULEASE_NODE ips=$(echo "$SKYPILOT_NODE_IPS" | wc -l)\n'
    )
    result = platform.cli("run", str(task))
    said = dict(
        line.removeprefix("(rank 1) ").split(" ", 1)
        for line in result.stdout.splitlines()
        if line.startswith(("rank=", "(rank 1) rank="))
    )
    assert set(said) == {"rank=0", "rank=1"}, result.stdout
    fields = {rank: dict(f.split("=", 1) for f in rest.split()) for rank, rest in said.items()}
    assert {f["node"] for f in fields.values()} == {"gpu-a", "gpu-b"}
    assert {f["size"] for f in fields.values()} == {"2"}
    assert {f["ips"] for f in fields.values()} == {"2"}
    masters = {f["master"] for f in fields.values()}
    assert len(masters) == 1 and "" not in masters
    assert "(rank 1) run" in result.stderr, result.stderr  # each rank's own end and cost
    members = platform.cli_json("instance", "ls", "--all")
    assert isinstance(members, list) and len(members) == 2
    assert {m["gang_rank"] for m in members} == {0, 1}
    assert all(m["started_at"] for m in members)  # both ran, each billed on its own
    for member in members:
        platform.wait_status(str(member["id"]), "released")


def test_a_two_node_run_stopped_through_one_rank_starts_again_whole_on_its_nodes(
    platform: Platform, ray_cluster: RayCluster
) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "gus", "--password", "password-123"
    )
    token = load_saved(platform.config).token
    with contextlib.closing(GpuleaseClient(platform.url, token)) as gus:
        body = InstanceCreate(gpu="A100-80GB:1", num_nodes=2, name="pair", template="python")
        gus.instances.create(body)
    first = [platform.wait_status(name, "running", timeout=60) for name in ("pair", "pair-1")]
    assert {m["node"] for m in first} == {"gpu-a", "gpu-b"}
    for rank, member in enumerate(first):  # a file in each rank's workspace, on its node
        workspace = ray_cluster.node_home / member["node"] / "workspaces" / str(member["id"])
        (workspace / "mark").write_text(f"kept-{rank}\n")
    platform.cli("instance", "stop", "pair-1")  # rank 1: the whole run stops
    stopped = [platform.wait_status(name, "stopped", timeout=60) for name in ("pair", "pair-1")]
    assert "with rank 1 of its multi-node run" in stopped[0]["status_reason"], stopped[0]
    platform.cli("instance", "start", "pair-1")  # rank 1 again: the whole run queues
    again = [platform.wait_status(name, "running", timeout=60) for name in ("pair", "pair-1")]
    assert [m["node"] for m in again] == [m["node"] for m in first]  # each on its own node
    said = platform.cli("exec", "pair-1", "--", "sh", "-c", "cat mark; echo $NODE_RANK/$WORLD_SIZE")
    assert said.stdout.split() == ["kept-1", "1/2"], said.stdout  # its job sees its files
    leader = ray_cluster.node_home / again[0]["node"] / "workspaces" / str(again[0]["id"])
    assert (leader / "mark").read_text() == "kept-0\n"
    platform.cli("instance", "release", "pair")
    for name in ("pair", "pair-1"):
        platform.wait_status(name, "released", timeout=60)


def test_a_runner_actor_outlives_a_server_crash_and_stops_when_asked(
    platform: Platform, ray_cluster: RayCluster
) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "cat", "--password", "password-123"
    )
    platform.cli(
        "instance",
        "create",
        "--gpu",
        "A100-80GB:1",
        "--template",
        "python",
        "--name",
        "lives",
        "--wait",
    )
    platform.kill()  # SIGKILL: the detached actor and its runner stay where they are
    platform.start()
    time.sleep(3)  # past the start-up health check and a few heartbeats
    assert platform.cli_json("instance", "show", "lives")["status"] == "running"  # type: ignore[index]
    platform.cli("instance", "stop", "lives")
    got = platform.wait_status("lives", "stopped", timeout=30)
    assert "exited" not in got["status_reason"], got  # it stopped, it did not crash
    assert wait_for(lambda: not actor_processes(), 20), actor_processes()


def test_a_node_that_dies_ends_its_instance_and_a_retry_finishes_on_another_node(
    platform: Platform, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """Also: an instance on that node that never stopped starts again on the other node
    from its last periodic save (the nodes shared: each new node builds the template)."""
    platform.cli(
        "register", "--server", platform.url, "--name", "bob", "--password", "password-123"
    )
    ray_cluster.add_worker("gpu-d", gpus=2, model="T4")
    assert wait_for(lambda: gpus(platform)["T4"]["free"] == 2, 10)
    # on gpu-d it waits to be killed with its node; anywhere else it finishes at once
    script = 'echo "on $GPULEASE_NODE"; [ "$GPULEASE_NODE" != gpu-d ] || sleep 300; echo done'
    run = platform.popen_cli(
        "run", "--gpu", "T4:1", "--template", "python", "--retry", "1", "--", script,
        stderr_path=tmp_path / "run.err",
    )  # fmt: skip
    try:
        assert run.stdout is not None
        assert run.stdout.readline().strip() == "on gpu-d"
        (first,) = platform.cli_json("instance", "ls")  # type: ignore[misc]
        create = ("instance", "create", "--gpu", "T4:1", "--template", "python", "--wait")
        platform.cli(*create, "--name", "lost")
        lost = platform.cli_json("instance", "show", "lost")
        assert isinstance(lost, dict) and lost["node"] == "gpu-d"
        ws = ray_cluster.node_home / "gpu-d" / "workspaces" / str(lost["id"])
        written = datetime.now(UTC)
        (ws / "ckpt").mkdir()
        (ws / "ckpt" / "epoch-3.pt").write_text("weights of epoch 3")
        # the running instance's periodic save takes it (it never stops: no stop saves it)
        assert wait_for(lambda: saved_since(platform, "lost", written), 20)
        ray_cluster.add_worker("gpu-e", gpus=2, model="T4")  # where the retry can go
        assert wait_for(lambda: gpus(platform)["T4"]["total"] == 4, 10)
        before_kill = datetime.now(UTC)
        ray_cluster.kill_worker("gpu-d")
        killed = datetime.now(UTC)
        got = platform.wait_status(str(first["id"]), "released", timeout=30)
        assert (datetime.now(UTC) - killed).total_seconds() < 30
        assert got["status_reason"] == "node gpu-d left the cluster"
        assert run.wait(60) == 0, (tmp_path / "run.err").read_text()
        assert run.stdout.read().split() == ["on", "gpu-e", "done"]
        assert platform.wait_status("lost", "failed", timeout=30)["status_reason"] == (
            "node gpu-d left the cluster"
        )
        platform.cli("instance", "start", "lost")
        assert platform.wait_status("lost", "running", timeout=60)["node"] == "gpu-e"
        said = platform.cli("exec", "lost", "--", "cat", "ckpt/epoch-3.pt").stdout
        assert said == "weights of epoch 3"
        with sqlite3.connect(platform.database_url.removeprefix("sqlite:///")) as db:
            told = [m for (m,) in db.execute("SELECT message FROM notifications")]
        why = "instance lost moved from gpu-d to gpu-e: node gpu-d left the cluster; its "
        assert any(m.startswith(why) and "before this start" in m for m in told), told
        platform.cli("instance", "release", "lost")
        platform.wait_status("lost", "released", timeout=60)
    finally:
        run.kill()
        run.wait()
        if run.stdout is not None:
            run.stdout.close()
        for name in {"gpu-d", "gpu-e"} & set(ray_cluster.workers):
            ray_cluster.kill_worker(name)  # the later tests see the cluster as it was
    stderr = (tmp_path / "run.err").read_text()
    assert "node gpu-d left the cluster; running the task again" in stderr, stderr
    # billed up to its runner's last heartbeat (sent a second before the kill at most, and
    # received a moment later on a busy machine), and the ledger holds exactly that
    with sqlite3.connect(platform.database_url.removeprefix("sqlite:///")) as db:
        ((started, ended, seconds, charged),) = db.execute(
            "SELECT started_at, ended_at, billed_seconds, charged_micro FROM usage_segments"
            " WHERE instance_id = ?",
            (first["id"],),
        ).fetchall()
        (ledger_total,) = db.execute(
            "SELECT -SUM(e.amount) FROM ledger_entries e JOIN ledger_transactions t"
            " ON t.id = e.transaction_id JOIN ledger_accounts a ON a.id = e.account_id"
            " WHERE t.instance_id = ? AND a.kind = 'wallet'",
            (first["id"],),
        ).fetchone()
    ended_at = datetime.fromisoformat(ended).replace(tzinfo=UTC)
    assert before_kill - timedelta(seconds=2.5) <= ended_at <= killed + timedelta(seconds=2)
    started_at = datetime.fromisoformat(started).replace(tzinfo=UTC)
    assert seconds == int((ended_at - started_at).total_seconds())
    assert ledger_total == charged
    assert wait_for(lambda: gpus(platform)["T4"]["total"] == 0, 30)  # gone nodes not counted


def placed(platform: Platform, name: str) -> dict[str, Any] | None:
    got = platform.cli_json("instance", "show", name)
    assert isinstance(got, dict)
    return got if got["status"] in ("starting", "running") else None


def test_a_stopped_instance_whose_node_is_full_starts_on_another_with_its_workspace(
    platform: Platform, ray_cluster: RayCluster
) -> None:
    platform.cli(
        "register", "--server", platform.url, "--name", "eve", "--password", "password-123"
    )
    # gpu-a and gpu-b hold 2 A100s each: an instance of 2 fills its node
    create = ("instance", "create", "--gpu", "A100-80GB:2", "--template", "python", "--wait")
    platform.cli(*create, "--name", "mover")
    first = platform.cli_json("instance", "show", "mover")
    assert isinstance(first, dict)
    node_a = first["node"]
    # the job's files, where its jobs write them: its workspace on node A
    data = ray_cluster.node_home / node_a / "workspaces" / str(first["id"]) / "data"
    data.mkdir()
    (data / "notes.txt").write_text("kept\n")
    (data / "notes.txt").chmod(0o755)
    big = os.urandom(5_000_000)
    (data / "big.bin").write_bytes(big)
    digest = hashlib.sha256(big).hexdigest()
    (data / "empty" / "deeper").mkdir(parents=True)
    # a package the user pip-installs into the instance's own venv layer (no index: a wheel)
    wheel = make_wheel(data.parent, "tinypkg", "1.0")
    install = f"pip install --no-index --quiet --disable-pip-version-check {wheel.name}"
    platform.cli("exec", "mover", "--", "sh", "-c", f"{install} && rm {wheel.name}")
    platform.cli("instance", "stop", "mover")
    saved = platform.wait_status("mover", "stopped", timeout=60)
    assert saved["last_node"] == node_a and saved["workspace_saved_at"] is not None
    # best fit, lowest node id: the filler takes node A (placed is enough: it holds the GPUs)
    platform.cli(*create[:-1], "--name", "filler")
    filler = wait_for(lambda: placed(platform, "filler"), 10)
    assert filler and filler["node"] == node_a, (filler, node_a)

    platform.cli("instance", "start", "mover")
    moved = platform.wait_status("mover", "running", timeout=60)
    node_b = moved["node"]
    assert node_b in {"gpu-a", "gpu-b"} and node_b != node_a
    assert moved["last_node"] == node_b
    check = (
        "cat data/notes.txt; test -x data/notes.txt && echo x; sha256sum data/big.bin; "
        "test -d data/empty/deeper && echo empty; "
        "python -c 'import tinypkg; print(tinypkg.VERSION)'"
    )
    said = platform.cli("exec", "mover", "--", "sh", "-c", check).stdout.split()
    assert said == ["kept", "x", digest, "data/big.bin", "empty", "1.0"], said
    with sqlite3.connect(platform.database_url.removeprefix("sqlite:///")) as db:
        told = [m for (m,) in db.execute("SELECT message FROM notifications")]
    why = f"instance mover moved from {node_a} to {node_b}: node {node_a} is full"
    assert any(m.startswith(why) and "before this start" in m for m in told), told
    for name in ("mover", "filler"):
        platform.cli("instance", "release", name)
    for name in ("mover", "filler"):
        platform.wait_status(name, "released", timeout=60)


def saved_since(platform: Platform, name: str, since: datetime) -> bool:
    got = platform.cli_json("instance", "show", name)
    assert isinstance(got, dict)
    saved = got["workspace_saved_at"]
    return saved is not None and datetime.fromisoformat(saved) > since
