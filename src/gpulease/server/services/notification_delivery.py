"""Sending the notification outbox: claim due deliveries under a lease, send each by webhook
(signed JSON POST) or email (SMTP), then record the outcome if the lease is still ours."""

from __future__ import annotations

import hashlib
import hmac
import json
import smtplib
import ssl
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from email.utils import make_msgid

import httpx
from sqlalchemy import ColumnElement, Select, or_, select, update
from sqlalchemy.orm import Session

from gpulease.server.orm import Notification, NotificationChannel, NotificationDelivery, User
from gpulease.server.services import webhook_addresses
from gpulease.server.settings import Settings

SIGNATURE_HEADER = "X-Gpulease-Signature"
# Why a webhook could not be reached is not told: which ports answer, refuse or hang on a
# host is what a scanner wants to learn.
UNREACHABLE = "could not deliver: could not reach the webhook (check its address and that it is up)"
FIRST_RETRY_S = 30
LONGEST_WAIT_S = 3600
BATCH = 32

SUBJECTS = {
    "run_finished": "Run finished",
    "run_failed": "Run failed",
    "instance_failed": "Instance failed",
    "instance_stopped": "Instance stopped",
    "instance_stopped_idle": "Instance stopped (idle)",
    "instance_stopped_credit": "Instance stopped (credit)",
    "credit_exhausted": "Credit exhausted: instances stopped",
    "low_balance": "Balance running low",
    "balance_low": "Balance running low",
    "ticket_reply": "Reply to your support ticket",
    "ticket_message": "New message on a support ticket",
    "ticket_opened": "New support ticket",
    "test": "Test notification",
}


@dataclass(frozen=True)
class Job:
    """One claimed delivery with everything needed to send it without the database."""

    delivery_id: int
    lease: str
    attempt: int
    channel: str  # webhook | email
    target: str
    secret: str | None
    user: str
    notification_id: int
    kind: str
    message: str
    created_at: datetime


def signature(secret: str, body: bytes) -> str:
    """The header value receivers check: 'sha256=' + hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(FIRST_RETRY_S * 2 ** max(attempts - 1, 0), LONGEST_WAIT_S))


def _due(now: datetime) -> tuple[ColumnElement[bool], ...]:
    """A delivery that is pending, due by now and not leased to a sender."""
    return (
        NotificationDelivery.status == "pending",
        NotificationDelivery.next_attempt_at <= now,
        or_(NotificationDelivery.lease_until.is_(None), NotificationDelivery.lease_until < now),
    )


def due_ids(now: datetime) -> Select[int]:
    """The deliveries claim would find: the sender asks whether there is any first, the
    usual answer being no, so that its every tick takes no write lock for nothing."""
    return select(NotificationDelivery.id).where(*_due(now))


def claim(session: Session, settings: Settings, now: datetime, limit: int = BATCH) -> list[Job]:
    """Lease due deliveries to this caller. Deliveries that can no longer be sent (channel
    removed or turned off, email without SMTP) are closed here, never attempted."""
    rows = session.execute(
        select(NotificationDelivery, NotificationChannel, Notification, User.name)
        .join(NotificationChannel, NotificationChannel.id == NotificationDelivery.channel_id)
        .join(Notification, Notification.id == NotificationDelivery.notification_id)
        .join(User, User.id == Notification.user_id)
        .where(*_due(now))
        .order_by(NotificationDelivery.next_attempt_at, NotificationDelivery.id)
        .limit(limit)
    ).all()
    hold = timedelta(seconds=settings.notify_timeout_s * 3 + 60)
    jobs = []
    for delivery, channel, notification, user_name in rows:
        reason = None
        if not channel.target or not channel.enabled:
            reason = f"the {channel.kind} channel was turned off or removed"
        elif channel.kind == "email" and not settings.smtp_configured:
            reason = "this server has no SMTP configured (GPULEASE_SMTP_HOST)"
        lease = uuid.uuid4().hex
        claimed = session.execute(
            update(NotificationDelivery)
            .where(
                NotificationDelivery.id == delivery.id,
                NotificationDelivery.status == "pending",
                or_(
                    NotificationDelivery.lease_until.is_(None),
                    NotificationDelivery.lease_until < now,
                ),
            )
            .values(
                lease_token=None if reason else lease,
                lease_until=None if reason else now + hold,
                status="failed" if reason else "pending",
                last_error=reason or delivery.last_error,
            )
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1 or reason:  # type: ignore[attr-defined]
            continue  # another server holds it, or it was closed just now
        jobs.append(
            Job(
                delivery_id=delivery.id,
                lease=lease,
                attempt=delivery.attempts + 1,
                channel=channel.kind,
                target=channel.target,
                secret=channel.secret,
                user=user_name,
                notification_id=notification.id,
                kind=notification.kind,
                message=notification.message,
                created_at=notification.created_at,
            )
        )
    return jobs


def send(job: Job, settings: Settings) -> str | None:
    """Send one delivery; None when it was accepted, else why not (for the user to read)."""
    try:
        if job.channel == "webhook":
            return send_webhook(job, settings)
        if job.channel == "email":
            return send_email(job, settings)
        return f"unknown channel kind {job.channel!r}"
    except Exception as exc:  # a sender's surprise is this delivery's failure, not the loop's
        return f"{type(exc).__name__}: {exc}"[:400]


def webhook_body(job: Job) -> bytes:
    payload = {
        "id": job.notification_id,
        "delivery": job.delivery_id,
        "kind": job.kind,
        "message": job.message,
        "user": job.user,
        "created_at": job.created_at.isoformat(),
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def send_webhook(job: Job, settings: Settings) -> str | None:
    """POST the signed body to the address the URL's host resolves to now, once that address
    is checked (webhook_addresses); the connection goes to that very address, with the
    URL's own Host header and TLS server name."""
    body = webhook_body(job)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpulease-webhook/1",
        "X-Gpulease-Event": job.kind,
        "X-Gpulease-Delivery": str(job.delivery_id),
        SIGNATURE_HEADER: signature(job.secret or "", body),
    }
    url = httpx.URL(job.target)
    try:
        address = webhook_addresses.pinned_address(
            job.target, allow_private=settings.webhook_allow_private
        )
    except webhook_addresses.AddressRefused as exc:
        return f"could not deliver: {exc.message}"[:400]
    except (OSError, UnicodeError):
        return UNREACHABLE
    headers["Host"] = url.netloc.decode("ascii")
    try:
        with httpx.Client(trust_env=False, follow_redirects=False) as client:
            response = client.post(
                url.copy_with(host=str(address)),
                content=body,
                headers=headers,
                timeout=settings.notify_timeout_s,
                extensions={"sni_hostname": url.host},
            )
    except httpx.HTTPError:
        return UNREACHABLE
    if 200 <= response.status_code < 300:
        return None
    # Only the status: the body of an arbitrary server is nothing to show back to the user.
    return f"the webhook answered HTTP {response.status_code}"


