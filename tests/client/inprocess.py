"""The real server app in process for the SDK and CLI tests, and a fake cluster to drive it.

`InProcessServer` builds the ASGI app exactly as the server does (SQLite under a temporary
home, simulated GPUs) with a FakeBackend at the backend boundary, and hands out
GpuleaseClients over a Starlette TestClient. `FakeCluster` plays what lies behind that
boundary: it ticks the reconcilers and answers the runner protocol over HTTP for every fake
runner, with scripted job output. Shared by tests/client and tests/cli.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulease.backends.fake import FakeBackend
from gpulease.client import GpuleaseClient
from gpulease.schemas.accounts import LoginRequest, RegisterRequest
from gpulease.server.app import create_app
from gpulease.server.reconcilers.loop import run_once
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.settings import Settings

with warnings.catch_warnings():
    # Starlette 1.x prefers httpx2 for its TestClient; the SDK is built on httpx, so the
    # TestClient must stay an httpx.Client: silence that one notice at import.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

SERVER_URL = "http://testserver"
ADMIN_NAME = "admin"
ADMIN_PASSWORD = "admin-password-1"
SIMULATED_GPUS = "A100-80GB:2,T4:1"

# What a fake job prints and exits with: [(stream, data), ...], exit code.
JobScript = Callable[[dict[str, Any]], tuple[list[tuple[str, str]], int]]


def echo_job(run: dict[str, Any]) -> tuple[list[tuple[str, str]], int]:
    return [("stdout", f"running: {run['command']}\n")], 0


def tar_members(data: bytes) -> dict[str, bytes | None]:
    """name -> content (None for directories) of a gzip'd tar."""
    out: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            out[member.name] = extracted.read() if extracted else None
    return out


@dataclass
class _RunnerState:
    ready: bool = False
    started: set[int] = field(default_factory=set)


