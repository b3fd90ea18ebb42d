"""The console's notification settings: a webhook (its secret shown once, rotate, remove), an
email address on or off, which categories each gets, a test send, recent deliveries."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form, Response

from gpulease.core.errors import GpuleaseError
from gpulease.schemas.notifications import NotificationChannelsUpdate
from gpulease.server.routers.ui.guards import ConsolePage, FormViewer, PageViewer, console_router
from gpulease.server.services import notification_channels, notifications

router = console_router()

PATH = "/settings/notifications"
FormText = Annotated[str, Form()]
FormList = Annotated[list[str] | None, Form()]
NOTICES = {
    "saved": "Saved.",
    "removed": "Webhook removed; nothing more is sent to it.",
    "tested": "Test notification queued: it goes out within a few seconds.",
}


def _page(
    console: ConsolePage,
    refusal: GpuleaseError | None = None,
    *,
    secret: str | None = None,
    notice: str = "",
    typed_url: str | None = None,
    typed_email: str | None = None,
) -> Response:
    email_available = console.runtime.settings.smtp_configured
    channels = notification_channels.public(
        console.session, console.user, email_available=email_available, new_secret=secret
    )
    deliveries = notification_channels.recent_deliveries(console.session, console.user)
    context = {
        "channels": channels,
        "deliveries": deliveries,
        "categories": notifications.CATEGORIES,
        "notice": notice,
        "typed_url": typed_url,
        "typed_email": typed_email,
    }
    return console.form_page("settings/notifications.html", context, refusal, page="settings")


@router.get(PATH)
def settings_page(console: PageViewer, done: str = "") -> Response:
    return _page(console, notice=NOTICES.get(done, ""))


def _apply(
    console: ConsolePage,
    change: NotificationChannelsUpdate,
    *,
    typed_url: str | None = None,
    typed_email: str | None = None,
    done: str = "saved",
) -> Response:
    """Apply a change through the same service as PUT /api/v1/notifications/channels. A new
    secret is shown on this answer only (no redirect, so it is never in a URL)."""
    settings = console.runtime.settings
    secret: str | None = None

    def act() -> str:
        nonlocal secret
        secret = notification_channels.update(
            console.session,
            console.user,
            change,
            email_available=settings.smtp_configured,
            allow_private=settings.webhook_allow_private,
        )
        return f"{PATH}?done={done}"

    def refused(exc: GpuleaseError) -> Response:
        return _page(console, exc, typed_url=typed_url, typed_email=typed_email)

    answer = console.act(act, refused)
    if secret:
        return _page(console, secret=secret, notice=NOTICES["saved"])
    return answer


@router.post(PATH + "/webhook")
def save_webhook(
    console: FormViewer, url: FormText = "", enabled: FormText = "", kinds: FormList = None
) -> Response:
    if not url.strip():
        return _apply(console, NotificationChannelsUpdate(webhook_url=None), done="removed")
    change = NotificationChannelsUpdate(
        webhook_url=url[:2000], webhook_enabled=enabled == "on", webhook_kinds=kinds or []
    )
    return _apply(console, change, typed_url=url)


@router.post(PATH + "/webhook/rotate")
def rotate_secret(console: FormViewer) -> Response:
    return _apply(console, NotificationChannelsUpdate(rotate_secret=True))


@router.post(PATH + "/webhook/remove")
def remove_webhook(console: FormViewer) -> Response:
    return _apply(console, NotificationChannelsUpdate(webhook_url=None), done="removed")


@router.post(PATH + "/email")
def save_email(
    console: FormViewer, address: FormText = "", enabled: FormText = "", kinds: FormList = None
) -> Response:
    change = NotificationChannelsUpdate(
        email=address[:254] or None,
        email_enabled=enabled == "on" if address.strip() else None,
        email_kinds=kinds or [],
    )
    return _apply(console, change, typed_email=address)


@router.post(PATH + "/test")
def send_test(console: FormViewer) -> Response:
    def act() -> str:
        notification_channels.send_test(console.session, console.user)
        console.wake_reconcilers()
        return f"{PATH}?done=tested"

    return console.act(act, lambda exc: _page(console, exc))
