"""Messages to users about their instances, runs, money and tickets: shown in the console and
CLI, and queued for the user's webhook and email (the outbox, sent by reconcilers/notify)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulease.server.db import utcnow
from gpulease.server.orm import Notification, NotificationChannel, NotificationDelivery, User
from gpulease.server.services.rows import find_all, get_owned

# What a user can choose to receive on a channel; a kind not listed here always goes out.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "runs": ("run_finished", "run_failed"),
    "instances": (
        "instance_failed",
        "instance_stopped",
        "instance_stopped_idle",
        "instance_stopped_credit",
        "instance_released",
        "idle_warning",
        "runtime_warning",
        "release_warning",
        "daily_block_ended",
        "schedule_failed",
    ),
    "billing": ("low_balance", "balance_low", "credit_exhausted", "budget_reached"),
    "support": ("ticket_reply", "ticket_message", "ticket_opened"),
}
CATEGORY_OF = {kind: category for category, kinds in CATEGORIES.items() for kind in kinds}
MAX_MESSAGE = 1000


def notify(session: Session, user_id: int, kind: str, message: str) -> Notification:
    """A notice for the user in the console, queued for each of their channels that wants it."""
    notification = Notification(
        user_id=user_id, kind=kind, message=message[:MAX_MESSAGE], created_at=utcnow()
    )
    session.add(notification)
    _queue_deliveries(session, notification)
    return notification


def notify_once(session: Session, user_id: int, kind: str, key: str, message: str) -> bool:
    """A notice that goes out once per key, whatever replica or retry gets here first."""
    if session.scalar(select(Notification.id).where(Notification.dedup_key == key)):
        return False
    notification = Notification(
        user_id=user_id,
        kind=kind,
        message=message[:MAX_MESSAGE],
        created_at=utcnow(),
        dedup_key=key,
    )
    try:
        with session.begin_nested():
            session.add(notification)
            session.flush()
    except IntegrityError:
        return False
    _queue_deliveries(session, notification)
    return True


def wanted(channel: NotificationChannel, kind: str) -> bool:
    category = CATEGORY_OF.get(kind)
    return channel.kinds is None or category is None or category in channel.kinds


def _queue_deliveries(session: Session, notification: Notification) -> None:
    channels = session.scalars(
        select(NotificationChannel).where(
            NotificationChannel.user_id == notification.user_id,
            NotificationChannel.enabled.is_(True),
        )
    ).all()
    channels = [c for c in channels if c.target and wanted(c, notification.kind)]
    if not channels:
        return
    session.flush()  # the notification's id
    now = utcnow()
    for channel in channels:
        session.add(
            NotificationDelivery(
                notification_id=notification.id,
                channel_id=channel.id,
                status="pending",
                attempts=0,
                last_error="",
                next_attempt_at=now,
                created_at=now,
            )
        )


def recent(session: Session, user_id: int, limit: int = 20) -> list[Notification]:
    return find_all(
        session,
        Notification,
        Notification.user_id == user_id,
        order_by=Notification.id.desc(),
        limit=limit,
    )


def mark_read(session: Session, user: User, notification_id: int) -> Notification:
    notification = get_owned(
        session,
        Notification,
        notification_id,
        f"you have no notification {notification_id}; see GET /api/v1/notifications",
        user_id=user.id,
    )
    if notification.read_at is None:
        notification.read_at = utcnow()
    return notification


def notify_admins(
    session: Session, kind: str, message: str, *, except_id: int | None = None
) -> None:
    for admin_id in session.scalars(select(User.id).where(User.role == "admin")):
        if admin_id != except_id:
            notify(session, admin_id, kind, message)
