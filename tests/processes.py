"""Real processes for whole-system tests and benchmarks: a `gpulease server`, the CLI, runners.

The template environments are cached under .cache/envs in the repository (ignored by git)
so that the PyTorch venv is built once per checkout, not once per test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
ENV_CACHE = REPO / ".cache" / "envs"
BIN = Path(sys.executable).parent
ADMIN_PASSWORD = "admin-password-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Platform:
    """One server (restartable) on one data directory, and a CLI logged in to it."""

    home: Path
    database_url: str
    port: int
    simulated: str
    log_path: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    tls: bool = False  # HTTPS with the server's self-signed certificate

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEASE_")}
        env.update(
            GPULEASE_HOME=str(self.home),
            GPULEASE_DATABASE_URL=self.database_url,
            GPULEASE_PORT=str(self.port),
            GPULEASE_SIMULATED_GPUS=self.simulated,
            GPULEASE_ADMIN_PASSWORD=ADMIN_PASSWORD,
            GPULEASE_ENV_CACHE=str(ENV_CACHE),
            GPULEASE_CONFIG=str(self.config),
            GPULEASE_TICK_INTERVAL_S="0.5",
            GPULEASE_HEARTBEAT_INTERVAL_S="1",
            PYTHONUNBUFFERED="1",
        )
        if self.tls:
            env["GPULEASE_TLS_SELF_SIGNED"] = "true"
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [str(BIN / "gpulease"), "server", "--port", str(self.port)],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                # The test's own probe; the CLI and runners verify the certificate.
                healthz = httpx.get(f"{self.url}/healthz", timeout=1, verify=not self.tls)
                if healthz.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.proc.kill()  # never leave a half-started server behind
        self.proc.wait(10)
        raise RuntimeError(f"server did not come up: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, as in a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cli(
        self, *args: str, check: bool = True, timeout: float = 600, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(BIN / "gpulease"), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"gpulease {' '.join(args)} exited {result.returncode}\n"
                f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
            )
        return result

    def cli_json(self, *args: str) -> object:
        return json.loads(self.cli(*args, "-o", "json").stdout)

    def wait_status(self, ref: str, status: str, timeout: float = 120) -> dict[str, Any]:
        """Poll `gpulease instance show` until the instance has status."""
        deadline = time.monotonic() + timeout
        got: Any = {}
        while time.monotonic() < deadline:
            got = self.cli_json("instance", "show", ref)
            if got["status"] == status:
                return dict(got)
            time.sleep(0.3)
        raise AssertionError(f"instance {ref} is {got.get('status')}, not {status}: {got}")

    def popen_cli(self, *args: str, stderr_path: Path) -> subprocess.Popen[str]:
        """The CLI in the background, stdout piped. Read it with .stdout.readline() and
        .stdout.read() only: communicate() would skip what readline() already buffered."""
        with stderr_path.open("w") as err:
            return subprocess.Popen(
                [str(BIN / "gpulease"), *args],
                env=self.env(),
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def kill_runners(self, sig: str = "TERM") -> None:
        """Signal every runner of this platform. TERM (cleanup) takes the runner's own stop
        path, which ends its jobs; KILL plays a runner crash."""
        subprocess.run(["pkill", f"-{sig}", "-f", f"{self.home}/runners/"], check=False)

    def end_runners(self, grace: float = 5.0) -> None:
        """After a test: ask every runner to stop, and kill those still there after grace
        (with no server to report to, a stopping runner would wait for one)."""
        self.kill_runners("TERM")
        deadline = time.monotonic() + grace
        pattern = f"{self.home}/runners/"
        while time.monotonic() < deadline:
            alive = subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0
            if not alive:
                return
            time.sleep(0.2)
        self.kill_runners("KILL")


@contextmanager
def running_platform(
    tmp_path: Path, database_url: str, simulated: str, extra_env: Mapping[str, str] | None = None
) -> Iterator[Platform]:
    """A started Platform whose files are in tmp_path; on the way out it stops and its
    runners end."""
    ENV_CACHE.mkdir(parents=True, exist_ok=True)
    p = Platform(
        home=tmp_path / "home",
        database_url=database_url,
        port=free_port(),
        simulated=simulated,
        log_path=tmp_path / "server.log",
        config=tmp_path / "cli-config.json",
        extra_env=dict(extra_env or {}),
    )
    p.start()
    try:
        yield p
    finally:
        # Runners first, while the server can still take their /stopped: they then exit at
        # once instead of waiting out end_runners' grace for a server that is gone.
        p.end_runners()
        p.stop()
