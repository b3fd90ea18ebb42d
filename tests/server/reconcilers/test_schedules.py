"""Scheduled start and stop: cron in the user's zone, DST, bad input, and a server restart."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from starlette.testclient import TestClient

from factories import Caller, RunnerDouble, make_user
from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.db import transaction
from gpulease.server.orm import Instance, InstanceSchedule
from gpulease.server.reconcilers import launcher, scheduler
from gpulease.server.reconcilers import schedules as schedule_fires
from gpulease.server.runtime import Runtime, build_runtime
from gpulease.server.services.instances import schedules
from gpulease.server.services.instances.schedules import next_fire
from gpulease.server.settings import Settings

Tick = Callable[[], None]
RunnerFor = Callable[[int], RunnerDouble]


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def test_weekday_mornings_follow_the_zone_across_the_spring_dst_change() -> None:
    # Berlin: CET (UTC+1) until Sunday 2026-03-29 02:00, then CEST (UTC+2)
    fires = []
    moment = utc(2026, 3, 26, 12)
    for _ in range(3):
        moment = next_fire("0 9 * * 1-5", "Europe/Berlin", moment)
        fires.append(moment)
    assert fires == [utc(2026, 3, 27, 8), utc(2026, 3, 30, 7), utc(2026, 3, 31, 7)]


def test_a_skipped_time_fires_after_the_jump_and_a_repeated_one_fires_once() -> None:
    # 02:30 does not exist in Berlin on 2026-03-29: it fires at 03:30 CEST (01:30 UTC)
    assert next_fire("30 2 * * *", "Europe/Berlin", utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1, 30)
    # 02:30 happens twice on 2026-10-25: the first (CEST, 00:30 UTC), then the next day's
    first = next_fire("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24, 12))
    assert first == utc(2026, 10, 25, 0, 30)
    assert next_fire("30 2 * * *", "Europe/Berlin", first) == utc(2026, 10, 26, 1, 30)


def test_fall_back_in_new_york() -> None:
    # 19:00 in New York is 23:00 UTC in EDT and 00:00 UTC the next day in EST (2026-11-01)
    assert next_fire("0 19 * * *", "America/New_York", utc(2026, 10, 31, 12)) == utc(
        2026, 10, 31, 23
    )
    assert next_fire("0 19 * * *", "America/New_York", utc(2026, 11, 1, 12)) == utc(2026, 11, 2)


def create(caller: Caller, gpu: str = "A100-80GB:1") -> int:
    r = caller.post("/api/v1/instances", json={"gpu": gpu})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def add(caller: Caller, ref: object, action: str, cron: str, **kw: object) -> dict[str, object]:
    r = caller.post(
        f"/api/v1/instances/{ref}/schedules", json={"action": action, "cron": cron, **kw}
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def status(rt: Runtime, instance_id: int) -> str:
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        return instance.status


def parse(text: object) -> datetime:
    return datetime.fromisoformat(str(text))


def add_at(rt: Runtime, instance_id: int, action: str, cron: str, now: datetime) -> int:
    """Add a schedule as the API does, on a fixed clock: its first fire is next_fire(now)."""
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        schedule = schedules.add_schedule(
            session, instance.owner, instance, action=action, cron=cron, timezone=None, now=now
        )
        return schedule.id


def fires_at(rt: Runtime, schedule_id: int) -> datetime:
    with transaction(rt.sessions) as session:
        schedule = session.get(InstanceSchedule, schedule_id)
        assert schedule is not None
        return schedule.next_fire_at


def test_schedules_fire_at_local_times_in_the_users_zone(
    ann: Caller, rt: Runtime, tick: Tick, runner_for: RunnerFor
) -> None:
    r = ann.put("/api/v1/me/timezone", json={"timezone": "America/New_York"})
    assert r.status_code == 200 and r.json()["timezone"] == "America/New_York"
    i = create(ann)
    tick()
    runner_for(i).ready()
    # a Monday, noon in New York (EST, UTC-5): the stop comes tonight, the start tomorrow
    monday_noon = utc(2026, 11, 30, 17)
    stop = add_at(rt, i, "stop", "0 19 * * 1-5", monday_noon)
    start = add_at(rt, i, "start", "0 9 * * 1-5", monday_noon)
    listed = {s["id"]: s for s in ann.get(f"/api/v1/instances/{i}/schedules").json()}
    assert listed[stop]["timezone"] == "America/New_York"
    stop_at, start_at = parse(listed[stop]["next_fire_at"]), parse(listed[start]["next_fire_at"])
    # 19:00 and 09:00 in New York
    assert stop_at == utc(2026, 12, 1, 0) and start_at == utc(2026, 12, 1, 14)
    assert stop_at.astimezone(_ny()).hour == 19 and start_at.astimezone(_ny()).hour == 9

    assert schedule_fires.tick(rt, now=stop_at - timedelta(seconds=1)) == 0
    assert status(rt, i) == "running"
    assert schedule_fires.tick(rt, now=stop_at) == 1
    assert status(rt, i) == "stopping"
    runner_for(i).stopped()
    assert schedule_fires.tick(rt, now=stop_at) == 0  # applied once
    listed = {s["id"]: s for s in ann.get(f"/api/v1/instances/{i}/schedules").json()}
    again = listed[stop]
    assert parse(again["last_fired_at"]) == stop_at and parse(again["next_fire_at"]) > stop_at

    assert schedule_fires.tick(rt, now=start_at) == 1
    assert status(rt, i) == "queued"
    # the scheduler places it (its step alone: the whole loop would also fire the schedules
    # against the real clock, for which these fixed times are long past)
    scheduler.tick(rt)
    assert status(rt, i) == "starting"


def test_a_stop_schedule_fires_across_the_dst_change_at_the_same_local_time(
    ann: Caller, rt: Runtime
) -> None:
    """Driven through the reconciler with explicit times around Berlin's 2026-03-29 change."""
    i = create(ann)
    with transaction(rt.sessions) as session:
        instance = session.get(Instance, i)
        assert instance is not None
        owner = instance.owner
        owner.timezone = "Europe/Berlin"
        schedule = schedules.add_schedule(
            session,
            owner,
            instance,
            action="stop",
            cron="0 19 * * *",
            timezone=None,
            now=utc(2026, 3, 27, 12),
        )
        schedule_id = schedule.id
    fired = []
    for now in (
        utc(2026, 3, 27, 17, 59),
        utc(2026, 3, 27, 18),
        utc(2026, 3, 28, 17, 59),
        utc(2026, 3, 28, 18),
        utc(2026, 3, 29, 16, 59),
        utc(2026, 3, 29, 17),
    ):
        if schedule_fires.tick(rt, now=now):
            with transaction(rt.sessions) as session:
                row = session.get(InstanceSchedule, schedule_id)
                assert row is not None and row.last_fired_at is not None
                fired.append(row.last_fired_at)
    # 19:00 CET is 18:00 UTC; after the change 19:00 CEST is 17:00 UTC
    assert fired == [utc(2026, 3, 27, 18), utc(2026, 3, 28, 18), utc(2026, 3, 29, 17)]


