"""The console's support pages: your tickets (an admin: everyone's), a new ticket from an
instance or run page, and a ticket's thread where both sides reply."""

from __future__ import annotations

from typing import Annotated

from fastapi import Form, Response
from sqlalchemy.orm import Session

from gpulease.core.errors import GpuleaseError, NotFound
from gpulease.schemas.support import SupportTicketDetail
from gpulease.server.orm import Run, User
from gpulease.server.routers.ui.forms import FormBody
from gpulease.server.routers.ui.guards import ConsolePage, FormViewer, PageViewer, console_router
from gpulease.server.services import runs, support
from gpulease.server.services.instances.lifecycle import get_instance

router = console_router()

FormText = Annotated[str, Form()]


class TicketForm(FormBody):
    """A new ticket: about an instance (its name or id) or a run of yours; attach_log is
    "on" when the run's log goes with it."""

    subject: str = ""
    body: str = ""
    instance: str = ""
    run: str = ""
    attach_log: str = ""


def _about(session: Session, user: User, form: TicketForm) -> str:
    """What the ticket is about, for people ("instance cats", "run #12 (python train.py) on
    cats"); NotFound for what is not the user's."""
    parts = []
    if form.run:
        if not form.run.isdigit():
            raise NotFound(f"there is no run {form.run[:40]!r}; run ids are numbers")
        run: Run = runs.get_run(session, user, int(form.run))
        command = " ".join(run.command.split())
        parts.append(f"run #{run.id} ({command[:60]}) on {run.instance.name}")
    elif form.instance:
        parts.append(f"instance {get_instance(session, user, form.instance).name}")
    return ", ".join(parts)


@router.get("/support")
def tickets_page(console: PageViewer) -> Response:
    session, user = console.session, console.user
    tickets = [support.ticket_public(session, t) for t in support.list_tickets(session, user)]
    context = {"tickets": tickets, "is_admin": support.is_admin(user)}
    return console.render("support/list.html", context, page="support")


def _new_page(
    console: ConsolePage, form: TicketForm, about: str, refusal: GpuleaseError | None = None
) -> Response:
    context = {"form": form, "about": about, "max_body": support.MAX_BODY}
    return console.form_page("support/new.html", context, refusal, page="support")


@router.get("/support/new")
def new_ticket_page(console: PageViewer, instance: str = "", run: str = "") -> Response:
    form = TicketForm(instance=instance.strip()[:64], run=run.strip()[:20], attach_log="on")
    try:
        about = _about(console.session, console.user, form)
    except NotFound as exc:
        return console.refused(exc, "Ticket not found")
    return _new_page(console, form, about)


@router.post("/support/new")
def open_ticket(console: FormViewer, posted: Annotated[TicketForm, Form()]) -> Response:
    form = posted.model_copy(
        update={"instance": posted.instance.strip(), "run": posted.run.strip()}
    )
    about = ""

    def act() -> str:
        nonlocal about
        about = _about(console.session, console.user, form)
        ticket = support.open_ticket(
            console.session,
            console.user,
            form.subject,
            form.body,
            instance_ref=form.instance or None,
            run_id=int(form.run) if form.run else None,
            attach_log=form.attach_log == "on" and bool(form.run),
        )
        return f"/support/{ticket.id}"

    return console.act(act, lambda exc: _new_page(console, form, about, exc))


def _ticket_page(
    console: ConsolePage,
    ticket: SupportTicketDetail,
    refusal: GpuleaseError | None = None,
    *,
    reply: str = "",
) -> Response:
    context = {
        "ticket": ticket,
        "reply": reply,
        "is_admin": support.is_admin(console.user),
        "is_owner": ticket.owner == console.user.name,
    }
    return console.form_page("support/ticket.html", context, refusal, page="support")


def _ticket_id(text: str) -> int:
    if not text.isdigit() or len(text) > 12:
        raise NotFound(f"there is no support ticket {text[:40]!r}; ticket ids are numbers")
    return int(text)


def _ticket_refused(console: ConsolePage, exc: GpuleaseError) -> Response:
    return console.refused(exc, "Ticket not found" if isinstance(exc, NotFound) else "Not changed")


@router.get("/support/{ref}")
def ticket_page(ref: str, console: PageViewer) -> Response:
    try:
        ticket = support.get_ticket(console.session, console.user, _ticket_id(ref))
    except NotFound as exc:
        return _ticket_refused(console, exc)
    return _ticket_page(console, support.ticket_detail(console.session, ticket))


@router.post("/support/{ref}/reply")
def reply(ref: str, console: FormViewer, body: FormText = "") -> Response:
    try:
        ticket_id = _ticket_id(ref)
        ticket = support.get_ticket(console.session, console.user, ticket_id)
    except NotFound as exc:
        return _ticket_refused(console, exc)

    def act() -> str:
        support.add_message(console.session, console.user, ticket_id, body)
        return f"/support/{ticket_id}#latest"

    def refused(exc: GpuleaseError) -> Response:
        detail = support.ticket_detail(console.session, ticket)
        return _ticket_page(console, detail, exc, reply=body)

    return console.act(act, refused)


@router.post("/support/{ref}/close")
def close(ref: str, console: FormViewer) -> Response:
    def act() -> str:
        return f"/support/{support.close_ticket(console.session, console.user, _ticket_id(ref)).id}"

    return console.act(act, lambda exc: _ticket_refused(console, exc))
