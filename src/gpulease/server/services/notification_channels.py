"""A user's notification channels: one webhook (with its signing secret) and one email
address, each on or off and limited to the categories the user wants."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, InvalidInput
from gpulease.core.records import from_attributes
from gpulease.schemas.notifications import (
    EmailChannelPublic,
    NotificationChannelsPublic,
    NotificationChannelsUpdate,
    WebhookChannelPublic,
)
from gpulease.server.db import utcnow
from gpulease.server.orm import Notification, NotificationChannel, NotificationDelivery, User
from gpulease.server.services import notifications, webhook_addresses

WEBHOOK = "webhook"
EMAIL = "email"
EMAIL_PATTERN = re.compile(r"^[^@\s<>\"',;]+@[^@\s<>\"',;]+\.[^@\s<>\"',;]+$")
TEST_EVERY = timedelta(seconds=10)
NO_SMTP = (
    "this server sends no email: its operator has not configured SMTP "
    "(GPULEASE_SMTP_HOST); use a webhook instead"
)


def channels(session: Session, user: User) -> dict[str, NotificationChannel]:
    rows = session.scalars(
        select(NotificationChannel).where(NotificationChannel.user_id == user.id)
    )
    return {row.kind: row for row in rows if row.target}


def public(
    session: Session, user: User, *, email_available: bool, new_secret: str | None = None
) -> NotificationChannelsPublic:
    found = channels(session, user)
    hook, mail = found.get(WEBHOOK), found.get(EMAIL)
    return NotificationChannelsPublic(
        webhook=WebhookChannelPublic(
            url=hook.target,
            enabled=hook.enabled,
            kinds=hook.kinds,
            secret_hint="…" + (hook.secret or "")[-4:],
        )
        if hook
        else None,
        email=EmailChannelPublic(address=mail.target, enabled=mail.enabled, kinds=mail.kinds)
        if mail
        else None,
        email_available=email_available,
        categories=list(notifications.CATEGORIES),
        webhook_secret=new_secret,
    )


def check_webhook_url(url: str, *, allow_private: bool = False) -> str:
    """A well-formed http(s) URL whose host is not, and does not resolve to, a loopback,
    private, link-local or metadata address (unless the operator allows private ones)."""
    url = url.strip()
    if len(url) > 2000:
        raise InvalidInput("the webhook URL is longer than 2000 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(
            f"{url!r} is not a webhook URL: give an http:// or https:// address, "
            "e.g. https://hooks.example.com/gpulease"
        )
    if any(c.isspace() for c in url):
        raise InvalidInput("the webhook URL contains spaces; percent-encode them")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise InvalidInput(f"{url!r} has an invalid port") from None
    webhook_addresses.check_saved_url(url, allow_private=allow_private)
    return url


def check_email(address: str) -> str:
    address = address.strip()
    if len(address) > 254 or not EMAIL_PATTERN.match(address):
        raise InvalidInput(f"{address!r} is not an email address (like ann@example.com)")
    return address


def check_kinds(kinds: list[str] | None) -> list[str] | None:
    """None (or every category) means all; an empty list means none but the uncategorised."""
    if kinds is None:
        return None
    unknown = sorted(set(kinds) - set(notifications.CATEGORIES))
    if unknown:
        raise InvalidInput(
            f"unknown notification categories {', '.join(unknown)}; "
            f"choose from {', '.join(notifications.CATEGORIES)}"
        )
    chosen = [c for c in notifications.CATEGORIES if c in kinds]
    return None if len(chosen) == len(notifications.CATEGORIES) else chosen


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(24)


def _row(session: Session, user: User, kind: str) -> NotificationChannel:
    row = session.scalar(
        select(NotificationChannel).where(
            NotificationChannel.user_id == user.id, NotificationChannel.kind == kind
        )
    )
    if row is None:
        now = utcnow()
        row = NotificationChannel(
            user_id=user.id, kind=kind, target="", enabled=False, created_at=now, updated_at=now
        )
        session.add(row)
    return row


def update(
    session: Session,
    user: User,
    change: NotificationChannelsUpdate,
    *,
    email_available: bool,
    allow_private: bool = False,
) -> str | None:
    """Apply the fields given; returns the webhook's new secret when one was made.
    allow_private: the operator's GPULEASE_WEBHOOK_ALLOW_PRIVATE."""
    given = change.model_fields_set
    now = utcnow()
    secret: str | None = None
    if "webhook_url" in given or change.webhook_enabled is not None or change.rotate_secret:
        hook = _row(session, user, WEBHOOK)
        if "webhook_url" in given:
            if change.webhook_url and change.webhook_url.strip():
                url = check_webhook_url(change.webhook_url, allow_private=allow_private)
                if not hook.target or not hook.secret:
                    secret = hook.secret = new_secret()
                    hook.enabled = True
                hook.target = url
            else:  # removed: pending deliveries to it are given up when their turn comes
                hook.target, hook.secret, hook.enabled = "", None, False
        if (change.rotate_secret or change.webhook_enabled) and not hook.target:
            raise InvalidInput("set a webhook URL first")
        if change.rotate_secret:
            secret = hook.secret = new_secret()
        if change.webhook_enabled is not None:
            hook.enabled = change.webhook_enabled
        if "webhook_kinds" in given:
            hook.kinds = check_kinds(change.webhook_kinds)
        hook.updated_at = now
    elif "webhook_kinds" in given:
        raise InvalidInput("set a webhook URL first")
    if "email" in given or change.email_enabled is not None or "email_kinds" in given:
        mail = _row(session, user, EMAIL)
        if "email" in given:
            if change.email and change.email.strip():
                mail.target = check_email(change.email)
                mail.enabled = True if change.email_enabled is None else change.email_enabled
            else:
                mail.target, mail.enabled = "", False
        elif change.email_enabled is not None:
            if not mail.target:
                raise InvalidInput("set an email address first")
            mail.enabled = change.email_enabled
        if mail.enabled and not email_available:
            raise Conflict(NO_SMTP)
        if "email_kinds" in given:
            mail.kinds = check_kinds(change.email_kinds)
        mail.updated_at = now
    session.flush()
    return secret