class FakeCluster:
    """Reconciler ticks plus a scripted runner for each FakeBackend runner, over HTTP.

    `job` decides what each run prints and its exit code; `hold` keeps runners from becoming
    ready (instances stay `starting`). The runner reads its workdir when it starts its first
    run, later than the real runner (before `ready`), so tests do not race the upload.
    """

    def __init__(self, rt: Runtime, backend: FakeBackend, http: TestClient) -> None:
        self.rt = rt
        self.backend = backend
        self.http = http
        self.job: JobScript = echo_job
        self.hold = False
        self.workdirs: dict[int, bytes | None] = {}  # instance id -> what GET /workdir gave
        self.runs: list[dict[str, Any]] = []  # every run the runners were given
        self._states: dict[str, _RunnerState] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def step(self) -> None:
        run_once(self.rt)
        for handle, runner in list(self.backend.runners.items()):
            if runner.alive:
                self._serve(handle, runner.spec.instance_id, runner.spec.token)

    def _call(self, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        answer: httpx.Response = self.http.request(
            method, f"/runner/v1{path}", headers=headers, **kwargs
        )
        return answer

    def _serve(self, handle: str, instance_id: int, token: str) -> None:
        state = self._states.setdefault(handle, _RunnerState())
        action = self._call("POST", "/heartbeat", token, json={"running_runs": []})
        if answer_is_gone(action) or action.json()["action"] == "stop":
            self._call("POST", "/stopped", token, json={})
            self.backend.set_alive(handle, False)
            return
        if not state.ready:
            if self.hold:
                return  # still "building its environment"
            answer = self._call("POST", "/ready", token, json={})
            if answer.status_code != 204:
                self.backend.set_alive(handle, False)
                return
            state.ready = True
        pending = self._call("GET", "/commands", token, params={"wait": 0}).json()["runs"]
        for run in pending:
            if run["id"] in state.started:
                continue
            state.started.add(run["id"])
            if instance_id not in self.workdirs:
                workdir = self._call("GET", "/workdir", token)
                self.workdirs[instance_id] = workdir.content if workdir.status_code == 200 else None
            self.runs.append(run)
            self._call("POST", f"/runs/{run['id']}/started", token, json={"pid": 4242})
            output, exit_code = self.job(run)
            now = time.time()
            chunks = [
                {"seq": seq, "stream": stream, "data": data, "time": now}
                for seq, (stream, data) in enumerate(output)
            ]
            if chunks:
                self._call("POST", f"/runs/{run['id']}/logs", token, json={"chunks": chunks})
            self._call("POST", f"/runs/{run['id']}/exit", token, json={"exit_code": exit_code})

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(0.01)
        except BaseException as exc:  # surfaced by stop(), so a broken server fails the test
            self._error = exc

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fake-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._error is not None:
            raise self._error

    def wait_for(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self._error is not None:
                raise self._error
            if time.monotonic() > deadline:
                raise TimeoutError("the fake cluster did not get there in time")
            time.sleep(0.01)


def answer_is_gone(answer: httpx.Response) -> bool:
    """401: the instance no longer holds this runner (released); the runner exits."""
    return answer.status_code == 401


PREPARED_USERS = ("ann", "bob")


def password_of(name: str) -> str:
    return f"{name}-password-1"


@dataclass
class InProcessServer:
    rt: Runtime
    backend: FakeBackend
    http: TestClient
    cluster: FakeCluster
    tokens: dict[str, str] = field(default_factory=dict)  # prepared users' API tokens

    def client(self, token: str | None = None) -> GpuleaseClient:
        return GpuleaseClient(SERVER_URL, token, http=self.http)

    def user(self, name: str = "ann") -> GpuleaseClient:
        """A client logged in as `name` (password `password_of(name)`): one of the prepared
        users, or a newly registered one."""
        if name in self.tokens:
            return self.client(self.tokens[name])
        client = self.client()
        client.auth.register(RegisterRequest(name=name, password=password_of(name)))
        return client

    def admin(self) -> GpuleaseClient:
        return self.client(self.tokens[ADMIN_NAME])


@contextmanager
def in_process_server(
    home: Path, tokens: dict[str, str] | None = None
) -> Iterator[InProcessServer]:
    """The server on the data directory `home` (made if missing; an existing one is reused,
    as a restarted server would)."""
    settings = Settings(
        home=home,
        simulated_gpus=SIMULATED_GPUS,
        database_url=None,
        admin_password=ADMIN_PASSWORD,
        node_name="test-node",
    )
    backend = FakeBackend()
    rt = build_runtime(settings, backend)
    app = create_app(settings, runtime=rt, reconcilers=False)
    try:
        with TestClient(app) as http:
            cluster = FakeCluster(rt, backend, http)
            try:
                yield InProcessServer(rt, backend, http, cluster, dict(tokens or {}))
            finally:
                cluster.stop()
    finally:
        rt.engine.dispose()


def prepare_home(home: Path) -> dict[str, str]:
    """A migrated data directory with the admin and PREPARED_USERS, and their API tokens.
    Copying it is much faster than migrating and hashing passwords in every test."""
    with in_process_server(home) as server:
        tokens = {
            ADMIN_NAME: server.client()
            .auth.login(LoginRequest(name=ADMIN_NAME, password=ADMIN_PASSWORD))
            .token
        }
        for name in PREPARED_USERS:
            tokens[name] = (
                server.client()
                .auth.register(RegisterRequest(name=name, password=password_of(name)))
                .token
            )
    return tokens


@contextmanager
def server_from_template(
    template: tuple[Path, dict[str, str]], home: Path
) -> Iterator[InProcessServer]:
    shutil.copytree(template[0], home)
    with in_process_server(home, template[1]) as server:
        yield server


# The fixtures the SDK and CLI tests share (their conftests import them).
@pytest.fixture(scope="session")
def template_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    home = tmp_path_factory.mktemp("template") / "home"
    return home, prepare_home(home)


@pytest.fixture
def server(template_home: tuple[Path, dict[str, str]], tmp_path: Path) -> Iterator[InProcessServer]:
    with server_from_template(template_home, tmp_path / "home") as running:
        yield running
