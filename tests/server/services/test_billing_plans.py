"""Plans, off-peak windows, start-when-cheap, daily blocks, spot: through the API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.core.money import cost_for_seconds
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Instance, UsageSegment
from gpulease.server.runtime import Runtime
from gpulease.server.services import metering

ALL_DAY = {"weekdays": "all", "start": "00:00", "end": "00:00", "discount": "50"}


def _age_segment(rt: Runtime, instance_id: int, seconds: int) -> UsageSegment:
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        seg.started_at -= timedelta(seconds=seconds)
        metering.charge_segment(session, seg, seg.started_at + timedelta(seconds=seconds))
        return seg


def test_plan_quotes_show_rules_before_purchase(ann: Caller) -> None:
    quotes = {q["plan"]: q for q in ann.get("/api/v1/plans", params={"gpu": "A100-80GB:2"}).json()}
    assert quotes["on_demand"]["hourly_micro"] == 1_800_000
    assert quotes["spot"]["hourly_micro"] < quotes["on_demand"]["hourly_micro"]
    assert quotes["daily"]["block_micro"] == 36_000_000 < 24 * 1_800_000
    assert "not refunded" in quotes["daily"]["rules"] and "reserved" in quotes["daily"]["rules"]
    assert ann.get("/api/v1/plans", params={"gpu": "B200:1"}).status_code == 422
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "plan": "weekly"})
    assert r.status_code == 422 and "unknown plan" in r.json()["detail"]


def test_spot_is_charged_at_the_spot_rate(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, plan="spot")
    seg = _age_segment(rt, instance_id, 3600)
    assert seg.plan == "spot" and seg.charged_micro == 540_000  # $0.90 less 40 %


def test_offpeak_window_discounts_new_segments(
    ann: Caller,
    admin: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    assert ann.post("/api/v1/admin/offpeak", json=ALL_DAY).status_code == 403
    r = admin.post("/api/v1/admin/offpeak", json=ALL_DAY)
    assert r.status_code == 201, r.text
    assert ann.get("/api/v1/offpeak").json()[0]["discount_percent"] == "50"
    instance_id, _ = make_running_instance(ann, tick, runner_for)
    seg = _age_segment(rt, instance_id, 3600)
    assert seg.charged_micro == 450_000


def test_offpeak_bad_input(admin: Caller) -> None:
    assert admin.post("/api/v1/admin/offpeak", json={**ALL_DAY, "end": "08:00"}).status_code == 201
    cases = [
        ({**ALL_DAY, "weekdays": "sat", "start": "07:00", "end": "09:00"}, "overlaps"),
        ({**ALL_DAY, "start": "25:00"}, "time of day"),
        ({**ALL_DAY, "weekdays": "someday"}, "weekday"),
        ({**ALL_DAY, "discount": "0"}, "discount"),
        ({**ALL_DAY, "discount": "150"}, "discount"),
        ({**ALL_DAY, "discount": "lots"}, "percentage"),
    ]
    for body, words in cases:
        r = admin.post("/api/v1/admin/offpeak", json=body)
        assert r.status_code == 422 and words in r.json()["detail"], (body, r.text)
    assert len(admin.get("/api/v1/offpeak").json()) == 1


def test_start_when_cheap_waits_for_a_window(
    ann: Caller, admin: Caller, tick: Callable[[], None]
) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "start_when_cheap": True})
    assert r.status_code == 422 and "no off-peak windows" in r.json()["detail"]
    now = utcnow()
    later = (now + timedelta(hours=2)).strftime("%H:%M")
    much_later = (now + timedelta(hours=4)).strftime("%H:%M")
    window = {"weekdays": "all", "start": later, "end": much_later, "discount": "30"}
    assert admin.post("/api/v1/admin/offpeak", json=window).status_code == 201
    cheap = ann.post("/api/v1/instances", json={"gpu": "T4:1", "start_when_cheap": True}).json()
    other = ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"}).json()
    tick()
    got = ann.get(f"/api/v1/instances/{cheap['id']}").json()
    assert got["status"] == "queued" and "off-peak" in got["status_message"]
    assert ann.get(f"/api/v1/instances/{other['id']}").json()["status"] == "starting"
    window_id = admin.get("/api/v1/offpeak").json()[0]["id"]
    assert admin.delete(f"/api/v1/admin/offpeak/{window_id}").status_code == 204
    assert admin.post("/api/v1/admin/offpeak", json=ALL_DAY).status_code == 201
    tick()
    assert ann.get(f"/api/v1/instances/{cheap['id']}").json()["status"] == "starting"


def test_daily_block_is_prepaid_and_reserves_the_gpus(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    before = ann.get("/api/v1/balance").json()["balance_micro"]
    instance_id, _ = make_running_instance(ann, tick, runner_for, gpu="T4:1", plan="daily")
    assert before - ann.get("/api/v1/balance").json()["balance_micro"] == 5_000_000  # 20 h × $0.25
    _age_segment(rt, instance_id, 1800)
    assert before - ann.get("/api/v1/balance").json()["balance_micro"] == 5_000_000  # no per-second
    ann.post(f"/api/v1/instances/{instance_id}/stop")
    runner_for(instance_id).stopped()
    gpus = {g["name"]: g for g in ann.get("/api/v1/gpus").json()}
    assert gpus["T4"]["free"] == 0  # still reserved while stopped
    other = ann.post("/api/v1/instances", json={"gpu": "T4:1"}).json()
    ann.post(f"/api/v1/instances/{instance_id}/start")
    tick()
    assert ann.get(f"/api/v1/instances/{instance_id}").json()["status"] == "starting"
    assert ann.get(f"/api/v1/instances/{other['id']}").json()["status"] == "queued"
    assert before - ann.get("/api/v1/balance").json()["balance_micro"] == 5_000_000
    # the block ends: without auto-renew the instance stops and the GPU goes to the queue
    runner_for(instance_id).ready()
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None
        row.reserved_until = utcnow() - timedelta(seconds=1)
    tick()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "stopping" and "daily block ended" in got["status_reason"]
    runner_for(instance_id).stopped()
    tick()
    assert ann.get(f"/api/v1/instances/{other['id']}").json()["status"] == "starting"


def test_daily_auto_renew_buys_the_next_block(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    r = ann.post("/api/v1/instances", json={"gpu": "T4:1", "auto_renew": True})
    assert r.status_code == 422 and "daily" in r.json()["detail"]
    instance_id, _ = make_running_instance(
        ann, tick, runner_for, gpu="T4:1", plan="daily", auto_renew=True
    )
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None
        row.reserved_until = utcnow() - timedelta(seconds=1)
    tick()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "running"
    assert 10_000_000 - ann.get("/api/v1/balance").json()["balance_micro"] == 10_000_000
    # a third block is more than the wallet holds: it stops, workspace kept
    with transaction(rt.sessions) as session:
        row = session.get(Instance, instance_id)
        assert row is not None
        row.reserved_until = utcnow() - timedelta(seconds=1)
    tick()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "stopping" and "could not renew" in got["status_reason"]


def test_segments_keep_the_windows_they_opened_with(
    ann: Caller,
    admin: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for)
    admin.post("/api/v1/admin/offpeak", json=ALL_DAY)  # added after the segment opened
    seg = _age_segment(rt, instance_id, 7200)
    assert seg.charged_micro == cost_for_seconds(900_000, 7200)
    with transaction(rt.sessions) as session:
        assert session.scalars(select(UsageSegment)).one().offpeak == {"windows": []}
