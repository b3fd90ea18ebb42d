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
from pathlib import Path
from typing import IO

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

    Once prestart() was called (the `gpulease server` process does), the backend keeps one
    runner process started ahead of need (`python -m gpulease.runner --warm RUNNERS_DIR/`:
    Python up, the runner imported, reading its spec's path from a pipe only this process
    holds) and gives the next instance that one: an
    instance's runner then starts without the interpreter's start and the imports, most of
    its time before its first line. It is a runner like any other (same interpreter,
    environment, session of its own, log beside its spec), started before its spec exists;
    it exits when the pipe closes, with the server. The next one is started after each
    launch.
    """

    name = "local"
    same_host = True

    def __init__(self, python: str | None = None) -> None:
        self._python = python or sys.executable
        self._keep_warm = False
        self._runners_dir = Path("/")
        self._warm: subprocess.Popen[bytes] | None = None
        self._warm_lock = threading.Lock()

    def start(self, spec: RunnerSpec) -> str:
        run_dir = spec.run_dir
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(run_dir, 0o700)
        spec_file = run_dir / SPEC_FILE
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(spec.to_json())
        process = self._hand_to_warm(spec_file)
        if process is None:
            with open(run_dir / LOG_FILE, "ab") as runner_log:
                process = self._spawn([str(spec_file)], runner_log, run_dir)
        stat = read_stat(process.pid)  # not reaped yet, so it is still there
        assert stat is not None
        # Reap the runner when it exits, so it never lingers as a zombie of the server.
        threading.Thread(
            target=process.wait, name=f"reap-runner-{process.pid}", daemon=True
        ).start()
        log.info("started runner %d for instance %d", process.pid, spec.instance_id)
        if self._keep_warm:
            threading.Thread(target=self._warm_next, name="warm-runner", daemon=True).start()
        return _handle(process.pid, stat.start_time)

    def prestart(self, runners_dir: Path) -> None:
        """Start the runner process the next launch takes, unless one waits already; from
        now on another after each launch. Its argv names runners_dir (where every spec
        is), as a cold runner's names its spec: `pgrep -f RUNNERS_DIR/` finds them all."""
        with self._warm_lock:
            self._keep_warm, self._runners_dir = True, runners_dir
        self._warm_next()

    def _warm_next(self) -> None:
        """Start the waiting runner if none waits, unless stop_warm() came first (a launch's
        thread that runs after it must not start one that nobody would close)."""
        with self._warm_lock:
            if not self._keep_warm or (self._warm is not None and self._warm.poll() is None):
                return
            args = ["--warm", f"{self._runners_dir}/"]
            self._warm = self._spawn(args, subprocess.DEVNULL, Path("/"), stdin=True)

    def stop_warm(self) -> None:
        """No runner kept waiting any more: the waiting one's pipe is closed, so it exits."""
        with self._warm_lock:
            process, self._warm, self._keep_warm = self._warm, None, False
        if process is not None and process.stdin is not None:
            process.stdin.close()
            process.wait()

    def _hand_to_warm(self, spec_file: Path) -> subprocess.Popen[bytes] | None:
        """The waiting runner, given spec_file; None when there is none (or it is gone)."""
        with self._warm_lock:
            process, self._warm = self._warm, None
        if process is None or process.poll() is not None or process.stdin is None:
            return None
        try:
            process.stdin.write(f"{spec_file}\n".encode())
            process.stdin.close()
        except OSError:  # it exited meanwhile; it reads nothing more
            process.kill()
            process.wait()
            return None
        return process

    def _spawn(
        self, args: list[str], output: IO[bytes] | int, cwd: Path, *, stdin: bool = False
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [self._python, "-m", "gpulease.runner", *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=_runner_env(),
            start_new_session=True,
            close_fds=True,
        )

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
