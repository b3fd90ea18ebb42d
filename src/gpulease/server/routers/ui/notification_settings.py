"""The console's notification settings: a webhook (its secret shown once, rotate, remove), an
email address on or off, which categories each gets, a test send, recent deliveries."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse

from gpulease.core.errors import GpuleaseError
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.notifications import NotificationChannelsUpdate
from gpulease.server.orm import User
from gpulease.server.routers.deps import runtime, same_origin, tx
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render
from gpulease.server.services import notification_channels, notifications

router = APIRouter()

PATH = "/settings/notifications"
FormText = Annotated[str, Form()]
FormList = Annotated[list[str] | None, Form()]
NOTICES = {
    "saved": "Saved.",
    "removed": "Webhook removed; nothing more is sent to it.",
    "tested": "Test notification queued: it goes out within a few seconds.",
}


def _page(
    request: Request,
    user: User,
    *,
    secret: str | None = None,
    notice: str = "",
    error: str = "",
    typed_url: str | None = None,
    typed_email: str | None = None,
    status_code: int = 200,
) -> Response:
    email_available = runtime(request).settings.smtp_configured
    with tx(request) as session:
        channels = notification_channels.public(
            session, user, email_available=email_available, new_secret=secret
        )
        deliveries = notification_channels.recent_deliveries(session, user)
    context = {
        "channels": channels,
        "deliveries": deliveries,
        "categories": notifications.CATEGORIES,
        "notice": notice,
        "error": error,
        "typed_url": typed_url,
        "typed_email": typed_email,
    }
    return render(
        request,
        "settings/notifications.html",
        context,
        user=UserPublic.model_validate(user),
        page="settings",
        status_code=status_code,
    )


def _viewer(request: Request) -> User | None:
    with tx(request) as session:
        return viewer(session, request)


@router.get(PATH)
def settings_page(request: Request, done: str = "") -> Response:
    user = _viewer(request)
    if user is None:
        return RedirectResponse(login_url(request), status_code=303)
    return _page(request, user, notice=NOTICES.get(done, ""))


def _apply(
    request: Request,
    change: NotificationChannelsUpdate,
    *,
    typed_url: str | None = None,
    typed_email: str | None = None,
    done: str = "saved",
) -> Response:
    """Apply a change through the same service as PUT /api/v1/notifications/channels. A new
    secret is shown on this answer only (no redirect, so it is never in a URL)."""
    if not same_origin(request):
        return cross_site_refusal(request)
    user = _viewer(request)
    if user is None:
        return RedirectResponse(login_url(request), status_code=303)
    email_available = runtime(request).settings.smtp_configured
    try:
        with tx(request) as session:
            secret = notification_channels.update(
                session,
                user,
                change,
                email_available=email_available,
                allow_private=runtime(request).settings.webhook_allow_private,
            )
    except GpuleaseError as exc:
        return _page(
            request,
            user,
            error=exc.message,
            typed_url=typed_url,
            typed_email=typed_email,
            status_code=exc.status,
        )
    if secret:
        return _page(request, user, secret=secret, notice=NOTICES["saved"])
    return RedirectResponse(f"{PATH}?done={done}", status_code=303)


@router.post(PATH + "/webhook")
def save_webhook(
    request: Request, url: FormText = "", enabled: FormText = "", kinds: FormList = None
) -> Response:
    if not url.strip():
        return _apply(request, NotificationChannelsUpdate(webhook_url=None), done="removed")
    change = NotificationChannelsUpdate(
        webhook_url=url[:2000], webhook_enabled=enabled == "on", webhook_kinds=kinds or []
    )
    return _apply(request, change, typed_url=url)


@router.post(PATH + "/webhook/rotate")
def rotate_secret(request: Request) -> Response:
    return _apply(request, NotificationChannelsUpdate(rotate_secret=True))


@router.post(PATH + "/webhook/remove")
def remove_webhook(request: Request) -> Response:
    return _apply(request, NotificationChannelsUpdate(webhook_url=None), done="removed")


@router.post(PATH + "/email")
def save_email(
    request: Request, address: FormText = "", enabled: FormText = "", kinds: FormList = None
) -> Response:
    change = NotificationChannelsUpdate(
        email=address[:254] or None,
        email_enabled=enabled == "on" if address.strip() else None,
        email_kinds=kinds or [],
    )
    return _apply(request, change, typed_email=address)


@router.post(PATH + "/test")
def send_test(request: Request) -> Response:
    if not same_origin(request):
        return cross_site_refusal(request)
    user = _viewer(request)
    if user is None:
        return RedirectResponse(login_url(request), status_code=303)
    try:
        with tx(request) as session:
            notification_channels.send_test(session, user)
    except GpuleaseError as exc:
        return _page(request, user, error=exc.message, status_code=exc.status)
    request.app.state.wake_reconcilers()
    return RedirectResponse(f"{PATH}?done=tested", status_code=303)
