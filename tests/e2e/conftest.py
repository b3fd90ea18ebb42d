"""Whole-system fixtures: a real server process per test, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processes import ENV_CACHE, Platform, free_port


@pytest.fixture
def platform(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    ENV_CACHE.mkdir(parents=True, exist_ok=True)
    p = Platform(
        home=tmp_path / "home",
        database_url=database_url,
        port=free_port(),
        simulated="A100-80GB:2,T4:1",
        log_path=tmp_path / "server.log",
        config=tmp_path / "cli-config.json",
    )
    p.start()
    try:
        yield p
    finally:
        p.stop()
        p.end_runners()
