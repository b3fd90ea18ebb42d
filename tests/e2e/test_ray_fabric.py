"""Ranks of a multi-node run reach each other from inside their sandboxes over a job fabric:
a real server with GPULEASE_FABRIC_CIDR on the shared Ray test cluster, whose worker nodes
name a veth parent in a namespace of this test process (tests/fabric_support.py); each
rank's runner puts a macvlan of it in the rank's network namespace."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fabric_support
from gpulease.runner.netns import NETNS_DIR, probe
from processes import Platform
from ray_support import RayCluster, running_ray_platform

pytestmark = pytest.mark.e2e
pytest.importorskip("ray", reason="Ray is not installed: pip install 'gpulease[ray]'")

CIDR = "10.213.0.0/24"
ALL_REDUCE = """\
num_nodes: 2
resources: {accelerators: 'A100-80GB:1'}
template: pytorch
run: |
  python - <<'EOF'
  import datetime, os
  import torch, torch.distributed as dist
  rank, size = int(os.environ["NODE_RANK"]), int(os.environ["WORLD_SIZE"])
  dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size,
                          timeout=datetime.timedelta(seconds=60))
  value = torch.tensor([float(rank + 1)])
  dist.all_reduce(value)
  print(f"sum={value.item():g} rank={rank} master={os.environ['MASTER_ADDR']}"
        f" ifname={os.environ['GLOO_SOCKET_IFNAME']}", flush=True)
  dist.destroy_process_group()
  EOF
"""
# Rank 0 listens on 29777 until released; rank 1 connects to it (its own gang's peer).
LISTENER = """\
num_nodes: 2
resources: {accelerators: 'A100-80GB:1'}
template: python
run: |
  python - <<'EOF'
  import os, socket, time
  peer = os.environ["SKYPILOT_NODE_IPS"].splitlines()[0]
  if os.environ["NODE_RANK"] == "0":
      s = socket.socket()
      s.bind(("0.0.0.0", 29777))
      s.listen()
      print(f"listening at {peer}", flush=True)
      while True:
          s.accept()[0].close()
  time.sleep(1)
  socket.create_connection((peer, 29777), timeout=10).close()
  print("rank 1 reached its rank 0", flush=True)
  time.sleep(600)
  EOF
"""
# The first thing each rank does: connect to another gang's listening rank and to a host
# of the fabric range, then to its own peer's port that nobody listens on.
INTRUDER = """\
num_nodes: 2
resources: {accelerators: 'A100-80GB:1'}
template: python
run: |
  python - <<'EOF'
  import os, socket
  def attempt(address, port):
      try:
          socket.create_connection((address, port), timeout=3).close()
          return "connected"
      except OSError as exc:
          return "refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__
  rank = os.environ["NODE_RANK"]
  print(f"rank {rank} other gang: {attempt('TARGET', 29777)}", flush=True)
  print(f"rank {rank} fabric host: {attempt('HOST', 29777)}", flush=True)
  mine = [a for a in os.environ["SKYPILOT_NODE_IPS"].splitlines()]
  print(f"rank {rank} own gang: {mine}", flush=True)
  EOF
"""


@pytest.fixture(scope="module")
def fabric() -> Iterator[str]:
    """The namespace that the shared cluster's workers name in GPULEASE_FABRIC_NETNS."""
    if (reason := probe()) is not None:
        pytest.skip(f"no instance network here: {reason}")
    with fabric_support.fabric_namespace() as name:
        yield name


@pytest.fixture(scope="module")
def platform(
    ray_cluster: RayCluster,
    fabric: str,
    sqlite_migrated: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Platform]:
    tmp_path = tmp_path_factory.mktemp("ray-fabric")
    shutil.copyfile(sqlite_migrated, tmp_path / "gpulease.db")
    with running_ray_platform(
        ray_cluster,
        tmp_path,
        f"sqlite:///{tmp_path / 'gpulease.db'}",
        {"GPULEASE_FABRIC_CIDR": CIDR},
    ) as p:
        p.cli("register", "--server", p.url, "--name", "fay", "--password", "password-123")
        yield p


