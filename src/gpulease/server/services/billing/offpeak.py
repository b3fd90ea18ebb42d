"""Operator-defined off-peak windows: listed by anyone, changed by admins, snapshotted into
each usage segment when it opens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import NotFound
from gpulease.core.pricing import OffPeakWindow, check_no_overlap, in_window
from gpulease.server.db import utcnow
from gpulease.server.orm import OffPeakWindowRow


def _window(row: OffPeakWindowRow) -> OffPeakWindow:
    return OffPeakWindow(
        weekdays=frozenset(int(d) for d in row.weekdays),
        start_minute=row.start_minute,
        end_minute=row.end_minute,
        discount_bp=row.discount_bp,
        tz=row.tz,
    )


def list_windows(session: Session) -> list[tuple[int, OffPeakWindow]]:
    rows = session.scalars(select(OffPeakWindowRow).order_by(OffPeakWindowRow.id))
    return [(row.id, _window(row)) for row in rows]


def add_window(session: Session, window: OffPeakWindow) -> int:
    check_no_overlap([w for _, w in list_windows(session)] + [window])
    row = OffPeakWindowRow(
        weekdays="".join(str(d) for d in sorted(window.weekdays)),
        start_minute=window.start_minute,
        end_minute=window.end_minute,
        discount_bp=window.discount_bp,
        tz=window.tz,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row.id


def remove_window(session: Session, window_id: int) -> None:
    row = session.get(OffPeakWindowRow, window_id)
    if row is None:
        raise NotFound(f"there is no off-peak window {window_id}; see `gpulease offpeak`")
    session.delete(row)


def snapshot(session: Session) -> dict[str, Any]:
    """What a usage segment stores so its price never changes after it opened."""
    return {"windows": [w.to_json() for _, w in list_windows(session)]}


def from_snapshot(data: dict[str, Any]) -> list[OffPeakWindow]:
    return [OffPeakWindow.from_json(w) for w in data.get("windows", [])]


def is_cheap_now(session: Session, now: datetime | None = None) -> bool:
    return in_window(now or utcnow(), [w for _, w in list_windows(session)])
