"""Routes read the time through one dependency, so a test pins it instead of the real clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from starlette.testclient import TestClient

from factories import Caller
from gpulease.server.routers.api.clock import request_time

# A Monday, noon in New York (EST, UTC-5), late in November.
MONDAY_NOON_NY = datetime(2026, 11, 30, 17, tzinfo=UTC)


@pytest.fixture
def pinned(http: TestClient) -> Iterator[datetime]:
    http.app.dependency_overrides[request_time] = lambda: MONDAY_NOON_NY  # type: ignore[attr-defined]
    yield MONDAY_NOON_NY
    http.app.dependency_overrides.pop(request_time)  # type: ignore[attr-defined]


def test_a_new_schedule_first_fires_after_the_pinned_time(ann: Caller, pinned: datetime) -> None:
    r = ann.put("/api/v1/me/timezone", json={"timezone": "America/New_York"})
    assert r.status_code == 200, r.text
    r = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    assert r.status_code == 201, r.text
    ref = r.json()["id"]
    fires = {}
    for action, cron in (("stop", "0 19 * * 1-5"), ("start", "0 9 * * 1-5")):
        r = ann.post(f"/api/v1/instances/{ref}/schedules", json={"action": action, "cron": cron})
        assert r.status_code == 201, r.text
        fires[action] = datetime.fromisoformat(r.json()["next_fire_at"])
    # 19:00 that Monday and 09:00 the Tuesday, New York time, whatever the real clock says
    assert fires["stop"] == datetime(2026, 12, 1, 0, tzinfo=UTC)
    assert fires["start"] == datetime(2026, 12, 1, 14, tzinfo=UTC)


def test_the_default_statement_period_is_the_pinned_month(ann: Caller, pinned: datetime) -> None:
    r = ann.get("/api/v1/statement", params={"tz": "UTC"})
    assert r.status_code == 200, r.text
    assert (r.json()["start"], r.json()["end"]) == ("2026-11-01", "2026-11-30")
