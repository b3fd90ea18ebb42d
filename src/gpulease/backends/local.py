"""The local backend: runners are detached processes on this host."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading

from gpulease.backends.base import RunnerSpec
from gpulease.backends.procfs import ProcStat, all_stats, read_stat

log = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
LOG_FILE = "runner.log"
_FREEZE_ROUNDS = 3


def _handle(pid: int, start_time: int) -> str:
    return json.dumps({"pid": pid, "start_time": start_time})


def _parse_handle(handle: str) -> tuple[int, int] | None:
    try:
        data = json.loads(handle)
        return int(data["pid"]), int(data["start_time"])
    except (ValueError, KeyError, TypeError):
        log.error("not a local backend handle: %r", handle)
        return None


def _is_running(stat: ProcStat | None, start_time: int) -> bool:
    return stat is not None and stat.start_time == start_time and stat.running


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _runner_env() -> dict[str, str]:
    """The server's environment minus its settings: a runner and its jobs never see them."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPULEASE_")}


class LocalBackend:
    """Runners as processes of this host, each the leader of its own session.

    The handle is {"pid", "start_time"}: the start time tells our runner from a later
    process that got the same pid.
    """

    name = "local"
    same_host = True

    def __init__(self, python: str | None = None) -> None:
        self._python = python or sys.executable

    def start(self, spec: RunnerSpec) -> str:
        run_dir = spec.run_dir
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(run_dir, 0o700)
        spec_file = run_dir / SPEC_FILE
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(spec.to_json())
        with open(run_dir / LOG_FILE, "ab") as runner_log:
            process = subprocess.Popen(
                [self._python, "-m", "gpulease.runner", str(spec_file)],
                stdin=subprocess.DEVNULL,
                stdout=runner_log,
                stderr=subprocess.STDOUT,
                cwd=run_dir,
                env=_runner_env(),
                start_new_session=True,
                close_fds=True,
            )
        stat = read_stat(process.pid)  # not reaped yet, so it is still there
        assert stat is not None
        # Reap the runner when it exits, so it never lingers as a zombie of the server.
        threading.Thread(
            target=process.wait, name=f"reap-runner-{process.pid}", daemon=True
        ).start()
        log.info("started runner %d for instance %d", process.pid, spec.instance_id)
        return _handle(process.pid, stat.start_time)

    def alive(self, handle: str) -> bool:
        parsed = _parse_handle(handle)
        return parsed is not None and _is_running(read_stat(parsed[0]), parsed[1])

    def delete_workspace(self, node: str, name: str) -> None:
        """Nothing: the workspace is on this host, where the server deletes it itself."""

    def stop(self, handle: str, *, force: bool = False) -> None:
        """SIGTERM the runner (it stops its jobs and reports), or with force SIGKILL the runner
        and every process of its session or below it. Never raises for a gone runner."""
        parsed = _parse_handle(handle)
        if parsed is None:
            return
        pid, start_time = parsed
        stat = read_stat(pid)
        if stat is not None and stat.start_time != start_time:
            return  # the pid belongs to another process now; ours is long gone
        if not force:
            if _is_running(stat, start_time):
                _signal(pid, signal.SIGTERM)
            return
        victims = _freeze_tree(pid)
        for victim in victims:
            _signal(victim, signal.SIGKILL)
        if victims:
            log.info("killed runner %d and %d processes of its jobs", pid, len(victims) - 1)


def _freeze_tree(runner_pid: int) -> list[int]:
    """SIGSTOP the runner, its session and its descendants, rescanning so that nothing forked
    in between escapes; the stopped processes stay where they are until SIGKILL."""
    frozen: set[int] = set()
    me = os.getpid()
    for _ in range(_FREEZE_ROUNDS):
        stats = all_stats()
        children: dict[int, list[int]] = {}
        for stat in stats:
            children.setdefault(stat.ppid, []).append(stat.pid)
        found = {s.pid for s in stats if s.session == runner_pid or s.pid == runner_pid}
        found.discard(me)  # a session member may be the caller only in odd tests; never us
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found and child != me:
                    found.add(child)
                    todo.append(child)
        new = found - frozen
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        frozen |= new
    return sorted(frozen, key=lambda pid: pid != runner_pid)