def email_message(job: Job, settings: Settings) -> EmailMessage:
    message = EmailMessage()
    title = SUBJECTS.get(job.kind, job.kind.replace("_", " ").capitalize())
    message["Subject"] = f"[gpulease] {title}"
    message["From"] = settings.smtp_from or ""
    message["To"] = job.target
    message["Message-ID"] = make_msgid(domain="gpulease")
    console = settings.runner_url
    message.set_content(
        f"Hello {job.user},\n\n{job.message}\n\n"
        f"Console: {console}/\n"
        f"Choose what you receive: {console}/settings/notifications\n"
    )
    return message


def send_email(job: Job, settings: Settings) -> str | None:
    if not settings.smtp_host:
        return "this server has no SMTP configured"
    timeout = settings.notify_timeout_s
    try:
        smtp: smtplib.SMTP
        if settings.smtp_port == 465:
            smtp = smtplib.SMTP_SSL(
                settings.smtp_host,
                settings.smtp_port,
                timeout=timeout,
                context=ssl.create_default_context(),
            )
        else:
            smtp = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=timeout)
        with smtp:
            if settings.smtp_port != 465 and settings.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
            if settings.smtp_username and settings.smtp_password:
                smtp.login(settings.smtp_username, settings.smtp_password.get_secret_value())
            smtp.send_message(email_message(job, settings))
    except (smtplib.SMTPException, OSError) as exc:
        return f"the mail server refused or could not be reached: {type(exc).__name__}: {exc}"[:400]
    return None


def record(session: Session, job: Job, error: str | None, now: datetime, max_attempts: int) -> bool:
    """Store the outcome if the lease is still ours; False when another server took over."""
    values: dict[str, object] = {"attempts": job.attempt, "lease_token": None, "lease_until": None}
    if error is None:
        values.update(status="delivered", delivered_at=now, last_error="")
    elif job.attempt >= max_attempts:
        values.update(
            status="failed", last_error=f"gave up after {job.attempt} attempts: {error}"[:500]
        )
    else:
        values.update(last_error=error[:500], next_attempt_at=now + backoff(job.attempt))
    done = session.execute(
        update(NotificationDelivery)
        .where(
            NotificationDelivery.id == job.delivery_id,
            NotificationDelivery.lease_token == job.lease,
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount == 1)  # type: ignore[attr-defined]
