"""Fixtures for the CLI tests: the real server app in process, and a CLI wired to it.

The CLI reaches servers only through `gpulease.cli.connection.open_client`; the `cli`
fixture replaces that one function so every command talks to the in-process app.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

# The in-process server harness lives with the SDK tests; share it rather than copy it.
sys.path.insert(0, str(Path(__file__).parents[1] / "client"))
sys.path.insert(0, str(Path(__file__).parent))  # also under --import-mode=importlib

from inprocess import InProcessServer, server, template_home  # noqa: E402,F401  (fixtures)
from wired_cli import Cli  # noqa: E402

from gpulease.cli import connection, instances  # noqa: E402
from gpulease.client import GpuleaseClient  # noqa: E402
from gpulease.server import runner_socket  # noqa: E402


@pytest.fixture
def cli(server: InProcessServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:  # noqa: F811
    config = tmp_path / "config" / "config.json"
    monkeypatch.setenv("GPULEASE_CONFIG", str(config))
    monkeypatch.delenv("GPULEASE_SERVER", raising=False)
    monkeypatch.delenv("GPULEASE_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # Rich tables wide enough to read whole cells
    monkeypatch.setattr(
        connection, "open_client", lambda url, token: GpuleaseClient(url, token, http=server.http)
    )
    monkeypatch.setattr(instances, "POLL_INTERVAL_S", 0.01)
    return Cli(server, config)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """Keep `gpulease server` from serving: record what it would hand uvicorn (through
    server.runner_socket.serve, which also listens on the runners' socket)."""
    calls: list[dict[str, Any]] = []

    def serve(app: Any, settings: Any, **options: Any) -> None:
        calls.append({"host": settings.host, "port": settings.port, **options})

    monkeypatch.setattr(runner_socket, "serve", serve)
    for name in ("ADMIN_PASSWORD", "DATABASE_URL", "HOST", "PORT", "ENVIRONMENT", "PUBLIC_URL"):
        monkeypatch.delenv(f"GPULEASE_{name}", raising=False)
    monkeypatch.setenv("GPULEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPULEASE_SIMULATED_GPUS", "T4:1")
    monkeypatch.setenv("GPULEASE_NODE_NAME", "box")
    monkeypatch.setenv("COLUMNS", "200")
    return calls


@pytest.fixture
def over_tcp(server: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:  # noqa: F811
    """The server's app on 127.0.0.1 (its reconcilers stay the FakeCluster's); the URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(server.http.app, log_level="warning", lifespan="off", ws="none")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("GPULEASE_SERVER", url)
    monkeypatch.setattr(instances, "POLL_INTERVAL_S", 0.01)
    yield url
    uv.should_exit = True
    thread.join(timeout=10)
    sock.close()
