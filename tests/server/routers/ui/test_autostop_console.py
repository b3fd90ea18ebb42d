"""The instance page's automatic-stop, schedule and resize forms."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, console_client
from gpulease.server.db import transaction
from gpulease.server.orm import Instance
from gpulease.server.reconcilers import idle
from gpulease.server.runtime import Runtime


def browser_of(http: TestClient, caller: Caller) -> TestClient:
    client = console_client(http.app)
    r = client.post("/login", data={"name": caller.name, "password": "password-123"})
    assert r.status_code == 303, r.text
    return client


def test_autostop_schedule_and_resize_forms(
    http: TestClient,
    ann: Caller,
    bob: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    i = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).json()["id"]
    tick()
    runner_for(i).ready()
    page = browser_of(http, ann)
    try:
        shown = page.get(f"/instances/{i}")
        assert shown.status_code == 200
        assert 'data-testid="autostop"' in shown.text
        assert 'data-testid="resize"' not in shown.text  # running: no resize form

        r = page.post(f"/instances/{i}/autostop", data={"idle_minutes": "30", "idle_util_pct": "7"})
        assert r.status_code == 303 and r.headers["location"] == f"/instances/{i}"
        assert ann.get(f"/api/v1/instances/{i}/autostop").json()["idle_util_pct"] == 7
        r = page.post(f"/instances/{i}/autostop", data={"idle_minutes": "soon"})
        assert r.status_code == 422 and "whole number" in r.text

        with transaction(rt.sessions) as session:
            instance = session.get(Instance, i)
            assert instance is not None and instance.started_at is not None
            t0 = instance.started_at
        idle.tick(rt, now=t0 + timedelta(minutes=26))
        assert 'data-testid="idle-warning"' in page.get(f"/instances/{i}").text

        r = page.post(
            f"/instances/{i}/schedules",
            data={"action": "stop", "cron": "0 19 * * 1-5", "timezone": "Asia/Tokyo"},
        )
        assert r.status_code == 303
        (schedule,) = ann.get(f"/api/v1/instances/{i}/schedules").json()
        assert schedule["timezone"] == "Asia/Tokyo"
        assert "0 19 * * 1-5" in page.get(f"/instances/{i}").text
        r = page.post(f"/instances/{i}/schedules", data={"action": "stop", "cron": "7pm"})
        assert r.status_code == 422 and "0 9 * * 1-5" in r.text

        other = browser_of(http, bob)
        try:
            r = other.post(f"/instances/{i}/schedules/{schedule['id']}/delete")
            assert r.status_code == 404
            assert (
                other.post(f"/instances/{i}/autostop", data={"idle_minutes": "5"}).status_code
                == 404
            )
        finally:
            other.close()
        r = page.post(
            f"/instances/{i}/schedules/{schedule['id']}/delete",
            headers={"Origin": "https://evil.example"},
        )
        assert r.status_code == 403
        assert page.post(f"/instances/{i}/schedules/{schedule['id']}/delete").status_code == 303
        assert ann.get(f"/api/v1/instances/{i}/schedules").json() == []

        r = page.post(f"/instances/{i}/resize", data={"gpus": "T4:1"})
        assert r.status_code == 409 and "stop it first" in r.text
        ann.post(f"/api/v1/instances/{i}/stop")
        runner_for(i).stopped()
        assert 'data-testid="resize"' in page.get(f"/instances/{i}").text
        assert page.post(f"/instances/{i}/resize", data={"gpus": "T4:1"}).status_code == 303
        assert ann.get(f"/api/v1/instances/{i}").json()["gpu_model"] == "T4"
        assert page.post(f"/instances/{i}/start-no-gpu").status_code == 303
        started = ann.get(f"/api/v1/instances/{i}").json()
        assert (started["status"], started["gpu_model"]) == ("queued", "CPU")
    finally:
        page.close()
