"""Usage segments and charging them: per second, in micro-credits, exactly once.

A segment's total charge is always cost_for_seconds(rate, billed_seconds); each tick posts
only the difference from what was charged, under an idempotency key naming the segment and
the second it bills up to, and moves billed_seconds with a guarded UPDATE in the same
transaction. A crash before commit loses nothing (the next tick bills the same seconds); a
replay after commit finds the key and posts nothing.
"""

from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpulease.core.money import cost_for_seconds
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, UsageSegment
from gpulease.server.services import ledger


def open_segment(session: Session, instance: Instance, at: datetime) -> UsageSegment:
    segment = UsageSegment(
        instance_id=instance.id,
        owner_id=instance.owner_id,
        gpu_model=instance.gpu_model,
        gpu_count=instance.gpu_count,
        hourly_micro=instance.hourly_micro,
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


def charge_segment(session: Session, segment: UsageSegment, upto: datetime) -> int:
    """Bill segment for the whole seconds between its start and `upto`. Returns the amount
    charged now (0 when there is nothing new). Safe to call again with the same `upto`."""
    seconds = max(0, math.floor((upto - segment.started_at).total_seconds()))
    if seconds <= segment.billed_seconds:
        return 0
    due = cost_for_seconds(segment.hourly_micro, seconds)
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
        session.refresh(segment)  # another replica billed it meanwhile
        return 0
    if amount > 0:
        ledger.charge_usage(
            session,
            segment.owner_id,
            segment.instance_id,
            amount,
            key=f"usage:{segment.id}:{seconds}",
            memo=f"{segment.gpu_model} × {segment.gpu_count}, segment {segment.id}, "
            f"seconds {segment.billed_seconds}–{seconds}",
        )
    segment.billed_seconds = seconds
    segment.charged_micro = due
    return amount


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
    """Bill every open segment up to now. Returns the owners that were charged.

    min_step_s skips segments billed less than that many seconds ago, so a long rental
    makes one ledger transaction per step rather than one per second; closing a segment
    always bills it to the second.
    """
    now = now or utcnow()
    owners = set()
    segments = session.scalars(
        select(UsageSegment).where(UsageSegment.ended_at.is_(None)).order_by(UsageSegment.id)
    ).all()
    for segment in segments:
        elapsed = (now - segment.started_at).total_seconds()
        if elapsed - segment.billed_seconds < min_step_s:
            continue
        if charge_segment(session, segment, now):
            owners.add(segment.owner_id)
    return owners


def list_segments(session: Session, owner_id: int, limit: int = 200) -> list[UsageSegment]:
    return list(
        session.scalars(
            select(UsageSegment)
            .where(UsageSegment.owner_id == owner_id)
            .order_by(UsageSegment.id.desc())
            .limit(limit)
        )
    )
