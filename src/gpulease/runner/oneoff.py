"""One short command for the runner's own purposes (build the venv layer, `pip freeze`),
run inside the instance's sandbox as its jobs are, with its output read as hostile text.

The command's program and everything it imports may be the job's (the layer venv lies in
the workspace), so it never runs on the host: only inside the sandbox, where it can do no
more than the job itself. Its output is bounded (a job could print forever), and when it
ends, or times out, its whole process group is killed; in the sandbox the PID namespace
dies with the command, taking anything it left running with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from io import BufferedReader

from gpulease.runner.sandbox import Sandbox

OUTPUT_LIMIT = 1024 * 1024
_KILL_WAIT_S = 5.0
_POLL_S = 0.05


@dataclass(frozen=True)
class Outcome:
    """How a command ended: its exit code (None when it was killed for running too long),
    the first bytes of stdout and of stderr, and whether it was killed for printing more
    than that."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool

    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def error_tail(self, chars: int = 2000) -> str:
        text = (self.stderr or self.stdout).decode("utf-8", errors="replace")
        return text.strip()[-chars:]


# argv, environment, timeout -> outcome: where the runner's one-off commands run.
Executor = Callable[[Sequence[str], Mapping[str, str], float], Outcome]


def run_bounded(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    timeout: float,
    limit: int = OUTPUT_LIMIT,
) -> Outcome:
    """Run argv in a session of its own with stdin closed, for at most timeout seconds
    and until it prints more than limit bytes on stdout or stderr (then it is killed:
    truncated). OSError when it cannot start."""
    process = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    kept: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    overflow = threading.Event()

    def drain(name: str, stream: BufferedReader) -> None:
        while block := stream.read1(65536):
            room = limit - len(kept[name])
            if len(block) > room:
                overflow.set()  # a command printing without end is stopped
            kept[name] += block[: max(room, 0)]

    readers = [
        threading.Thread(target=drain, args=(name, stream), daemon=True)
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))
        if stream is not None
    ]
    for reader in readers:
        reader.start()
    code: int | None = None
    deadline = time.monotonic() + timeout
    try:
        while not overflow.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                code = process.wait(timeout=min(left, _POLL_S))
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        # Whatever it started in its session goes with it (the sandbox's whole PID
        # namespace goes when its init does).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for reader in readers:
        reader.join(_KILL_WAIT_S)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    return Outcome(code, bytes(kept["stdout"]), bytes(kept["stderr"]), overflow.is_set())


def on_host(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> Outcome:
    """The executor of a runner without a sandbox: its jobs run on the host as the runner
    does, so its one-off commands may too (no boundary is crossed that a job could not)."""
    return run_bounded(argv, env=env, timeout=timeout)


def in_sandbox(sandbox: Sandbox) -> Executor:
    """The executor that runs each command inside sandbox, as the instance's jobs run; env
    is translated as a run's is (HOME, PATH and VIRTUAL_ENV under /workspace)."""

    def execute(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> Outcome:
        return run_bounded(
            sandbox.command(list(argv)),
            env=sandbox.environment(env),
            cwd=str(sandbox.workspace),
            timeout=timeout,
        )

    return execute
