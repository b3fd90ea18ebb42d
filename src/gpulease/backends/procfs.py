"""The process table as /proc shows it (for the local backend's handles and the runner's jobs)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that tell processes apart and say where they belong."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_time: int  # clock ticks after boot; with the pid it names one process for good

    @property
    def running(self) -> bool:
        """False for a zombie: it has exited and only waits for its parent to reap it."""
        return self.state not in {"Z", "X"}


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        start_time=int(fields[19]),
    )


def all_stats() -> list[ProcStat]:
    stats = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_stat(int(entry))
            if stat is not None:
                stats.append(stat)
    return stats


def group_running(pgid: int) -> bool:
    """True while a process of group pgid runs. Zombies do not count: orphans are reaped
    by init, which in containers may take seconds."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return any(stat.pgrp == pgid and stat.running for stat in all_stats())


def signal_group(pgid: int, signum: int) -> None:
    """Send signum to a process group; nothing happens when the group is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
