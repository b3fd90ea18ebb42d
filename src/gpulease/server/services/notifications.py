"""Messages to users about their instances and money, shown in the console and CLI."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulease.server.db import utcnow
from gpulease.server.orm import Notification


def notify(session: Session, user_id: int, kind: str, message: str) -> None:
    session.add(
        Notification(user_id=user_id, kind=kind, message=message[:1000], created_at=utcnow())
    )


def recent(session: Session, user_id: int, limit: int = 20) -> list[Notification]:
    return list(
        session.scalars(
            select(Notification)
            .where(Notification.user_id == user_id)
            .order_by(Notification.id.desc())
            .limit(limit)
        )
    )


def notify_once(session: Session, user_id: int, kind: str, key: str, message: str) -> bool:
    """A notice that goes out once per key, whatever replica or retry gets here first."""
    if session.scalar(select(Notification.id).where(Notification.dedup_key == key)):
        return False
    try:
        with session.begin_nested():
            session.add(
                Notification(
                    user_id=user_id, kind=kind, message=message, created_at=utcnow(), dedup_key=key
                )
            )
            session.flush()
    except IntegrityError:
        return False
    return True
