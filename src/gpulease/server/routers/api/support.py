"""Support tickets: open one (about an instance or run), list, read, reply, close."""

from __future__ import annotations

from fastapi import APIRouter

from gpulease.schemas.support import (
    SupportReply,
    SupportTicketCreate,
    SupportTicketDetail,
    SupportTicketPublic,
)
from gpulease.server.routers.deps import CurrentUser, IdPath, SessionDep
from gpulease.server.services import support

router = APIRouter(tags=["support"])


@router.post("/support/tickets", status_code=201)
def open_ticket(
    body: SupportTicketCreate, session: SessionDep, user: CurrentUser
) -> SupportTicketDetail:
    ticket = support.open_ticket(
        session,
        user,
        body.subject,
        body.body,
        instance_ref=body.instance,
        run_id=body.run_id,
        attach_log=body.attach_log,
    )
    return support.ticket_detail(session, ticket)


@router.get("/support/tickets")
def list_tickets(session: SessionDep, user: CurrentUser) -> list[SupportTicketPublic]:
    """Your tickets; an admin gets everyone's."""
    return [support.ticket_public(session, t) for t in support.list_tickets(session, user)]


@router.get("/support/tickets/{ticket_id}")
def show_ticket(ticket_id: IdPath, session: SessionDep, user: CurrentUser) -> SupportTicketDetail:
    return support.ticket_detail(session, support.get_ticket(session, user, ticket_id))


@router.post("/support/tickets/{ticket_id}/messages", status_code=201)
def reply(
    ticket_id: IdPath, body: SupportReply, session: SessionDep, user: CurrentUser
) -> SupportTicketDetail:
    support.add_message(session, user, ticket_id, body.body)
    return support.ticket_detail(session, support.get_ticket(session, user, ticket_id))


@router.post("/support/tickets/{ticket_id}/close")
def close(ticket_id: IdPath, session: SessionDep, user: CurrentUser) -> SupportTicketDetail:
    return support.ticket_detail(session, support.close_ticket(session, user, ticket_id))
