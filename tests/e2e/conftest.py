"""Whole-system fixtures: a real server process per test, on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processes import Platform, running_platform
from ray_support import running_ray_platform


@pytest.fixture
def backend() -> str:
    """The backend `platform` runs on: local, unless the test is marked ON_BOTH_BACKENDS."""
    return "local"


@pytest.fixture
def platform(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, backend: str
) -> Iterator[Platform]:
    if backend == "ray":  # the session's shared cluster: gpu-a and gpu-b, 2 A100-80GB each
        with running_ray_platform(
            request.getfixturevalue("ray_cluster"), tmp_path, database_url
        ) as p:
            yield p
        return
    with running_platform(tmp_path, database_url, "A100-80GB:2,T4:1") as p:
        yield p
