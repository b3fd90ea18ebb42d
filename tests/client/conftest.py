"""Fixtures for the SDK tests: the real server app in process (see inprocess.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # also under --import-mode=importlib

from inprocess import InProcessServer, prepare_home, server_from_template  # noqa: E402


@pytest.fixture(scope="session")
def template_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    home = tmp_path_factory.mktemp("template") / "home"
    return home, prepare_home(home)


@pytest.fixture
def server(template_home: tuple[Path, dict[str, str]], tmp_path: Path) -> Iterator[InProcessServer]:
    with server_from_template(template_home, tmp_path / "home") as running:
        yield running
