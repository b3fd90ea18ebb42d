"""`gpulease instance stop` reaches a real runner through its long poll, not its heartbeat."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from processes import Platform, running_platform
from stop_support import stop_latency

HEARTBEAT_S = 30  # far longer than the bound below: only the long poll can deliver the stop


@pytest.fixture
def slow_heartbeat(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    extra = {
        "GPULEASE_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
        "GPULEASE_HEARTBEAT_TIMEOUT_S": "120",
    }
    with running_platform(tmp_path, database_url, "T4:1", extra) as platform:
        yield platform


def test_a_stop_reaches_the_runner_at_once(slow_heartbeat: Platform) -> None:
    platform = slow_heartbeat
    platform.cli(
        "register", "--server", platform.url, "--name", "ann", "--password", "password-123"
    )
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "box", "--wait"
    )
    took, line = stop_latency(platform, "box")
    assert "the server asked to stop" in line
    assert took < 5  # measured figures: benchmarks/stop_latency.py
    platform.wait_status("box", "stopped", timeout=60)
