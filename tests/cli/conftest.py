"""Fixtures for the CLI tests: the real server app in process, and a CLI wired to it.

The CLI reaches servers only through `gpulease.cli.connection.open_client`; the `cli`
fixture replaces that one function so every command talks to the in-process app.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The in-process server harness lives with the SDK tests; share it rather than copy it.
sys.path.insert(0, str(Path(__file__).parents[1] / "client"))
sys.path.insert(0, str(Path(__file__).parent))  # also under --import-mode=importlib

from inprocess import InProcessServer, prepare_home, server_from_template  # noqa: E402
from wired_cli import Cli  # noqa: E402

from gpulease.cli import connection, instances  # noqa: E402
from gpulease.client import GpuleaseClient  # noqa: E402


@pytest.fixture(scope="session")
def template_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    home = tmp_path_factory.mktemp("template") / "home"
    return home, prepare_home(home)


@pytest.fixture
def server(template_home: tuple[Path, dict[str, str]], tmp_path: Path) -> Iterator[InProcessServer]:
    with server_from_template(template_home, tmp_path / "home") as running:
        yield running


@pytest.fixture
def cli(server: InProcessServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
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
