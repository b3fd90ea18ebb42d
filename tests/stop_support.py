"""Stop latency on a real platform: from the stop request to the runner acting on it."""

from __future__ import annotations

import time
from datetime import datetime

from gpulease.client import GpuleaseClient
from gpulease.client.config import load_saved
from processes import Platform

STOPPING = "gpulease.runner.agent: stopping: "


def client_of(platform: Platform) -> GpuleaseClient:
    login = load_saved(platform.config)
    assert login.server is not None
    return GpuleaseClient(login.server, login.token)


def stop_latency(platform: Platform, name: str, timeout: float = 60) -> tuple[float, str]:
    """Stop instance name through the SDK; seconds from just before the request to the time
    its runner logged that it is stopping, and that log line."""
    with client_of(platform) as client:
        instance_id = client.instances.get(name).id
        log = platform.home / "runners" / str(instance_id) / "runner.log"
        seen = log.read_text().count(STOPPING)
        asked = time.time()
        client.instances.stop(name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if STOPPING in line]
        if len(lines) > seen:
            line = lines[seen]
            # asctime: "2026-12-01 12:40:01,123", local time, as this process reads it
            logged = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            return logged - asked, line
        time.sleep(0.01)
    raise AssertionError(f"the runner never logged that it is stopping: {log.read_text()[-2000:]}")