def send_test(session: Session, user: User) -> int:
    """A test notice through every enabled channel; returns how many channels it goes to."""
    found = [c for c in channels(session, user).values() if c.enabled]
    if not found:
        raise InvalidInput("no channel is on: set a webhook URL or an email address first")
    last = session.scalar(
        select(Notification.created_at)
        .where(Notification.user_id == user.id, Notification.kind == "test")
        .order_by(Notification.id.desc())
        .limit(1)
    )
    if last is not None and utcnow() - last < TEST_EVERY:
        raise Conflict(
            f"a test was sent less than {TEST_EVERY.seconds} s ago; see its outcome under "
            "recent deliveries, then try again"
        )
    notifications.notify(
        session, user.id, "test", f"test notification for {user.name}: your channel works"
    )
    return len(found)


@dataclass(frozen=True)
class DeliveryRow:
    channel: str
    kind: str
    message: str
    status: str
    attempts: int
    last_error: str
    created_at: datetime
    delivered_at: datetime | None


def recent_deliveries(session: Session, user: User, limit: int = 10) -> list[DeliveryRow]:
    """The user's latest webhook and email deliveries, with why the failed ones failed."""
    rows = session.execute(
        select(NotificationDelivery, NotificationChannel.kind, Notification)
        .join(NotificationChannel, NotificationChannel.id == NotificationDelivery.channel_id)
        .join(Notification, Notification.id == NotificationDelivery.notification_id)
        .where(NotificationChannel.user_id == user.id)
        .order_by(NotificationDelivery.id.desc())
        .limit(limit)
    ).all()
    return [
        from_attributes(DeliveryRow, d, channel=channel, kind=n.kind, message=n.message)
        for d, channel, n in rows
    ]
