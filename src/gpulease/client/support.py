"""Support tickets: open, read, reply, close."""

from __future__ import annotations

from gpulease.client.base import Resource
from gpulease.schemas.support import (
    SupportReply,
    SupportTicketCreate,
    SupportTicketDetail,
    SupportTicketPublic,
)


class SupportAPI(Resource):
    """`client.support`."""

    def open(self, body: SupportTicketCreate) -> SupportTicketDetail:
        """A support ticket; attach_log adds the last 200 lines of run_id's log."""
        return self._api.one(SupportTicketDetail, "POST", "/support/tickets", body=body)

    def list(self) -> list[SupportTicketPublic]:
        """Your tickets (an admin: everyone's), latest activity first."""
        return self._api.many(SupportTicketPublic, "/support/tickets")

    def get(self, ticket_id: int) -> SupportTicketDetail:
        return self._api.one(SupportTicketDetail, "GET", f"/support/tickets/{int(ticket_id)}")

    def reply(self, ticket_id: int, body: SupportReply) -> SupportTicketDetail:
        path = f"/support/tickets/{int(ticket_id)}/messages"
        return self._api.one(SupportTicketDetail, "POST", path, body=body)

    def close(self, ticket_id: int) -> SupportTicketDetail:
        path = f"/support/tickets/{int(ticket_id)}/close"
        return self._api.one(SupportTicketDetail, "POST", path)
