"""JupyterLab on demand inside an instance: a cached tools venv, a unix socket, no port.

JupyterLab runs from a tools environment built once per node in the environment cache
(envs/build.py), inside the instance's sandbox like its runs. It listens only on a unix
socket in `run_dir/jupyter` (bound into the sandbox at JUPYTER_ROOT); only the runner
connects to it, bridging server streams (runner/streams.py), so it needs no token. Browsers
reach it on an origin of its own (server/routers/ui/jupyter_proxy.py), never the console's. Its
notebooks' kernel is the instance's own venv python, with the tools environment's
site-packages appended to sys.path so that ipykernel imports (both are Python 3.11).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from gpulease.core.templates import Template
from gpulease.envs.build import EnvBuildError, ensure_env, env_python
from gpulease.runner import safefs
from gpulease.runner.sandbox import JUPYTER_ROOT, WORKSPACE, Sandbox, SandboxError
from gpulease.runner.sandbox import popen as sandbox_popen
from gpulease.runner.streams import connect_unix

log = logging.getLogger(__name__)

# Built once per node in the environment cache (envs/build.py) and shared by every instance.
# Its Python must be the instances' (3.11) so the kernel, run by the instance's own venv,
# can import ipykernel from this environment's site-packages.
TOOLS_TEMPLATE = Template(
    name="gpulease-jupyterlab",
    description="JupyterLab for the browser console (tools, not a user template)",
    python="3.11",
    packages=("jupyterlab==4.*",),
    cuda=None,
)
START_TIMEOUT_S = 120.0
SOCKET_NAME = "lab.sock"
LOG_NAME = "jupyterlab.log"
LOG_TAIL_BYTES = 16 * 1024
STOP_GRACE_S = 5.0
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes
_KERNEL_CODE = (
    "import sys; sys.path.append({site!r}); "
    "from ipykernel import kernelapp; kernelapp.launch_new_instance()"
)


def site_packages(env_dir: Path) -> Path:
    """The venv's site-packages (lib/pythonX.Y/site-packages)."""
    found = sorted((env_dir / "lib").glob("python3*/site-packages"))
    if not found:
        raise RuntimeError(f"the JupyterLab environment {env_dir} has no site-packages")
    return found[0]


def kernelspec(instance_python: str, tools_site: str) -> dict[str, object]:
    """The notebook kernel: the instance venv's python, ipykernel from the tools env."""
    return {
        "argv": [
            instance_python,
            "-c",
            _KERNEL_CODE.format(site=tools_site),
            "-f",
            "{connection_file}",
        ],
        "display_name": "Python 3 (instance)",
        "language": "python",
        "metadata": {"debugger": False},
    }


class JupyterLab:
    """One JupyterLab per instance, started at the first stream that needs it."""

    def __init__(
        self,
        *,
        run_dir: Path,
        env_cache: Path,
        base_url: str,
        shell: Callable[[], tuple[Mapping[str, str], str, Sandbox | None, Path]],
        stopping: threading.Event,
    ) -> None:
        """shell() -> (environment, working directory, sandbox or None, instance venv)."""
        self._dir = run_dir / "jupyter"
        self._env_cache = env_cache
        self._base_url = base_url
        self._shell = shell
        self._stopping = stopping
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self._dir / SOCKET_NAME

    def ensure(self) -> str:
        """Start JupyterLab unless it runs; the host path of its socket once it answers.
        RuntimeError with a reason for people when it cannot start."""
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the instance is stopping")
            if self._process is None or self._process.poll() is not None:
                self._start()
            self._wait_ready()
            return str(self.socket_path)

    def stop(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def _start(self) -> None:
        try:
            tools = ensure_env(TOOLS_TEMPLATE, self._env_cache)
        except EnvBuildError as exc:
            raise RuntimeError(f"JupyterLab could not be installed: {exc.message}") from exc
        env, cwd, sandbox, instance_env = self._shell()
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if sandbox is None and len(str(self.socket_path).encode()) >= _MAX_SOCKET_PATH:
            # Without a sandbox JupyterLab binds the host path itself: keep it short.
            self._dir = Path(tempfile.mkdtemp(prefix="gpulease-jupyter-"))
        self.socket_path.unlink(missing_ok=True)
        inside = JUPYTER_ROOT if sandbox is not None else str(self._dir)
        spec = kernelspec(str(env_python(instance_env)), str(site_packages(tools)))
        # the directory is the job's to write too: no link of its may be followed
        kernel = json.dumps(spec, indent=1).encode()
        try:
            safefs.write_replace(self._dir, "share/kernels/python3/kernel.json", kernel)
        except OSError as exc:
            raise RuntimeError(f"JupyterLab's files cannot be written: {exc}") from exc
        argv = [
            str(env_python(tools)),
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--ServerApp.sock={inside}/{SOCKET_NAME}",
            "--ServerApp.sock_mode=0o600",
            f"--ServerApp.base_url={self._base_url}",
            f"--ServerApp.root_dir={WORKSPACE if sandbox is not None else cwd}",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            "--ServerApp.terminals_enabled=True",
            # the sandbox is the boundary here; inside, a runner running as root stays root
            "--ServerApp.allow_root=True",
            # The browser reaches it at <instance>.GPULEASE_JUPYTER_DOMAIN, through the
            # server's proxy, which already let only the owner through: any Host is fine.
            "--ServerApp.allow_remote_access=True",
            "--LabApp.news_url=None",  # no news feed fetched from the internet
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        full_env = {
            **env,
            "JUPYTER_PATH": f"{inside}/share",
            "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime"
            if sandbox is not None
            else f"{self._dir}/runtime",
            "JUPYTER_PLATFORM_DIRS": "1",
        }
        if sandbox is not None:
            sandbox = replace(sandbox, tools_env=tools, jupyter_dir=self._dir)
            try:
                argv = sandbox.command(argv)
            except SandboxError as exc:
                raise RuntimeError(exc.message) from exc
        try:
            log_fd = safefs.open_append(self._dir, LOG_NAME)
        except OSError as exc:
            raise RuntimeError(f"JupyterLab's log cannot be written: {exc}") from exc
        with os.fdopen(log_fd, "ab") as out:
            self._process = sandbox_popen(
                argv,
                cwd=cwd,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        log.info("JupyterLab started (pid %d)", self._process.pid)

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"JupyterLab exited with code {self._process.returncode}: " + self._log_tail()
                )
            if self._answers():
                return
            time.sleep(0.1)
        raise RuntimeError("JupyterLab did not start in time: " + self._log_tail())

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                connect_unix(sock, str(self.socket_path))
            except OSError:
                return False
        return True

    def _log_tail(self, lines: int = 15) -> str:
        """The log's last lines, read as the job's file it is (JupyterLab runs as the job and
        the directory is writable to it): never through a link, never a FIFO, at most
        LOG_TAIL_BYTES of it."""
        try:
            data = safefs.read_tail(self._dir, LOG_NAME, limit=LOG_TAIL_BYTES, single_link=True)
        except OSError:
            return "(no log)"
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])
