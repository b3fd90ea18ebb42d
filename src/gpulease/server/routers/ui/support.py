"""The console's support pages: your tickets (an admin: everyone's), a new ticket from an
instance or run page, and a ticket's thread where both sides reply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from gpulease.core.errors import GpuleaseError, NotFound
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.support import SupportTicketDetail
from gpulease.server.orm import Run, User
from gpulease.server.routers.deps import same_origin, tx
from gpulease.server.routers.ui.account import cross_site_refusal
from gpulease.server.routers.ui.guards import login_url, viewer
from gpulease.server.routers.ui.templating import render
from gpulease.server.services import runs, support
from gpulease.server.services.instances.lifecycle import get_instance

router = APIRouter()

FormText = Annotated[str, Form()]


@dataclass
class TicketForm:
    subject: str = ""
    body: str = ""
    instance: str = ""
    run: str = ""
    attach_log: bool = True
    # What the ticket is about, for people: "instance cats", "run #12 (python train.py)".
    about: str = ""


def _public(user: User) -> UserPublic:
    return UserPublic.model_validate(user)


def _not_found(request: Request, user: User, message: str) -> Response:
    context = {"title": "Ticket not found", "message": message}
    return render(request, "errors/error.html", context, user=_public(user), status_code=404)


def _about(session: Session, user: User, form: TicketForm) -> str:
    """Describe the instance / run the form is about; NotFound for what is not the user's."""
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
def tickets_page(request: Request) -> Response:
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        tickets = [support.ticket_public(session, t) for t in support.list_tickets(session, user)]
        context = {"tickets": tickets, "is_admin": support.is_admin(user)}
        return render(request, "support/list.html", context, user=_public(user), page="support")


def _new_page(
    request: Request, user: User, form: TicketForm, *, error: str = "", status_code: int = 200
) -> Response:
    context = {"form": form, "error": error, "max_body": support.MAX_BODY}
    return render(
        request,
        "support/new.html",
        context,
        user=_public(user),
        page="support",
        status_code=status_code,
    )


@router.get("/support/new")
def new_ticket_page(request: Request, instance: str = "", run: str = "") -> Response:
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        form = TicketForm(instance=instance.strip()[:64], run=run.strip()[:20])
        try:
            form.about = _about(session, user, form)
        except NotFound as exc:
            return _not_found(request, user, exc.message)
        return _new_page(request, user, form)


@router.post("/support/new")
def open_ticket(
    request: Request,
    subject: FormText = "",
    body: FormText = "",
    instance: FormText = "",
    run: FormText = "",
    attach_log: FormText = "",
) -> Response:
    if not same_origin(request):
        return cross_site_refusal(request)
    form = TicketForm(subject, body, instance.strip(), run.strip(), attach_log == "on")
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        try:
            with session.begin_nested():
                form.about = _about(session, user, form)
                ticket = support.open_ticket(
                    session,
                    user,
                    subject,
                    body,
                    instance_ref=form.instance or None,
                    run_id=int(form.run) if form.run else None,
                    attach_log=form.attach_log and bool(form.run),
                )
        except GpuleaseError as exc:
            return _new_page(request, user, form, error=exc.message, status_code=exc.status)
        return RedirectResponse(f"/support/{ticket.id}", status_code=303)


def _ticket_page(
    request: Request,
    user: User,
    ticket: SupportTicketDetail,
    *,
    reply: str = "",
    error: str = "",
    status_code: int = 200,
) -> Response:
    context = {
        "ticket": ticket,
        "reply": reply,
        "error": error,
        "is_admin": support.is_admin(user),
        "is_owner": ticket.owner == user.name,
    }
    return render(
        request,
        "support/ticket.html",
        context,
        user=_public(user),
        page="support",
        status_code=status_code,
    )


def _ticket_id(text: str) -> int:
    if not text.isdigit() or len(text) > 12:
        raise NotFound(f"there is no support ticket {text[:40]!r}; ticket ids are numbers")
    return int(text)


@router.get("/support/{ref}")
def ticket_page(ref: str, request: Request) -> Response:
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        try:
            ticket = support.get_ticket(session, user, _ticket_id(ref))
        except NotFound as exc:
            return _not_found(request, user, exc.message)
        return _ticket_page(request, user, support.ticket_detail(session, ticket))


@router.post("/support/{ref}/reply")
def reply(ref: str, request: Request, body: FormText = "") -> Response:
    if not same_origin(request):
        return cross_site_refusal(request)
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        try:
            ticket_id = _ticket_id(ref)
            ticket = support.get_ticket(session, user, ticket_id)
        except NotFound as exc:
            return _not_found(request, user, exc.message)
        try:
            with session.begin_nested():
                support.add_message(session, user, ticket_id, body)
        except GpuleaseError as exc:
            detail = support.ticket_detail(session, ticket)
            return _ticket_page(
                request, user, detail, reply=body, error=exc.message, status_code=exc.status
            )
        return RedirectResponse(f"/support/{ticket_id}#latest", status_code=303)


@router.post("/support/{ref}/close")
def close(ref: str, request: Request) -> Response:
    if not same_origin(request):
        return cross_site_refusal(request)
    with tx(request) as session:
        user = viewer(session, request)
        if user is None:
            return RedirectResponse(login_url(request), status_code=303)
        try:
            ticket = support.close_ticket(session, user, _ticket_id(ref))
        except NotFound as exc:
            return _not_found(request, user, exc.message)
        return RedirectResponse(f"/support/{ticket.id}", status_code=303)
