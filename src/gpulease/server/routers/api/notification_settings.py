"""The caller's notification channels (webhook, email), a test send, and marking read."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Request

from gpulease.schemas.notifications import (
    NotificationChannelsPublic,
    NotificationChannelsUpdate,
    NotificationPublic,
)
from gpulease.server.routers.deps import CurrentUser, IdPath, SessionDep, runtime
from gpulease.server.services import notification_channels, notifications

router = APIRouter(tags=["notifications"])


@router.get("/notifications/channels")
def get_channels(
    session: SessionDep, user: CurrentUser, request: Request
) -> NotificationChannelsPublic:
    email = runtime(request).settings.smtp_configured
    return notification_channels.public(session, user, email_available=email)


@router.put("/notifications/channels")
def put_channels(
    change: NotificationChannelsUpdate, session: SessionDep, user: CurrentUser, request: Request
) -> NotificationChannelsPublic:
    """Change only the fields given; the answer carries the webhook's secret when one was
    made (first URL, or rotate_secret) and never again."""
    settings = runtime(request).settings
    email = settings.smtp_configured
    secret = notification_channels.update(
        session,
        user,
        change,
        email_available=email,
        allow_private=settings.webhook_allow_private,
    )
    return notification_channels.public(session, user, email_available=email, new_secret=secret)


@router.post("/notifications/channels/test", status_code=202)
def send_test(
    session: SessionDep, user: CurrentUser, request: Request, after: BackgroundTasks
) -> dict[str, int]:
    channels = notification_channels.send_test(session, user)
    after.add_task(request.app.state.wake_reconcilers)  # the delivery loop, once committed
    return {"channels": channels}


@router.post("/notifications/{notification_id}/read")
def mark_read(
    notification_id: IdPath, session: SessionDep, user: CurrentUser
) -> NotificationPublic:
    return NotificationPublic.model_validate(
        notifications.mark_read(session, user, notification_id)
    )
