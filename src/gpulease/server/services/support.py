"""Support tickets: a renter asks (about an instance or a run, with its recent log if they
choose), admins answer in the console; each side is notified of the other's messages."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import InvalidInput, NotFound
from gpulease.schemas.support import SupportMessagePublic, SupportTicketDetail, SupportTicketPublic
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, LogChunk, Run, SupportMessage, SupportTicket, User
from gpulease.server.services import notifications
from gpulease.server.services.instances.lifecycle import get_instance
from gpulease.server.services.rows import find_all

MAX_SUBJECT = 200
MAX_BODY = 10_000
LOG_LINES = 200
LOG_CHARS = 64_000
LOG_CHUNKS = 2_000
OPEN, ANSWERED, CLOSED = "open", "answered", "closed"


def is_admin(user: User) -> bool:
    return user.role == "admin"


def check_body(body: str) -> str:
    text = body.strip()
    if not text:
        raise InvalidInput("the message is empty; say what happened and what you expected")
    if len(text) > MAX_BODY:
        raise InvalidInput(
            f"the message is {len(text):,} characters; keep it under {MAX_BODY:,} "
            "(attach the run's log with attach_log instead of pasting it)"
        )
    return text


def log_excerpt(session: Session, run: Run, lines: int = LOG_LINES) -> str:
    """The run's last `lines` lines of output (stdout and stderr as they came)."""
    chunks = list(
        session.scalars(
            select(LogChunk.data)
            .where(LogChunk.run_id == run.id)
            .order_by(LogChunk.seq.desc())
            .limit(LOG_CHUNKS)
        )
    )
    text = "".join(reversed(chunks))
    tail = "\n".join(text.splitlines()[-lines:])
    return tail[-LOG_CHARS:]


def open_ticket(
    session: Session,
    owner: User,
    subject: str,
    body: str,
    *,
    instance_ref: str | None = None,
    run_id: int | None = None,
    attach_log: bool = False,
) -> SupportTicket:
    subject = " ".join(subject.split())
    if not subject:
        raise InvalidInput("give the ticket a subject, e.g. 'training run stuck at epoch 3'")
    if len(subject) > MAX_SUBJECT:
        raise InvalidInput(f"the subject is longer than {MAX_SUBJECT} characters; shorten it")
    text = check_body(body)
    instance: Instance | None = None
    run: Run | None = None
    if instance_ref is not None and instance_ref.strip():
        try:
            instance = get_instance(session, owner, instance_ref.strip())
        except NotFound as exc:
            raise InvalidInput(exc.message) from None
    if run_id is not None:
        run = session.get(Run, run_id)
        if run is None or run.owner_id != owner.id:
            raise InvalidInput(f"you have no run {run_id}; see `gpulease runs`")
        if instance is not None and run.instance_id != instance.id:
            raise InvalidInput(f"run {run_id} is not a run of instance {instance.name}")
        instance = instance or session.get(Instance, run.instance_id)
    if attach_log and run is None:
        raise InvalidInput("attach_log needs a run: give run_id (the log is that run's)")
    now = utcnow()
    ticket = SupportTicket(
        owner_id=owner.id,
        subject=subject,
        status=OPEN,
        instance_id=instance.id if instance else None,
        run_id=run.id if run else None,
        created_at=now,
        updated_at=now,
    )
    session.add(ticket)
    session.flush()
    session.add(
        SupportMessage(
            ticket_id=ticket.id,
            author_id=owner.id,
            body=text,
            log_excerpt=log_excerpt(session, run) if attach_log and run else None,
            created_at=now,
        )
    )
    notifications.notify_admins(
        session,
        "ticket_opened",
        f"{owner.name} opened support ticket #{ticket.id}: {subject}",
        except_id=owner.id,
    )
    session.flush()
    return ticket


def list_tickets(
    session: Session, user: User, *, include_closed: bool = True
) -> list[SupportTicket]:
    """The user's own tickets; an admin sees everyone's. Newest activity first."""
    query = select(SupportTicket).order_by(SupportTicket.updated_at.desc(), SupportTicket.id.desc())
    if not is_admin(user):
        query = query.where(SupportTicket.owner_id == user.id)
    if not include_closed:
        query = query.where(SupportTicket.status != CLOSED)
    return list(session.scalars(query.limit(500)))


def get_ticket(session: Session, user: User, ticket_id: int) -> SupportTicket:
    ticket = session.get(SupportTicket, ticket_id)
    if ticket is None or (ticket.owner_id != user.id and not is_admin(user)):
        raise NotFound(f"you have no support ticket {ticket_id}; see `gpulease ticket list`")
    return ticket


def messages(session: Session, ticket: SupportTicket) -> list[SupportMessage]:
    return find_all(session, SupportMessage, SupportMessage.ticket_id == ticket.id)


def add_message(session: Session, user: User, ticket_id: int, body: str) -> SupportMessage:
    """A reply. An admin's (on someone else's ticket) marks it answered and notifies the
    owner; the owner's reopens it and notifies the admins."""
    ticket = get_ticket(session, user, ticket_id)
    text = check_body(body)
    now = utcnow()
    message = SupportMessage(ticket_id=ticket.id, author_id=user.id, body=text, created_at=now)
    session.add(message)
    ticket.updated_at = now
    if user.id != ticket.owner_id:
        ticket.status, ticket.closed_at = ANSWERED, None
        notifications.notify(
            session,
            ticket.owner_id,
            "ticket_reply",
            f"support answered your ticket #{ticket.id} ({ticket.subject}): {_preview(text)}",
        )
    else:
        ticket.status, ticket.closed_at = OPEN, None
        notifications.notify_admins(
            session,
            "ticket_message",
            f"{user.name} wrote on ticket #{ticket.id} ({ticket.subject}): {_preview(text)}",
            except_id=user.id,
        )
    session.flush()
    return message


def close_ticket(session: Session, user: User, ticket_id: int) -> SupportTicket:
    ticket = get_ticket(session, user, ticket_id)
    if ticket.status != CLOSED:
        now = utcnow()
        ticket.status, ticket.closed_at, ticket.updated_at = CLOSED, now, now
        if user.id != ticket.owner_id:
            notifications.notify(
                session,
                ticket.owner_id,
                "ticket_reply",
                f"support closed your ticket #{ticket.id} ({ticket.subject})",
            )
    return ticket


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 200 else flat[:197] + "..."


def ticket_public(session: Session, ticket: SupportTicket) -> SupportTicketPublic:
    instance = session.get(Instance, ticket.instance_id) if ticket.instance_id else None
    return SupportTicketPublic(
        id=ticket.id,
        owner=ticket.owner.name,
        subject=ticket.subject,
        status=ticket.status,
        instance=instance.name if instance else None,
        run_id=ticket.run_id,
        created_at=ticket.created_at,
        updated_at=ticket.updated_at,
        closed_at=ticket.closed_at,
    )


def ticket_detail(session: Session, ticket: SupportTicket) -> SupportTicketDetail:
    return SupportTicketDetail(
        **ticket_public(session, ticket).model_dump(),
        messages=[
            SupportMessagePublic(
                id=m.id,
                author=m.author.name,
                author_is_admin=is_admin(m.author),
                body=m.body,
                log_excerpt=m.log_excerpt,
                created_at=m.created_at,
            )
            for m in messages(session, ticket)
        ],
    )
