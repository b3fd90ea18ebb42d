"""The runner process against a minimal fake server speaking docs/runner-protocol.md.

The real server is tested against the protocol elsewhere; this fake only records what a
real runner process (started by the local backend) says, and answers like the doc says.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gpulease.backends.base import RunnerSpec
from gpulease.backends.local import LocalBackend
from gpulease.backends.procfs import read_stat
from gpulease.core.templates import Template, get_template
from gpulease.envs.build import ensure_env, env_python

TOKEN = "runner-token"


@dataclass
class FakeServer:
    workdir: bytes | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    action: str = "continue"
    stop_after_exit: bool = False
    released: bool = False  # every call answers 401
    failing_log_posts: int = 0  # answer 503 to this many log posts first
    calls: list[tuple[str, Any]] = field(default_factory=list)
    started: dict[int, int] = field(default_factory=dict)
    chunks: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    exits: dict[int, int] = field(default_factory=dict)
    heartbeats: list[list[int]] = field(default_factory=list)
    url: str = ""
    socket_path: Path | None = None  # the same server on a Unix socket
    token: str = TOKEN  # the launch secret until the runner opens its session
    sessions: list[str] = field(default_factory=list)  # the tokens the runner switched to
    refused: list[str] = field(default_factory=list)  # paths called with a stale token

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    def body(self, path: str) -> Any:
        return next(body for p, body in self.calls if p == path)

    def output(self, run_id: int) -> dict[str, str]:
        streams = {"stdout": "", "stderr": ""}
        for seq in sorted(self.chunks.get(run_id, {})):
            chunk = self.chunks[run_id][seq]
            streams[chunk["stream"]] += chunk["data"]
        return streams

    async def answer(self, path: str, request: Request) -> Response:
        body = await request.json() if request.method == "POST" else None
        if self.released:
            return Response(status_code=401)
        if request.headers.get("authorization") != f"Bearer {self.token}":
            self.refused.append(path)
            return Response(status_code=401)
        if path == "session":  # kept out of calls: the tests below count the protocol's calls
            self.token = body["token"]
            self.sessions.append(self.token)
            return Response(status_code=204)
        self.calls.append((path, body))
        parts = path.split("/")
        if path == "heartbeat":
            self.heartbeats.append(body["running_runs"])
            return JSONResponse({"action": self.action})
        if path == "commands":
            pending = [run for run in self.runs if run["id"] not in self.started]
            if not pending:
                await asyncio.sleep(0.2)
            return JSONResponse({"runs": pending})
        if path == "datasets":  # mounts none (runner/datasets.py has its own tests)
            return JSONResponse({"datasets": []})
        if path == "workdir":
            if self.workdir is None:
                return Response(status_code=204)
            return Response(self.workdir, media_type="application/gzip")
        if parts[0] == "runs":
            run_id = int(parts[1])
            if parts[2] == "started":
                self.started[run_id] = body["pid"]
            elif parts[2] == "logs":
                if self.failing_log_posts > 0:
                    self.failing_log_posts -= 1
                    return Response(status_code=503)
                for chunk in body["chunks"]:
                    self.chunks.setdefault(run_id, {}).setdefault(chunk["seq"], chunk)
            elif parts[2] == "exit":
                self.exits[run_id] = body["exit_code"]
                if self.stop_after_exit:
                    self.action = "stop"
        return Response(status_code=204)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    # AF_UNIX paths are short (108 bytes): a directory of its own right under /tmp.
    socket_dir = Path(tempfile.mkdtemp(prefix="fake-server-", dir="/tmp"))
    app = FastAPI()

    @app.api_route("/runner/v1/{path:path}", methods=["GET", "POST"])
    async def runner_call(path: str, request: Request) -> Response:
        return await fake.answer(path, request)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    fake.socket_path = socket_dir / "server.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(fake.socket_path))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock, unix]}, daemon=True)
    thread.start()
    assert wait_until(lambda: uv.started)
    yield fake
    uv.should_exit = True
    thread.join(timeout=10)
    sock.close()
    unix.close()
    shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("envs")
    ensure_env(get_template("python"), cache)  # built once for every test here
    return cache


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@dataclass
class Started:
    backend: LocalBackend
    handle: str
    spec: RunnerSpec

    def log(self) -> str:
        return (self.spec.run_dir / "runner.log").read_text()

    def wait_exit(self, timeout: float = 20.0) -> None:
        assert wait_until(lambda: not self.backend.alive(self.handle), timeout), self.log()


@pytest.fixture
def start_runner(
    tmp_path: Path, env_cache: Path, server: FakeServer
) -> Iterator[Callable[..., Started]]:
    backend = LocalBackend()
    started: list[Started] = []

    def start(
        template: Template | None = None,
        gpus: tuple[int, ...] = (),
        server_url: str | None = None,
        server_socket: Path | None = None,
    ) -> Started:
        spec = RunnerSpec(
            instance_id=9,
            server_url=server_url or server.url,
            server_socket=server_socket,
            token=TOKEN,
            workspace=tmp_path / "workspace",
            run_dir=tmp_path / "run",
            env_cache=env_cache,
            template=template or get_template("python"),
            gpu_indices=gpus,
            heartbeat_interval_s=0.2,
        )
        runner = Started(backend, backend.start(spec), spec)
        started.append(runner)
        return runner

    yield start
    for runner in started:
        backend.stop(runner.handle, force=True)


def tarball(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


TRAIN = """
import os, sys
open("ran.txt", "a").write("ran\\n")
print("python", sys.prefix)
print("cvd", os.environ["CUDA_VISIBLE_DEVICES"], "epochs", os.environ["EPOCHS"])
for step in range(3):
    print(f"step={step} loss={1 / (step + 1):.2f}")
