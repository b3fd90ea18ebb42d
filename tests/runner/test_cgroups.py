"""Each instance's CPU and memory share: the limits written for cgroup v2 and v1, and real
sandboxed jobs held to them (out of memory told as such, a CPU quota that holds)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulease.runner.cgroups import (
    CPU_ONLY_MEMORY_BYTES,
    CgroupError,
    InstanceCgroup,
    Share,
    cgroup_version,
    derive_share,
    instance_cgroup,
    remove_stale,
)
from gpulease.runner.jobs import RunProcess
from gpulease.runner.logs import LogBatcher
from gpulease.runner.sandbox import Sandbox, base_environment, find_bwrap, instance_uid

GB = 2**30


def test_the_share_comes_from_the_pricing_file_or_the_node() -> None:
    node = {"node_cpus": 32, "node_memory": 256 * GB}
    assert derive_share(vcpus=8, memory_bytes=64 * GB, gpus=1, node_gpus=4, **node) == Share(
        8.0, 64 * GB
    )
    # not in the pricing file: the instance's part of the node's GPUs
    assert derive_share(vcpus=None, memory_bytes=None, gpus=2, node_gpus=8, **node) == Share(
        8.0, 64 * GB
    )
    # CPU only (or the node's GPUs unknown): a small size; never more than the node has
    assert derive_share(vcpus=None, memory_bytes=None, gpus=0, node_gpus=8, **node) == Share(
        2.0, CPU_ONLY_MEMORY_BYTES
    )
    assert derive_share(vcpus=64, memory_bytes=10**15, gpus=1, node_gpus=1, **node) == Share(
        32.0, 256 * GB
    )


def fake_v2(root: Path) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "gpulease").mkdir()
    (root / "gpulease" / "cgroup.subtree_control").write_text("")
    return root


def fake_v1(root: Path) -> Path:
    for controller in ("cpu", "memory"):
        (root / controller).mkdir(parents=True)
        (root / controller / "tasks").write_text("")
    return root


def test_v2_limits(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "v2")
    assert cgroup_version(root) == 2
    group = InstanceCgroup.for_host("instance-3", Share(1.5, 2 * GB), root)
    group.create()
    directory = root / "gpulease" / "instance-3"
    assert (directory / "cpu.max").read_text() == "150000 100000"
    assert (directory / "memory.max").read_text() == str(2 * GB)
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert group.enter_args()[-2].startswith(f"echo $$ > {directory}/cgroup.procs && exec")
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert group.oom_kills() == 1
    for name in ("cpu.max", "memory.max", "memory.events"):
        (directory / name).unlink()
    group.remove()
    group.remove()  # idempotent
    assert not directory.exists()


def test_v1_limits(tmp_path: Path) -> None:
    root = fake_v1(tmp_path / "v1")
    assert cgroup_version(root) == 1
    group = InstanceCgroup.for_host("instance-4", Share(0.5, GB), root)
    group.create()
    cpu, memory = (
        root / "cpu" / "gpulease" / "instance-4",
        root / "memory" / "gpulease" / "instance-4",
    )
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (memory / "memory.limit_in_bytes").read_text() == str(GB)
    assert group.oom_kills() == 0
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.oom_kills() == 2
    assert "cgroup.procs" in group.enter_args()[-2] and str(memory) in group.enter_args()[-2]


def test_a_host_without_cgroups_runs_without_a_share(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="no cgroup hierarchy"):
        InstanceCgroup.for_host("x", Share(1, GB), tmp_path)
    found = instance_cgroup(
        1, tmp_path, vcpus=1, memory_bytes=GB, gpus=0, node_gpus=0, root=tmp_path
    )
    assert found is None


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_runner_removes_the_empty_cgroups_of_runners_that_are_gone(tmp_path: Path) -> None:
    gone, alive = dead_pid(), os.getpid()
    kept = [
        f"instance-7-{'a' * 10}-{alive}",  # a live runner's (maybe between its commands)
        f"instance-8-{'b' * 10}",  # named before cgroups carried the runner's pid
        "someone-else",
    ]
    v2 = fake_v2(tmp_path / "v2")
    v1 = fake_v1(tmp_path / "v1")
    parents = [v2 / "gpulease", v1 / "cpu" / "gpulease", v1 / "memory" / "gpulease"]
    for parent in parents:
        parent.mkdir(exist_ok=True)
        for name in [f"instance-5-{'c' * 10}-{gone}", *kept]:
            (parent / name).mkdir()
        # a process still in it: the kernel refuses the rmdir (here: a file in it)
        busy = parent / f"instance-6-{'d' * 10}-{gone}"
        busy.mkdir()
        (busy / "cgroup.procs").write_text("123\n")

    assert remove_stale(v2, 2) == 1
    group = instance_cgroup(
        9, tmp_path / "runs" / "9", vcpus=1, memory_bytes=GB, gpus=0, node_gpus=0, root=v1
    )
    assert group is not None and group.name.endswith(f"-{alive}")  # and it swept v1's
    for parent in parents:
        left = sorted(entry.name for entry in parent.iterdir() if entry.is_dir())
        assert left == sorted([*kept, f"instance-6-{'d' * 10}-{gone}"]), parent


BWRAP = find_bwrap()
needs_host = pytest.mark.skipif(
    BWRAP is None or os.geteuid() != 0 or cgroup_version() is None,
    reason="needs bubblewrap, root and writable cgroups",
)
INSTANCE_ID = 4_100_000 + os.getpid() % 100_000


def sandboxed(tmp_path: Path, n: int, share: Share) -> Sandbox:
    assert BWRAP is not None
    workspace = tmp_path / f"workspace-{n}"
    workspace.mkdir()
    return Sandbox(
        workspace=workspace,
        env_dir=Path(sys.prefix),
        hostname=f"gpulease-{n}",
        bwrap=BWRAP,
        uid=instance_uid(INSTANCE_ID + n),
        cgroup=InstanceCgroup.for_host(f"test-{os.getpid()}-{n}", share),
    )


def start(jail: Sandbox, run_id: int, command: str) -> RunProcess:
    env = jail.environment(base_environment(os.environ))
    run = RunProcess(
        run_id, command, env=env, cwd=jail.workspace, batcher=LogBatcher(), sandbox=jail
    )
    run.start()
    return run


def finish(run: RunProcess, timeout: float = 60.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while not run.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.finished, f"run {run.run_id} did not finish"
    run.batcher.seal()
    streams = {"stdout": "", "stderr": ""}
    for chunk in run.batcher.unacked(max_bytes=10**9):
        streams[chunk.stream] += chunk.data
    return streams


@needs_host
def test_out_of_memory_ends_only_that_run_and_says_so(tmp_path: Path) -> None:
    greedy = sandboxed(tmp_path, 1, Share(1, 128 * 2**20))
    other = sandboxed(tmp_path, 2, Share(1, 256 * 2**20))
    try:
        hog = start(greedy, 1, f"{sys.executable} -c \"b = b'x' * (512 * 2**20)\"; echo after $?")
        calm = start(other, 2, "sleep 1; echo still here")
        hog_out, calm_out = finish(hog), finish(calm)
        # the shell that started the hog lives on: only the process that overran is gone
        assert hog_out["stdout"] == "after 137\n", hog_out
        assert "out of memory (limit 0.125 GB)" in hog_out["stderr"]
        assert (calm.exit_code, calm_out["stdout"]) == (0, "still here\n")
        assert "out of memory" not in calm_out["stderr"]
    finally:
        greedy.close()
        other.close()
    for jail in (greedy, other):
        assert jail.cgroup is not None
        assert not any(directory.exists() for directory in jail.cgroup.directories)


@needs_host
def test_a_killed_runners_cgroup_goes_once_empty() -> None:
    name = f"instance-{INSTANCE_ID}-{'e' * 10}-{dead_pid()}"
    group = InstanceCgroup.for_host(name, Share(0.5, GB))
    group.create()
    stays = subprocess.Popen([*group.enter_args(), "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        procs = group.directories[0] / "cgroup.procs"
        while str(stays.pid) not in procs.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert str(stays.pid) in procs.read_text().split()
        remove_stale(group.root, group.version)  # a job of it still runs: it stays
        assert all(directory.exists() for directory in group.directories)
    finally:
        stays.kill()
        stays.wait()
    deadline = time.monotonic() + 5
    while remove_stale(group.root, group.version) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # a killed process takes a moment to leave its cgroup
    assert not any(directory.exists() for directory in group.directories)


@needs_host
def test_a_cpu_bound_job_gets_about_its_share(tmp_path: Path) -> None:
    jail = sandboxed(tmp_path, 3, Share(0.5, GB))
    busy = (
        "import time\n"
        "wall, cpu = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - wall < 1.5: pass\n"
        "print(f'{(time.process_time() - cpu) / (time.monotonic() - wall):.2f}')\n"
    )
    try:
        out = finish(start(jail, 3, f"{sys.executable} -c {shlex.quote(busy)}"))
    finally:
        jail.close()
    ratio = float(out["stdout"])
    assert 0 < ratio < 0.8, out
