"""The caller's notification channels (webhook, email), a test send, and marking read."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpulease.schemas.notifications import (
    NotificationChannelsPublic,
    NotificationChannelsUpdate,
    NotificationPublic,
)
from gpulease.server.routers.deps import current_user, runtime, tx
from gpulease.server.services import notification_channels, notifications

router = APIRouter(tags=["notifications"])


@router.get("/notifications/channels")
def get_channels(request: Request) -> NotificationChannelsPublic:
    email = runtime(request).settings.smtp_configured
    with tx(request) as session:
        user = current_user(session, request)
        return notification_channels.public(session, user, email_available=email)


@router.put("/notifications/channels")
def put_channels(
    change: NotificationChannelsUpdate, request: Request
) -> NotificationChannelsPublic:
    """Change only the fields given; the answer carries the webhook's secret when one was
    made (first URL, or rotate_secret) and never again."""
    settings = runtime(request).settings
    email = settings.smtp_configured
    with tx(request) as session:
        user = current_user(session, request)
        secret = notification_channels.update(
            session,
            user,
            change,
            email_available=email,
            allow_private=settings.webhook_allow_private,
        )
        return notification_channels.public(session, user, email_available=email, new_secret=secret)


@router.post("/notifications/channels/test", status_code=202)
def send_test(request: Request) -> dict[str, int]:
    with tx(request) as session:
        user = current_user(session, request)
        channels = notification_channels.send_test(session, user)
    request.app.state.wake_reconcilers()
    return {"channels": channels}


@router.post("/notifications/{notification_id}/read")
def mark_read(notification_id: int, request: Request) -> NotificationPublic:
    with tx(request) as session:
        user = current_user(session, request)
        return NotificationPublic.model_validate(
            notifications.mark_read(session, user, notification_id)
        )