print("lots", "x" * 200_000)
print("warning on stderr", file=sys.stderr)
sys.exit(3)
"""


def test_a_run_from_start_to_stop(
    server: FakeServer, start_runner: Callable[..., Started], env_cache: Path
) -> None:
    server.workdir = tarball({"train.py": TRAIN})
    server.runs = [{"id": 4, "command": "python train.py", "env": {"EPOCHS": "2"}}]
    server.failing_log_posts = 2  # the server is briefly down: nothing may be lost
    server.stop_after_exit = True

    runner = start_runner(gpus=(0, 1))
    runner.wait_exit()

    paths = server.paths()
    assert paths[0] == "status"
    assert paths.index("workdir") < paths.index("ready") < paths.index("runs/4/started")
    assert paths.index("runs/4/exit") < paths.index("stopped")
    assert paths[-1] == "stopped" or paths[-1] == "heartbeat"
    last_log = max(i for i, p in enumerate(paths) if p == "runs/4/logs")
    assert last_log < paths.index("runs/4/exit")
    ready = server.body("ready")
    venv = env_cache / next(p.name for p in env_cache.iterdir() if p.is_dir())
    assert ready["python"] == str(env_python(venv))

    assert sorted(server.chunks[4]) == list(range(len(server.chunks[4])))  # no gaps
    out = server.output(4)
    # runs use the instance's venv layer (envs/layer.py) over the template venv
    assert f"python {runner.spec.workspace / '.gpulease' / 'venv'}\n" in out["stdout"]
    assert "cvd 0,1 epochs 2\n" in out["stdout"]
    assert "step=2 loss=0.33\n" in out["stdout"]
    assert "x" * 200_000 in out["stdout"]
    assert out["stderr"] == "warning on stderr\n"
    assert server.exits == {4: 3}
    assert (runner.spec.workspace / "ran.txt").read_text() == "ran\n"  # started once
    assert [4] in server.heartbeats
    assert "Traceback" not in runner.log()


def test_sigterm_stops_the_runs_and_reports(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    # `wait`, not a foreground sleep: bash runs its TERM trap at once, whether or not the
    # sleep had exec'd when the signal came (one that meets a child between fork and exec
    # goes to bash's handler there, and a foreground sleep would then run its 60 s).
    server.runs = [{"id": 1, "command": "sleep 60 & echo begin; wait", "env": {}}]
    runner = start_runner()
    assert wait_until(lambda: "begin\n" in server.output(1)["stdout"]), runner.log()

    runner.backend.stop(runner.handle)
    runner.wait_exit()

    assert server.exits == {1: -15}
    assert server.paths().count("stopped") == 1
    run_pid = server.started[1]
    stat = read_stat(run_pid)
    assert stat is None or not stat.running


def test_heartbeat_stop_before_any_run(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    server.action = "stop"
    runner = start_runner()
    runner.wait_exit()

    assert "ready" in server.paths()
    assert server.paths().count("stopped") == 1


def test_a_released_instance_kills_its_runs_and_exits(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    server.runs = [{"id": 2, "command": "echo begin; sleep 60", "env": {}}]
    runner = start_runner()
    assert wait_until(lambda: "begin\n" in server.output(2)["stdout"]), runner.log()

    server.released = True
    runner.wait_exit()

    assert 2 not in server.exits
    stat = read_stat(server.started[2])
    assert stat is None or not stat.running


def test_an_environment_that_does_not_build_fails_the_instance(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    broken = Template(
        name="broken", description="", python="3.11", packages=("no-such-package-zzz",), cuda=None
    )
    runner = start_runner(template=broken)
    runner.wait_exit(timeout=60)

    assert "ready" not in server.paths()
    reason = server.body("failed")["reason"]
    assert "No matching distribution found for no-such-package-zzz" in reason
    assert any("pip install" in (body or {}).get("message", "") for _, body in server.calls)


def test_an_unsafe_workdir_fails_the_instance(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    server.workdir = tarball({"../escape.py": "print('gotcha')"})
    runner = start_runner()
    runner.wait_exit()

    assert "ready" not in server.paths()
    assert "'..'" in server.body("failed")["reason"]
    assert not (runner.spec.workspace.parent / "escape.py").exists()


class Trap:
    """A listener on a TCP port, as a job could put on the server's port while it restarts:
    it records every connection and reads what it is sent."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.received: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.received.append(conn.recv(65536))
            except OSError:
                self.received.append(b"")
            conn.close()

    def close(self) -> None:
        self._sock.close()