def _ny():  # type: ignore[no-untyped-def]
    from zoneinfo import ZoneInfo

    return ZoneInfo("America/New_York")


def test_bad_schedules_and_zones_other_users_and_a_zone_change(ann: Caller, bob: Caller) -> None:
    i = create(ann)
    cases = [
        ({"action": "stop", "cron": "every day at 9"}, '"0 9 * * 1-5"'),
        ({"action": "stop", "cron": "0 9 * *"}, "five fields"),
        ({"action": "stop", "cron": "0 25 * * *"}, "five fields"),
        ({"action": "stop", "cron": "0 0 9 * * 1-5"}, "five fields"),
        ({"action": "reboot", "cron": "0 9 * * *"}, "neither start nor stop"),
        ({"action": "stop", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "IANA"),
        ({"action": "stop", "cron": "0 9 * * *", "timezone": "../../etc/passwd"}, "IANA"),
    ]
    for body, words in cases:
        r = ann.post(f"/api/v1/instances/{i}/schedules", json=body)
        assert r.status_code == 422, (body, r.text)
        assert words in r.json()["detail"], (body, r.json())
    for zone in ("Mars/Olympus", "", "UTC "):
        r = ann.put("/api/v1/me/timezone", json={"timezone": zone})
        assert r.status_code == 422 and "Europe/Berlin" in r.json()["detail"]
    assert ann.get(f"/api/v1/instances/{i}/schedules").json() == []

    mine = add(ann, i, "stop", "0 19 * * *")
    assert bob.get(f"/api/v1/instances/{i}/schedules").status_code == 404
    r = bob.post(f"/api/v1/instances/{i}/schedules", json={"action": "stop", "cron": "0 9 * * *"})
    assert r.status_code == 404
    assert bob.delete(f"/api/v1/instances/{i}/schedules/{mine['id']}").status_code == 404
    theirs = create(bob, "T4:1")
    r = ann.delete(f"/api/v1/instances/{theirs}/schedules/{mine['id']}")
    assert r.status_code == 404
    r = bob.delete(f"/api/v1/instances/{theirs}/schedules/{mine['id']}")
    assert r.status_code == 404 and "has no schedule" in r.json()["detail"]
    assert len(ann.get(f"/api/v1/instances/{i}/schedules").json()) == 1
    assert ann.delete(f"/api/v1/instances/{i}/schedules/{mine['id']}").status_code == 204
    assert ann.get(f"/api/v1/instances/{i}/schedules").json() == []

    # a new time zone moves the schedules that followed the old one, not the others
    follows = add(ann, i, "stop", "0 19 * * *")
    fixed = add(ann, i, "start", "0 9 * * *", timezone="Asia/Tokyo")
    ann.put("/api/v1/me/timezone", json={"timezone": "Europe/Berlin"})
    listed = {s["id"]: s for s in ann.get(f"/api/v1/instances/{i}/schedules").json()}
    assert listed[follows["id"]]["timezone"] == "Europe/Berlin"
    assert listed[fixed["id"]]["timezone"] == "Asia/Tokyo"
    assert ann.get("/api/v1/me").json()["timezone"] == "Europe/Berlin"


def test_schedules_survive_a_server_restart_without_losing_or_doubling_a_fire(
    settings: Settings,
) -> None:
    """Build the runtime, add schedules, drop it (a restart), build a new one over the same
    database: a fire that came due while it was down happens once, late."""
    first = build_runtime(settings, FakeBackend())
    with TestClient(create_app(settings, runtime=first, reconcilers=False)) as http:
        ann = make_user(http, "ann")
        ann.put("/api/v1/me/timezone", json={"timezone": "Europe/Berlin"})
        i = create(ann)
        ann.post(f"/api/v1/instances/{i}/stop")
        # a June noon in Berlin: the next 09:00 is tomorrow's, and the one after a day later
        start = add_at(first, i, "start", "0 9 * * *", utc(2026, 6, 10, 10))
        due = fires_at(first, start)
    first.engine.dispose()
    assert due == utc(2026, 6, 11, 7)

    backend = FakeBackend()
    second = build_runtime(settings, backend)
    try:
        # down until three hours past the fire time
        late = due + timedelta(hours=3)
        assert schedule_fires.tick(second, now=late) == 1
        assert schedule_fires.tick(second, now=late) == 0
        assert status(second, i) == "queued"
        # placement and launch alone: the whole loop would fire the schedule again against
        # the real clock, for which these fixed times are long past
        scheduler.tick(second)
        launcher.tick(second)
        assert status(second, i) == "starting" and backend.handle_for(i) is not None
        with transaction(second.sessions) as session:
            row = session.scalars(select(InstanceSchedule)).one()
            assert row.last_fired_at == due
            assert row.next_fire_at == due + timedelta(days=1)
    finally:
        second.engine.dispose()


def test_schedules_of_a_released_instance_go_away(ann: Caller, rt: Runtime) -> None:
    i = create(ann)
    fires = [add(ann, i, action, "* * * * *") for action in ("start", "stop")]
    ann.post(f"/api/v1/instances/{i}/release")
    schedule_fires.tick(rt, now=max(parse(s["next_fire_at"]) for s in fires))
    with transaction(rt.sessions) as session:
        assert session.scalars(select(InstanceSchedule)).all() == []
