"""Each instance's CPU and memory share: a cgroup of its own that every one of its processes
starts in, with a CPU quota and a memory limit the kernel enforces.

cgroup v2 where the host has it with the cpu and memory controllers
(`/sys/fs/cgroup/cgroup.controllers`): `/sys/fs/cgroup/gpulease/<name>`, cpu.max and
memory.max (no swap beyond it). Otherwise v1: `/sys/fs/cgroup/{cpu,memory}/gpulease/<name>`,
cpu.cfs_quota_us and memory.limit_in_bytes (and memsw, where swap accounting is on).

A job that allocates past the limit meets the kernel's OOM killer inside its own cgroup: it
loses its own process, other instances and the runner never notice. The OOM counter
(memory.events / memory.oom_control) tells the runner afterwards why the job died.

A cgroup's name ends in the pid of the runner that made it. The runner removes it when the
instance stops; a runner that was killed cannot, so each runner, when it makes its own,
removes the empty ones whose runner is gone (a live runner's are never touched: between
making its cgroup and moving a command into it, nothing else may take it away).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "gpulease"
CPU_PERIOD_US = 100_000
MIN_MEMORY_BYTES = 64 * 2**20
# A CPU-only instance's share when the pricing file does not size it.
CPU_ONLY_VCPUS = 2.0
CPU_ONLY_MEMORY_BYTES = 8 * 2**30
_SH = "/bin/sh"
# instance-ID-TAG-PID: the instance, the runner directory's tag, the runner's pid.
_INSTANCE_NAME = re.compile(r"instance-[0-9]+-[0-9a-f]{10}-([0-9]+)")


class CgroupError(Exception):
    """The cgroup cannot be made or limited; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Share:
    """What an instance may use of its node: vCPUs (a quota, fractions allowed) and bytes."""

    vcpus: float
    memory_bytes: int

    def memory_text(self) -> str:
        return f"{self.memory_bytes / 2**30:g} GB"


def node_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def derive_share(
    *,
    vcpus: float | None,
    memory_bytes: int | None,
    gpus: int,
    node_gpus: int,
    node_cpus: int | None = None,
    node_memory: int | None = None,
) -> Share:
    """The share from the pricing file's figures where it has them; otherwise the node's
    cores and memory times the instance's part of the node's GPUs (a CPU-only instance:
    CPU_ONLY_*). Never more than the node has."""
    cores = node_cpus or os.cpu_count() or 1
    memory = node_memory or node_memory_bytes()
    part = min(1.0, gpus / node_gpus) if gpus and node_gpus else 0.0
    if vcpus is None:
        vcpus = cores * part if part else min(CPU_ONLY_VCPUS, cores)
    if memory_bytes is None:
        memory_bytes = int(memory * part) if part else min(CPU_ONLY_MEMORY_BYTES, memory)
    return Share(
        vcpus=max(0.01, min(float(vcpus), float(cores))),
        memory_bytes=max(MIN_MEMORY_BYTES, min(int(memory_bytes), memory)),
    )


def cgroup_version(root: Path = CGROUP_ROOT) -> int | None:
    """2 when root is a cgroup v2 hierarchy offering cpu and memory, 1 when v1's cpu and
    memory hierarchies are mounted under it, None when neither."""
    with contextlib.suppress(OSError):
        if {"cpu", "memory"} <= set((root / "cgroup.controllers").read_text().split()):
            return 2
    if (root / "cpu" / "tasks").exists() and (root / "memory" / "tasks").exists():
        return 1
    return None


