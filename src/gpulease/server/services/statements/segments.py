"""The usage segments that overlap a period: where a statement's GPU time comes from."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpulease.core.periods import Period
from gpulease.server.orm import UsageSegment

# The kind that carries GPU time in statement lines (the meter's charges).
TIME_KIND = "usage"


def segments_in(session: Session, period: Period, owner_id: int | None) -> list[UsageSegment]:
    query = select(UsageSegment).where(
        UsageSegment.started_at < period.ends,
        or_(UsageSegment.ended_at.is_(None), UsageSegment.ended_at > period.begins),
    )
    if owner_id is not None:
        query = query.where(UsageSegment.owner_id == owner_id)
    return list(session.scalars(query.order_by(UsageSegment.id)))