def task(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def lines_of(stdout: str) -> list[str]:
    return [line.removeprefix("(rank 1) ") for line in stdout.splitlines()]


def listed(platform: Platform) -> list[dict[str, Any]]:
    found: Any = platform.cli_json("instance", "ls", "--all")
    return list(found)


def release_all(platform: Platform) -> None:
    members = listed(platform)
    for member in members:
        if member["status"] != "released":
            platform.cli("instance", "release", str(member["id"]), check=False)
    for member in members:
        platform.wait_status(str(member["id"]), "released")


def ruleset(path: Path) -> str:
    """The nftables rules in the network namespace bound at path (read as root)."""
    argv = ["nsenter", f"--net={path}", "--", "nft", "list", "ruleset"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def fabric_namespace_of(instance_id: int) -> tuple[Path, str]:
    """The network namespace of instance_id's runner and its rules. Namespaces are named
    i{ID}-{RUNNER PID}, and a test of another database running beside this one (pytest -n)
    may have an instance of the same id: the gang rank's is the one with fabric0 rules."""
    found = []
    for path in NETNS_DIR.glob(f"i{instance_id}-[0-9]*[0-9]"):
        try:
            rules = ruleset(path)
        except subprocess.CalledProcessError:
            continue  # gone meanwhile
        if '"fabric0"' in rules:
            found.append((path, rules))
    ((path, rules),) = found
    return path, rules


def addresses(rules: str) -> set[str]:
    """The fabric addresses the rules name (10.213.0.x)."""
    return set(re.findall(r"10\.213\.0\.\d+", rules))


def test_two_sandboxed_ranks_all_reduce_over_the_fabric(platform: Platform, tmp_path: Path) -> None:
    result = platform.cli("run", str(task(tmp_path, "allreduce", ALL_REDUCE)), check=False)
    said = sorted(line for line in lines_of(result.stdout) if line.startswith("sum="))
    assert len(said) == 2, f"{result.stdout}\n{result.stderr}"
    fields = [dict(f.split("=", 1) for f in line.split()) for line in said]
    assert [f["sum"] for f in fields] == ["3", "3"]  # 1 + 2, on both ranks
    assert [f["rank"] for f in fields] == ["0", "1"]
    assert {f["ifname"] for f in fields} == {"fabric0"}
    masters = {f["master"] for f in fields}
    assert len(masters) == 1 and masters <= {f"10.213.0.{n}" for n in range(1, 254)}
    assert result.returncode == 0, result.stderr
    release_all(platform)


def test_a_rank_reaches_only_its_own_gang_from_its_first_instruction(
    platform: Platform, fabric: str, tmp_path: Path
) -> None:
    namespaces: list[Path] = []  # the ranks', seen while they run
    listener = platform.popen_cli(
        "run", str(task(tmp_path, "listener", LISTENER)), stderr_path=tmp_path / "listener.err"
    )
    try:
        assert listener.stdout is not None
        deadline = time.monotonic() + 120
        target, reached = "", False
        while time.monotonic() < deadline and not (target and reached):
            line = listener.stdout.readline().removeprefix("(rank 1) ").strip()
            if line.startswith("listening at "):
                target = line.removeprefix("listening at ")
            reached = reached or line == "rank 1 reached its rank 0"
            if not line and listener.poll() is not None:
                break
        assert target and reached, (tmp_path / "listener.err").read_text()
        gang = [m for m in listed(platform) if m["status"] == "running"]
        assert len(gang) == 2, gang
        for member in gang:  # each rank's namespace allows exactly its peer on fabric0
            path, rules = fabric_namespace_of(int(member["id"]))
            namespaces.append(path)
            (peer,) = addresses(rules)  # the other rank: not its own, nobody else's
            assert (peer == target) == (member["gang_rank"] == 1), rules
            assert f'oifname "fabric0" ip daddr {peer} accept' in rules, rules
            assert f'iifname "fabric0" ip saddr {peer} accept' in rules, rules
        intruder = INTRUDER.replace("TARGET", target).replace("HOST", fabric_support.HOST_ADDRESS)
        result = platform.cli("run", str(task(tmp_path, "intruder", intruder)))
        said = set(lines_of(result.stdout))
        for rank in (0, 1):
            assert f"rank {rank} other gang: refused" in said, result.stdout
            assert f"rank {rank} fabric host: refused" in said, result.stdout
        own = [line for line in said if line.startswith("rank 0 own gang: ")]
        assert own and target not in own[0]  # addresses are the gang's own
    finally:
        release_all(platform)
        listener.wait(60)
        # the ranks' namespaces, and the macvlans in them, went with their runners
        assert not [path for path in namespaces if path.exists()]
        assert not [n for n in fabric_support.links(fabric) if n.startswith("gf")]
        if listener.stdout is not None:
            listener.stdout.close()


def test_a_node_without_its_fabric_parent_fails_the_gang_with_what_to_set(
    platform: Platform, fabric: str, tmp_path: Path
) -> None:
    fabric_support.ip("link", "set", fabric_support.PARENT, "down", netns=fabric)
    fabric_support.ip("link", "set", fabric_support.PARENT, "name", "gplfabgone", netns=fabric)
    try:
        result = platform.cli("run", str(task(tmp_path, "allreduce", ALL_REDUCE)), check=False)
        assert result.returncode != 0
        members = listed(platform)
        reasons = [m["status_reason"] for m in members if m["status"] in ("failed", "stopped")]
        assert reasons, members
        assert any(
            "parent interface gplfab0 (GPULEASE_FABRIC_PARENT) is not on this node" in r
            for r in reasons
        ), reasons
    finally:
        fabric_support.ip("link", "set", "gplfabgone", "name", fabric_support.PARENT, netns=fabric)
        fabric_support.ip("link", "set", fabric_support.PARENT, "up", netns=fabric)
        release_all(platform)
