"""A run's process: `bash -c COMMAND` in its own process group, its output read into a batcher."""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO

from gpulease.backends.base import RunnerSpec
from gpulease.backends.procfs import group_running, signal_group
from gpulease.runner.logs import LogBatcher
from gpulease.runner.sandbox import Sandbox, SandboxError, exit_code_from_sandbox, popen

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
# After a run's main process exits: how long the processes it left behind get after SIGTERM,
# and how long output may still trickle out of pipes that escaped the process group.
LEFTOVER_GRACE_S = 2.0
# How often the leftovers are looked for meanwhile: they usually go within milliseconds of
# the SIGTERM (in the sandbox the kernel is already killing them), and the run's end waits.
LEFTOVER_POLL_S = 0.005
READ_BYTES = 64 * 1024
SANDBOX_START_TIMEOUT_S = 30.0
_DROPPED_VARIABLES = ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV")
# The first line of every run's bash. A stop sends SIGTERM to the run's whole process group;
# without a handler bash would end at once while its program is still saving a checkpoint,
# and in the sandbox bubblewrap's init exits with bash, after which the kernel kills what is
# left of the job's PID namespace. With this trap bash waits for its foreground command to
# finish first, then ends by the same SIGTERM, so the run reads as stopped (-15) as before.
# A job's own `trap ... TERM` replaces it.
KEEP_GRACE = "trap 'trap - TERM; kill -TERM $$' TERM\n"