def _parents(root: Path, version: int) -> list[Path]:
    """Where the instance cgroups live: v2's one hierarchy, or v1's cpu and then memory."""
    if version == 2:
        return [root / PARENT]
    return [root / "cpu" / PARENT, root / "memory" / PARENT]


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class InstanceCgroup:
    """One instance's cgroup. create() makes it and sets the limits (idempotent);
    enter_args() is the argv prefix that moves a command into it before it runs;
    oom_kills() counts the processes the kernel killed in it for memory; remove() deletes
    it once empty (idempotent)."""

    name: str
    share: Share
    root: Path = CGROUP_ROOT
    version: int = 2

    @classmethod
    def for_host(cls, name: str, share: Share, root: Path = CGROUP_ROOT) -> InstanceCgroup:
        version = cgroup_version(root)
        if version is None:
            raise CgroupError(
                f"no cgroup hierarchy with the cpu and memory controllers under {root}; "
                "mount cgroup2 there (or v1's cpu and memory hierarchies)"
            )
        return cls(name=name, share=share, root=root, version=version)

    @property
    def directories(self) -> list[Path]:
        return [parent / self.name for parent in _parents(self.root, self.version)]

    def create(self) -> None:
        quota = max(1000, round(self.share.vcpus * CPU_PERIOD_US))
        memory = str(self.share.memory_bytes)
        try:
            for directory in self.directories:
                directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot make the cgroup {self.name}: {exc}") from exc
        if self.version == 2:
            for parent in (self.root, self.root / PARENT):
                enabled = set((parent / "cgroup.subtree_control").read_text().split())
                if not {"cpu", "memory"} <= enabled:
                    _write(parent / "cgroup.subtree_control", "+cpu +memory")
            (group,) = self.directories
            _write(group / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            _write(group / "memory.max", memory)
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", "0")
            return
        cpu, mem = self.directories
        _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        memsw = mem / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # memsw must stay >= the limit: raise it first when growing
            with contextlib.suppress(CgroupError):
                _write(memsw, memory)
        _write(mem / "memory.limit_in_bytes", memory)
        if memsw.exists():
            _write(memsw, memory)

    def enter_args(self) -> list[str]:
        """`sh -c 'echo $$ > …/cgroup.procs; exec "$@"'`: the command runs in the cgroup
        from its first instruction, and so does everything it starts. Runs as root on the
        host side, before the sandbox; the paths are the runner's own."""
        moves = " && ".join(
            f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.directories
        )
        return [_SH, "-c", f'{moves} && exec "$@"', "gpulease-cgroup"]

    def oom_kills(self) -> int:
        """Processes killed so far in this cgroup because it reached its memory limit."""
        if self.version == 2:
            path = self.directories[0] / "memory.events"
        else:
            path = self.directories[1] / "memory.oom_control"
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return 0
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self, wait_s: float = 2.0) -> None:
        """Delete the cgroup; the kernel refuses while a process is still in it (one that
        was just killed may take a moment to go), so that is retried for up to wait_s."""
        deadline = time.monotonic() + wait_s
        for directory in self.directories:
            while True:
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    log.warning("cgroup %s is not removed: %s", directory, exc)
                break


def pid_alive(pid: int) -> bool:
    """Whether a process pid exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(root: Path = CGROUP_ROOT, version: int = 2) -> int:
    """Remove the instance cgroups left by runners that are gone (killed before they could
    remove their own: the name's pid is no process now) and that are empty; how many went.
    One with a process still in it stays (the kernel refuses), as does any name this module
    did not make."""
    removed = 0
    for parent in _parents(root, version):
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            found = _INSTANCE_NAME.fullmatch(entry.name)
            if found is None or pid_alive(int(found[1])) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                os.rmdir(entry.path)
            except FileNotFoundError:
                continue  # another runner removed it first
            except OSError as exc:
                log.warning("cgroup %s of a runner that is gone stays: %s", entry.path, exc)
                continue
            removed += 1
    if removed:
        log.info("removed %d empty cgroup(s) of runners that are gone", removed)
    return removed


def instance_cgroup(
    instance_id: int,
    run_dir: Path,
    *,
    vcpus: float | None,
    memory_bytes: int | None,
    gpus: int,
    node_gpus: int,
    root: Path = CGROUP_ROOT,
) -> InstanceCgroup | None:
    """The cgroup of a runner's instance (named by the instance, the runner's directory, so
    that two servers on one host never share one, and this runner's pid); None, with a
    warning, on a host without cgroups: its jobs then run without a share. Removes the
    empty cgroups of runners that are gone on the way (remove_stale)."""
    share = derive_share(vcpus=vcpus, memory_bytes=memory_bytes, gpus=gpus, node_gpus=node_gpus)
    tag = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
    name = f"instance-{instance_id}-{tag}-{os.getpid()}"
    try:
        group = InstanceCgroup.for_host(name, share, root)
    except CgroupError as exc:
        log.warning("instance %d runs without a CPU and memory share: %s", instance_id, exc)
        return None
    remove_stale(root, group.version)
    return group
