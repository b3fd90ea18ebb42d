"""Fire due scheduled starts and stops, oldest first, each exactly once."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, select

from gpulease.server.db import finds_any, transaction, utcnow
from gpulease.server.orm import InstanceSchedule
from gpulease.server.runtime import Runtime
from gpulease.server.services.instances import schedules


def tick(rt: Runtime, now: datetime | None = None) -> int:
    """Apply every fire due by now. Returns how many fired. Asks first in a read-only
    transaction (no SQLite write lock): most ticks find nothing due."""
    now = now or utcnow()
    if not finds_any(rt.sessions, select(InstanceSchedule.id).where(_due(now))):
        return 0
    with transaction(rt.sessions) as session:
        due = session.scalars(
            select(InstanceSchedule)
            .where(_due(now))
            .order_by(InstanceSchedule.next_fire_at, InstanceSchedule.id)
            .with_for_update(skip_locked=True)
        ).all()
        for schedule in due:
            schedules.fire(
                session,
                rt.catalog,
                schedule,
                now,
                min_start_minutes=rt.settings.min_start_minutes,
            )
    return len(due)


def _due(now: datetime) -> ColumnElement[bool]:
    return InstanceSchedule.next_fire_at <= now
