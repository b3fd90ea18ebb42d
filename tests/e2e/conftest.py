"""Whole-system fixtures: a real server process per test, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processes import Platform, running_platform


@pytest.fixture
def platform(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    with running_platform(tmp_path, database_url, "A100-80GB:2,T4:1") as p:
        yield p
