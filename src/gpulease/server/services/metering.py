"""Usage segments and charging them: per second, in micro-credits, exactly once.

A segment's total charge is always core.pricing.price_seconds(start, billed_seconds, rate,
its off-peak windows) (for a segment without windows, cost_for_seconds(rate, seconds)); each
tick posts
only the difference from what was charged, under an idempotency key naming the segment and
the second it bills up to, and moves billed_seconds with a guarded UPDATE in the same
transaction. A crash before commit loses nothing (the next tick bills the same seconds); a
replay after commit finds the key and posts nothing.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gpulease.core.money import cost_for_seconds
from gpulease.core.pricing import price_seconds
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, LedgerEntry, LedgerTransaction, UsageSegment
from gpulease.server.services import ledger
from gpulease.server.services.billing import offpeak, plans


def open_segment(session: Session, instance: Instance, at: datetime) -> UsageSegment:
    """Start billing an instance. Daily instances are prepaid: their segments record the
    GPU time at rate 0. On-demand and spot segments keep the off-peak windows of now."""
    prepaid = instance.plan == plans.DAILY
    segment = UsageSegment(
        instance_id=instance.id,
        owner_id=instance.owner_id,
        team_id=instance.team_id,
        gpu_model=instance.gpu_model,
        gpu_count=instance.gpu_count,
        hourly_micro=0 if prepaid else instance.hourly_micro,
        plan=instance.plan,
        offpeak={} if prepaid else offpeak.snapshot(session),
        started_at=at,
        billed_seconds=0,
        charged_micro=0,
    )
    session.add(segment)
    session.flush()
    return segment


def open_segment_of(session: Session, instance_id: int) -> UsageSegment | None:
    return session.scalar(
        select(UsageSegment).where(
            UsageSegment.instance_id == instance_id, UsageSegment.ended_at.is_(None)
        )
    )


def _memo(segment: UsageSegment, start: int, end: int) -> str:
    return (
        f"{segment.gpu_model} × {segment.gpu_count} {segment.plan}, "
        f"segment {segment.id}, seconds {start}–{end}"
    )


def charge_segment(session: Session, segment: UsageSegment, upto: datetime) -> int:
    """Bill segment for the whole seconds between its start and `upto`. Returns the amount
    charged now (0 when there is nothing new). Safe to call again with the same `upto`, and
    when another replica bills the same segment meanwhile (it then bills what is left)."""
    seconds = max(0, math.floor((upto - segment.started_at).total_seconds()))
    charged_now = 0
    while seconds > segment.billed_seconds:
        due = segment_price(segment, seconds)
        amount = due - segment.charged_micro
        result = session.execute(
            update(UsageSegment)
            .where(
                UsageSegment.id == segment.id,
                UsageSegment.billed_seconds == segment.billed_seconds,
            )
            .values(billed_seconds=seconds, charged_micro=due)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            session.refresh(segment)  # another replica billed it meanwhile: bill the rest
            continue
        if amount > 0:
            ledger.charge_usage(
                session,
                segment.owner_id,
                segment.instance_id,
                amount,
                key=f"usage:{segment.id}:{seconds}",
                memo=_memo(segment, segment.billed_seconds, seconds),
                team_id=segment.team_id,
            )
        set_committed_value(segment, "billed_seconds", seconds)
        set_committed_value(segment, "charged_micro", due)
        charged_now += amount
    return charged_now


def segment_price(segment: UsageSegment, seconds: int) -> int:
    """What the first `seconds` seconds of a segment cost, exactly."""
    windows = offpeak.from_snapshot(segment.offpeak or {})
    if not windows:
        return cost_for_seconds(segment.hourly_micro, seconds)
    return price_seconds(segment.started_at, seconds, segment.hourly_micro, windows)


def close_segment(session: Session, instance: Instance, at: datetime) -> None:
    segment = open_segment_of(session, instance.id)
    if segment is None:
        return
    at = max(at, segment.started_at)
    charge_segment(session, segment, at)
    segment.ended_at = at


def charge_open_segments(
    session: Session, now: datetime | None = None, *, min_step_s: int = 0
) -> set[int]:
    """Bill every open segment up to now, in bulk. Returns the owners that were charged.

    min_step_s skips segments billed less than that many seconds ago, so a long rental
    makes one ledger transaction per step rather than one per second; closing a segment
    always bills it to the second. The segments are locked for the tick (skipping rows
    another replica holds), so the bill computed from them is the one written.
    """
    now = now or utcnow()
    segments = session.scalars(
        select(UsageSegment)
        .where(UsageSegment.ended_at.is_(None))
        .order_by(UsageSegment.id)
        .with_for_update(skip_locked=True)
    ).all()
    bills: list[tuple[UsageSegment, int, int]] = []
    for segment in segments:
        elapsed = (now - segment.started_at).total_seconds()
        seconds = max(0, math.floor(elapsed))
        if seconds <= segment.billed_seconds or elapsed - segment.billed_seconds < min_step_s:
            continue
        bills.append((segment, seconds, segment_price(segment, seconds)))
    if not bills:
        return set()
    revenue = ledger.account_id(session, ledger.REVENUE)
    wallets = {
        (owner, team): ledger.wallet_account(session, owner, team)
        for owner, team in {(s.owner_id, s.team_id) for s, _, _ in bills}
    }
    charged = [
        (s, sec, due, due - s.charged_micro) for s, sec, due in bills if due > s.charged_micro
    ]
    if charged:
        txn_ids = session.scalars(
            insert(LedgerTransaction).returning(LedgerTransaction.id, sort_by_parameter_order=True),
            [
                {
                    "kind": "usage",
                    "idempotency_key": f"usage:{s.id}:{sec}",
                    "memo": _memo(s, s.billed_seconds, sec),
                    "user_id": s.owner_id,
                    "instance_id": s.instance_id,
                    "created_at": now,
                }
                for s, sec, _, _ in charged
            ],
        ).all()
        entries = []
        for txn_id, (s, _, _, amount) in zip(txn_ids, charged, strict=True):
            entries.append(
                {
                    "transaction_id": txn_id,
                    "account_id": wallets[(s.owner_id, s.team_id)],
                    "amount": -amount,
                    "created_at": now,
                }
            )
            entries.append(
                {
                    "transaction_id": txn_id,
                    "account_id": revenue,
                    "amount": amount,
                    "created_at": now,
                }
            )
        session.execute(insert(LedgerEntry), entries)
    table = cast(Table, UsageSegment.__table__)
    session.connection().execute(
        update(table)
        .where(table.c.id == bindparam("segment_id"))
        .values(billed_seconds=bindparam("seconds"), charged_micro=bindparam("due")),
        [{"segment_id": s.id, "seconds": sec, "due": due} for s, sec, due in bills],
    )
    for segment, seconds, due in bills:
        set_committed_value(segment, "billed_seconds", seconds)
        set_committed_value(segment, "charged_micro", due)
    return {s.owner_id for s, _, _, _ in charged}


def list_segments(session: Session, owner_id: int, limit: int = 200) -> list[UsageSegment]:
    return list(
        session.scalars(
            select(UsageSegment)
            .where(UsageSegment.owner_id == owner_id)
            .order_by(UsageSegment.id.desc())
            .limit(limit)
        )
    )
