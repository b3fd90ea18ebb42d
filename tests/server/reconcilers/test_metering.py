"""Metering: per-second charges in micro-credits, exactly once, and stopping at zero credit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from factories import Caller, RunnerDouble, make_running_instance
from gpulease.core.money import cost_for_seconds
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Instance, LedgerEntry, LedgerTransaction, UsageSegment
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering


def _backdate_segment(rt: Runtime, instance_id: int, seconds: float) -> None:
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        seg.started_at = seg.started_at - timedelta(seconds=seconds)


def test_charges_are_exact_and_never_repeat(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(
        ann, tick, runner_for, gpu="T4:1"
    )  # $0.25/h: 69.44 micro/s
    _backdate_segment(rt, instance_id, 3 * 3600 + 7)
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        start = seg.started_at
        # bill in uneven steps, repeating some: the total must be the one-shot price
        for offset in (1, 1, 59, 600, 600, 3601, 7777, 3 * 3600 + 7):
            metering.charge_segment(
                session, seg, start + timedelta(seconds=offset, milliseconds=999)
            )
        assert seg.billed_seconds == 3 * 3600 + 7
        assert seg.charged_micro == cost_for_seconds(250_000, 3 * 3600 + 7) == 750_486
        assert ledger.balance(session, seg.owner_id) == 10_000_000 - 750_486
        # double entry: every transaction sums to zero
        sums = (
            session.execute(
                select(func.sum(LedgerEntry.amount)).group_by(LedgerEntry.transaction_id)
            )
            .scalars()
            .all()
        )
        assert sums and all(s == 0 for s in sums)


def test_replaying_a_tick_posts_nothing(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:2")
    _backdate_segment(rt, instance_id, 100)
    now = utcnow()
    with transaction(rt.sessions) as session:
        metering.charge_open_segments(session, now)
    with transaction(rt.sessions) as session:
        count = session.scalar(select(func.count(LedgerTransaction.id)))
        metering.charge_open_segments(session, now)
        assert session.scalar(select(func.count(LedgerTransaction.id))) == count
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None and seg.charged_micro == cost_for_seconds(1_800_000, 100) == 50_000


def test_a_crashed_tick_is_billed_by_the_next(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:1")
    _backdate_segment(rt, instance_id, 50)
    now = utcnow()
    try:
        with transaction(rt.sessions) as session:
            metering.charge_open_segments(session, now)
            raise RuntimeError("crash before commit")
    except RuntimeError:
        pass
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None and seg.charged_micro == 0
        metering.charge_open_segments(session, now)
        assert seg.charged_micro == cost_for_seconds(900_000, 50)


def test_stop_closes_the_segment_at_the_stop(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:1")
    _backdate_segment(rt, instance_id, 20)
    ann.post(f"/api/v1/instances/{instance_id}/stop")
    runner_for(instance_id).stopped()
    with transaction(rt.sessions) as session:
        (seg,) = session.scalars(select(UsageSegment)).all()
        assert seg.ended_at is not None
        assert seg.billed_seconds in (20, 21)
        assert seg.charged_micro == cost_for_seconds(900_000, seg.billed_seconds)
    usage = ann.get("/api/v1/usage").json()
    assert usage["segments"][0]["charged_micro"] == seg.charged_micro
    assert (
        -sum(line["amount_micro"] for line in usage["ledger"] if line["kind"] == "usage")
        == seg.charged_micro
    )
    # nothing more is charged once stopped
    tick()
    assert ann.get("/api/v1/balance").json()["balance_micro"] == 10_000_000 - seg.charged_micro


def test_zero_balance_stops_instances_and_tells_the_owner(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(
        ann, tick, runner_for, gpu="A100-80GB:2"
    )  # $1.80/h; $10 lasts 5.56 h
    _backdate_segment(rt, instance_id, 6 * 3600)
    tick()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "stopping"
    assert "credit exhausted" in got["status_reason"]
    runner = runner_for(instance_id)
    assert runner.heartbeat() == "stop"
    runner.stopped()
    got = ann.get(f"/api/v1/instances/{instance_id}").json()
    assert got["status"] == "stopped" and "workspace is kept" in got["status_reason"]
    assert ann.get("/api/v1/balance").json()["balance_micro"] < 0
    notes = [n["message"] for n in ann.get("/api/v1/notifications").json()]
    assert any("balance reached" in n for n in notes)
    r = ann.post(f"/api/v1/instances/{instance_id}/start")
    assert r.status_code == 402 and "balance" in r.json()["detail"]


def test_billing_starts_when_running_not_while_queued(
    ann: Caller, rt: Runtime, tick: Callable[[], None]
) -> None:
    for _ in range(3):
        ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1"})
    tick()
    tick()
    with transaction(rt.sessions) as session:
        assert session.scalar(select(func.count(UsageSegment.id))) == 0
        assert session.scalar(select(func.count(Instance.id))) == 3


def test_running_instances_are_charged_in_steps_and_to_the_second_at_stop(
    ann: Caller, rt: Runtime, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    instance_id, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:1")
    _backdate_segment(rt, instance_id, 10)
    with transaction(rt.sessions) as session:
        assert metering.charge_open_segments(session, min_step_s=30) == set()
    _backdate_segment(rt, instance_id, 25)
    with transaction(rt.sessions) as session:
        assert metering.charge_open_segments(session, min_step_s=30) != set()
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None and seg.billed_seconds in (35, 36)


def test_the_bulk_tick_prices_offpeak_windows_as_a_single_charge_does(
    ann: Caller,
    admin: Caller,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    window = {"weekdays": "all", "start": "01:30", "end": "07:00", "discount": "40"}
    assert admin.post("/api/v1/admin/offpeak", json=window).status_code == 201
    instance_id, _ = make_running_instance(ann, tick, runner_for, gpu="A100-80GB:1")
    start = datetime(2026, 3, 7, 22, 0, 5, tzinfo=UTC)  # a Saturday night: two windows ahead
    seconds = 30 * 3600 + 17
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None and seg.offpeak["windows"]  # the window is in its snapshot
        seg.started_at = start
    with transaction(rt.sessions) as session:
        assert metering.charge_open_segments(session, start + timedelta(seconds=seconds + 0.6))
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None and seg.billed_seconds == seconds
        due = metering.segment_price(seg, seconds)
        assert seg.charged_micro == due < cost_for_seconds(900_000, seconds)
        assert ledger.balance(session, seg.owner_id) == 10_000_000 - due
