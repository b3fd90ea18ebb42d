"""Notifications: the list, read marks, and where they are sent (webhook, email)."""

from __future__ import annotations

from gpulease.client.base import Resource
from gpulease.schemas.notifications import (
    NotificationChannelsPublic,
    NotificationChannelsUpdate,
    NotificationPublic,
)


class NotificationsAPI(Resource):
    """`client.notifications`."""

    def list(self) -> list[NotificationPublic]:
        return self._api.many(NotificationPublic, "/notifications")

    def mark_read(self, notification_id: int) -> NotificationPublic:
        path = f"/notifications/{int(notification_id)}/read"
        return self._api.one(NotificationPublic, "POST", path)

    def channels(self) -> NotificationChannelsPublic:
        return self._api.one(NotificationChannelsPublic, "GET", "/notifications/channels")

    def set_channels(self, body: NotificationChannelsUpdate) -> NotificationChannelsPublic:
        """Change only the fields set in `body`; the answer has webhook_secret when one was
        made."""
        path = "/notifications/channels"
        return self._api.one(NotificationChannelsPublic, "PUT", path, body=body)
