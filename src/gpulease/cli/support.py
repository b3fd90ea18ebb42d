"""Support ticket commands: open one (about an instance or run, with its log), list, show,
reply, close."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpulease.cli.connection import fetch, logged_in_client
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    console,
    emit,
    emit_rows,
    fail,
    note,
    show_fields,
    when,
)
from gpulease.schemas.support import SupportReply, SupportTicketCreate, SupportTicketDetail

ticket_app = typer.Typer(
    help="Support tickets: ask the operators for help, read and answer their replies.",
    no_args_is_help=True,
)

TicketArgument = Annotated[int, typer.Argument(metavar="ID", help="ticket number")]
MessageOption = Annotated[
    str | None,
    typer.Option("--message", "-m", help="the message; without it, read from standard input"),
]


def _text(message: str | None) -> str:
    if message is not None:
        return message
    if sys.stdin.isatty():
        fail("give the message with -m TEXT (or pipe it in)", 2)
    return sys.stdin.read()


def _show(ticket: SupportTicketDetail) -> None:
    about = ", ".join(
        part
        for part in (
            f"run {ticket.run_id}" if ticket.run_id else "",
            f"instance {ticket.instance}" if ticket.instance else "",
        )
        if part
    )
    show_fields(
        [
            ("ticket", f"#{ticket.id} {ticket.subject}"),
            ("status", ticket.status),
            ("from", ticket.owner),
            ("about", about),
            ("opened", when(ticket.created_at)),
        ]
    )
    out = console()
    for m in ticket.messages:
        out.print()
        who = f"{m.author} (support)" if m.author_is_admin else m.author
        out.print(f"[bold]{who}[/bold] [dim]{when(m.created_at)}[/dim]", highlight=False)
        out.print(m.body, markup=False, highlight=False)
        if m.log_excerpt:
            out.print(f"[dim]--- attached log, last lines of run {ticket.run_id} ---[/dim]")
            out.print(m.log_excerpt, markup=False, highlight=False)
            out.print("[dim]--- end of log ---[/dim]")


@ticket_app.command("open")
def open_(
    subject: Annotated[str, typer.Option("--subject", "-s", help="one line: what is wrong")],
    message: MessageOption = None,
    instance: Annotated[
        str | None, typer.Option("--instance", "-i", help="the instance it is about")
    ] = None,
    run: Annotated[int | None, typer.Option("--run", "-r", help="the run it is about")] = None,
    attach_log: Annotated[
        bool, typer.Option("--attach-log", help="attach the run's last 200 log lines")
    ] = False,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Open a ticket; support answers in the console and you are notified."""
    with logged_in_client() as client:
        ticket = client.support.open(
            SupportTicketCreate(
                subject=subject,
                body=_text(message),
                instance=instance,
                run_id=run,
                attach_log=attach_log,
            )
        )
    emit(
        ticket,
        output,
        lambda ticket: note(
            f"opened ticket #{ticket.id}; see replies with `gpulease ticket show {ticket.id}`"
        ),
    )


@ticket_app.command("list")
def list_(output: OutputOption = OutputFormat.table) -> None:
    """Your tickets (an admin: everyone's), latest activity first."""
    emit_rows(
        fetch(lambda client: client.support.list()),
        output,
        ("ID", "SUBJECT", "FROM", "STATUS", "RUN", "INSTANCE", "UPDATED"),
        lambda t: (t.id, t.subject, t.owner, t.status, t.run_id, t.instance, when(t.updated_at)),
        empty="no tickets; open one with `gpulease ticket open -s SUBJECT -m TEXT`",
    )


@ticket_app.command("show")
def show(ticket_id: TicketArgument, output: OutputOption = OutputFormat.table) -> None:
    """A ticket and its messages."""
    emit(fetch(lambda client: client.support.get(ticket_id)), output, _show)


@ticket_app.command("reply")
def reply(
    ticket_id: TicketArgument,
    message: MessageOption = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Add a message (an admin's answers the ticket; the owner's reopens it)."""
    emit(
        fetch(lambda client: client.support.reply(ticket_id, SupportReply(body=_text(message)))),
        output,
        lambda ticket: note(f"ticket #{ticket.id} is {ticket.status}"),
    )


@ticket_app.command("close")
def close(ticket_id: TicketArgument) -> None:
    """Close a ticket (a reply opens it again)."""
    with logged_in_client() as client:
        ticket = client.support.close(ticket_id)
    note(f"ticket #{ticket.id} closed")