def run_env(
    spec: RunnerSpec,
    env_dir: Path,
    run_id: int,
    extra: Mapping[str, str],
    base: Mapping[str, str] | None = None,
    datasets_dir: str | None = None,
    layer: Path | None = None,
) -> dict[str, str]:
    """The environment of a run: the runner's own (base), the instance's extra_env, the run's
    env, then what the protocol fixes and nobody may override: CUDA_VISIBLE_DEVICES (exactly
    the instance's GPUs, in NVML's PCI order), the venvs first on PATH, GPULEASE_* ids, the
    node's name (GPULEASE_NODE).

    layer: the instance's writable venv (envs/layer.py); its bin comes before the template
    venv's and it is VIRTUAL_ENV. Host paths: a sandbox translates them (Sandbox.environment).
    """
    env = {
        key: value
        for key, value in (os.environ if base is None else base).items()
        if key not in _DROPPED_VARIABLES and not key.startswith("GPULEASE_")
    }
    env.update(spec.extra_env)
    env.update(extra)
    venvs = [env_dir] if layer is None else [layer, env_dir]
    path = os.pathsep.join([*(str(venv / "bin") for venv in venvs), env.get("PATH") or os.defpath])
    env.update(
        {
            "PATH": path,
            "VIRTUAL_ENV": str(venvs[0]),
            "CUDA_VISIBLE_DEVICES": ",".join(str(index) for index in spec.gpu_indices),
            # NVML and nvidia-smi number GPUs in PCI bus order; CUDA, unless told, puts the
            # fastest first. Without this, index 1 could be another tenant's GPU.
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPULEASE_INSTANCE_ID": str(spec.instance_id),
            "GPULEASE_RUN_ID": str(run_id),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if datasets_dir is not None:
        env["GPULEASE_DATASETS_DIR"] = datasets_dir  # each mounted dataset is DIR/NAME
    if spec.node:
        env["GPULEASE_NODE"] = spec.node  # the node's name in `gpulease nodes`
    return env


class RunProcess:
    """One run. start() spawns it; when its main process has exited, whatever it left in its
    process group has been stopped and all its output is in the batcher, `exit_code` is set
    and the batcher is closed (a signal N gives -N).

    With a sandbox, `bash -c COMMAND` runs inside bubblewrap (see runner/sandbox.py) and
    `pid` is the host pid of the sandbox's init: the job's processes are in its session and
    process group, so signals reach them as without a sandbox. When the main process exits,
    the kernel kills whatever it left in its PID namespace at once.
    """

    def __init__(
        self,
        run_id: int,
        command: str,
        *,
        env: Mapping[str, str],
        cwd: Path,
        batcher: LogBatcher,
        leftover_grace_s: float = LEFTOVER_GRACE_S,
        sandbox: Sandbox | None = None,
        on_output: Callable[[str, str], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.command = command
        self.batcher = batcher
        self.exit_code: int | None = None
        self.pid = 0
        self._env = dict(env)
        self._cwd = cwd
        self._leftover_grace = leftover_grace_s
        self._process: subprocess.Popen[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._abandon = threading.Event()
        self._sandbox = sandbox
        # The instance's OOM kills before this run: more after it means the kernel killed
        # the run's process for going past the instance's memory share.
        self._oom_kills_before = 0
        # Also given every piece of output, (stream, text), from the reader threads
        # (runner/metrics.py parses stdout for key=value lines).
        self._on_output = on_output

    def start(self) -> None:
        """Spawn the run. A run that cannot be spawned ends at once with exit code 127 and
        the reason in its stderr."""
        bash = shutil.which("bash") or "/bin/bash"
        argv = [bash, "-c", KEEP_GRACE + self.command]
        info_read = info_write = -1
        try:
            if self._sandbox is not None:
                info_read, info_write = os.pipe()
                argv = self._sandbox.command(argv, info_fd=info_write)
                if self._sandbox.cgroup is not None:
                    self._oom_kills_before = self._sandbox.cgroup.oom_kills()
            # From the launcher thread, not the caller's: the loop that polls for runs
            # returns at a stop, and bwrap's --die-with-parent would then SIGKILL the job.
            process = popen(
                argv,
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                process_group=0,
                close_fds=True,
                pass_fds=(info_write,) if info_write >= 0 else (),
            )
        except (OSError, SandboxError) as exc:
            reason = exc.message if isinstance(exc, SandboxError) else str(exc)
            log.error("run %d could not start: %s", self.run_id, reason)
            self.batcher.write("stderr", f"gpulease: the run could not start: {reason}\n")
            self.exit_code = 127
            self.batcher.close()
            if info_read >= 0:
                os.close(info_read)
            return
        finally:
            if info_write >= 0:
                os.close(info_write)
        self._process = process
        self.pid = process.pid
        assert process.stdout is not None and process.stderr is not None
        for stream, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            reader = threading.Thread(
                target=self._read, args=(stream, pipe), name=f"run-{self.run_id}-{stream}"
            )
            reader.start()
            self._readers.append(reader)
        if info_read >= 0:
            self.pid = _sandbox_init_pid(info_read)
        threading.Thread(target=self._watch, name=f"run-{self.run_id}-watch").start()
        log.info("run %d started as pid %d: %s", self.run_id, process.pid, self.command)

    @property
    def finished(self) -> bool:
        return self.batcher.closed

    def group_exists(self) -> bool:
        return self.pid > 0 and group_running(self.pid)

    def signal(self, signum: int) -> None:
        """Send signum to the run's whole process group."""
        if self.pid > 0:
            signal_group(self.pid, signum)

    def _read(self, stream: str, pipe: IO[bytes]) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fd = pipe.fileno()
        try:
            while not self._abandon.is_set():
                ready, _, _ = select.select([fd], [], [], 0.2)
                if not ready:
                    continue
                data = os.read(fd, READ_BYTES)
                if not data:
                    break
                self._write(stream, decoder.decode(data))
            self._write(stream, decoder.decode(b"", final=True))
        finally:
            pipe.close()

    def _write(self, stream: str, text: str) -> None:
        self.batcher.write(stream, text)
        if self._on_output is not None and text:
            try:
                self._on_output(stream, text)
            except Exception:  # the log must go on whatever happens to metrics
                log.exception("run %d: reading metrics from its output failed", self.run_id)

    def _watch(self) -> None:
        assert self._process is not None
        code = self._process.wait()
        if self._sandbox is not None:
            code = exit_code_from_sandbox(code)
        if self.group_exists():
            log.info("run %d exited; stopping the processes it left behind", self.run_id)
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + self._leftover_grace
            while self.group_exists() and time.monotonic() < deadline:
                time.sleep(LEFTOVER_POLL_S)
            self.signal(signal.SIGKILL)
        for reader in self._readers:
            reader.join(timeout=self._leftover_grace)
        self._explain_oom()
        if any(reader.is_alive() for reader in self._readers):
            log.warning(
                "run %d: a process outside its group keeps its output open; "
                "later output is not captured",
                self.run_id,
            )
            self._abandon.set()
            for reader in self._readers:
                reader.join()
        self.exit_code = code
        log.info("run %d exited with %d", self.run_id, code)
        self.batcher.close()

    def _explain_oom(self) -> None:
        """A run whose process the kernel killed for memory ends with a line that says
        so, and the limit, rather than with a bare SIGKILL."""
        cgroup = self._sandbox.cgroup if self._sandbox is not None else None
        if cgroup is None or cgroup.oom_kills() <= self._oom_kills_before:
            return
        limit = cgroup.share.memory_text()
        log.info("run %d: out of memory (limit %s)", self.run_id, limit)
        self.batcher.write(
            "stderr",
            f"gpulease: out of memory (limit {limit}): the kernel killed a process of this "
            "run that went past the instance's memory share\n",
        )


def _sandbox_init_pid(info_fd: int) -> int:
    """Read bwrap's info (closed by bwrap once written, or when it fails before) and return
    the sandbox init's host pid; 0 when bwrap exited without creating the sandbox (its
    error is on the run's stderr)."""
    data = b""
    deadline = time.monotonic() + SANDBOX_START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([info_fd], [], [], 0.5)
            if not ready:
                continue
            chunk = os.read(info_fd, READ_BYTES)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(info_fd)
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return int(json.loads(data)["child-pid"])
    return 0


def stop_runs(runs: Iterable[RunProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every run's process group, SIGKILL the groups still there after grace_s.
    Returns when no run's process group is left; their final output may still be read."""
    active = [run for run in runs if not run.finished]
    for run in active:
        log.info("stopping run %d", run.run_id)
        run.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(
        not run.finished and run.group_exists() for run in active
    ):
        time.sleep(0.05)
    for run in active:
        if run.group_exists():
            log.warning("run %d ignored SIGTERM for %.0f s; killing it", run.run_id, grace_s)
            run.signal(signal.SIGKILL)
