"""Wire models for notifications and notification channels."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from gpulease.schemas.base import Model


class NotificationPublic(Model):
    id: int
    kind: str
    message: str
    created_at: datetime
    read_at: datetime | None = None


class WebhookChannelPublic(BaseModel):
    url: str
    enabled: bool
    # None: every category of notification.
    kinds: list[str] | None
    # The last characters of the signing secret, to tell which one is in use.
    secret_hint: str


class EmailChannelPublic(BaseModel):
    address: str
    enabled: bool
    kinds: list[str] | None


class NotificationChannelsPublic(BaseModel):
    webhook: WebhookChannelPublic | None
    email: EmailChannelPublic | None
    # False when the server has no SMTP configured: email cannot be turned on.
    email_available: bool
    categories: list[str]
    # Shown once: set only in the answer that made or rotated the webhook's secret.
    webhook_secret: str | None = None


class NotificationChannelsUpdate(BaseModel):
    """Only the fields given change. An empty or null webhook_url or email removes it."""

    webhook_url: str | None = Field(default=None, max_length=2000)
    webhook_enabled: bool | None = None
    webhook_kinds: list[str] | None = None
    rotate_secret: bool = False
    email: str | None = Field(default=None, max_length=254)
    email_enabled: bool | None = None
    email_kinds: list[str] | None = None