def test_a_runner_with_the_servers_socket_never_calls_its_tcp_port(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    """server_url names a listener that is not the server: the runner, given the server's
    Unix socket, sends it nothing (no token, no poll) and serves the instance through the
    socket."""
    trap = Trap()
    try:
        server.runs = [{"id": 1, "command": "echo over-the-socket", "env": {}}]
        server.stop_after_exit = True
        runner = start_runner(server_url=trap.url, server_socket=server.socket_path)
        runner.wait_exit()
    finally:
        trap.close()

    assert trap.received == []
    assert server.output(1)["stdout"] == "over-the-socket\n"
    assert server.exits == {1: 0}


def test_the_runner_replaces_its_launch_secret_with_a_session_token(
    server: FakeServer, start_runner: Callable[..., Started]
) -> None:
    server.runs = [{"id": 3, "command": "echo hi", "env": {}}]
    server.stop_after_exit = True
    runner = start_runner(server_socket=server.socket_path)
    runner.wait_exit()

    (session,) = server.sessions  # opened once, before anything else
    assert session != TOKEN and session.startswith("glr_") and len(session) >= 47
    assert server.refused == []  # every call after it carried the new token
    assert server.exits == {3: 0}
    # The session token exists only in the runner's memory: not in its spec, not in its log.
    assert session not in (runner.spec.run_dir / "spec.json").read_text()
    assert session not in runner.log()
