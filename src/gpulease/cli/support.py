"""Support ticket commands: open one (about an instance or run, with its log), list, show,
reply, close."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpulease.cli import output as out
from gpulease.cli.connection import fetch, logged_in_client
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
        out.fail("give the message with -m TEXT (or pipe it in)", 2)
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
    out.show_fields(
        [
            ("ticket", f"#{ticket.id} {ticket.subject}"),
            ("status", ticket.status),
            ("from", ticket.owner),
            ("about", about),
            ("opened", out.when(ticket.created_at)),
        ]
    )
    screen = out.console()
    for m in ticket.messages:
        screen.print()
        who = f"{m.author} (support)" if m.author_is_admin else m.author
        screen.print(f"[bold]{who}[/bold] [dim]{out.when(m.created_at)}[/dim]", highlight=False)
        screen.print(m.body, markup=False, highlight=False)
        if m.log_excerpt:
            screen.print(f"[dim]--- attached log, last lines of run {ticket.run_id} ---[/dim]")
            screen.print(m.log_excerpt, markup=False, highlight=False)
            screen.print("[dim]--- end of log ---[/dim]")


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
    output: out.OutputOption = out.OutputFormat.table,
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
    out.emit(
        ticket,
        output,
        lambda ticket: out.note(
            f"opened ticket #{ticket.id}; see replies with `gpulease ticket show {ticket.id}`"
        ),
    )


@ticket_app.command("list")
def list_(output: out.OutputOption = out.OutputFormat.table) -> None:
    """Your tickets (an admin: everyone's), latest activity first."""
    out.emit_rows(
        fetch(lambda client: client.support.list()),
        output,
        ("ID", "SUBJECT", "FROM", "STATUS", "RUN", "INSTANCE", "UPDATED"),
        lambda t: (
            t.id,
            t.subject,
            t.owner,
            t.status,
            t.run_id,
            t.instance,
            out.when(t.updated_at),
        ),
        empty="no tickets; open one with `gpulease ticket open -s SUBJECT -m TEXT`",
    )


@ticket_app.command("show")
def show(ticket_id: TicketArgument, output: out.OutputOption = out.OutputFormat.table) -> None:
    """A ticket and its messages."""
    out.emit(fetch(lambda client: client.support.get(ticket_id)), output, _show)


@ticket_app.command("reply")
def reply(
    ticket_id: TicketArgument,
    message: MessageOption = None,
    output: out.OutputOption = out.OutputFormat.table,
) -> None:
    """Add a message (an admin's answers the ticket; the owner's reopens it)."""
    out.emit(
        fetch(lambda client: client.support.reply(ticket_id, SupportReply(body=_text(message)))),
        output,
        lambda ticket: out.note(f"ticket #{ticket.id} is {ticket.status}"),
    )


@ticket_app.command("close")
def close(ticket_id: TicketArgument) -> None:
    """Close a ticket (a reply opens it again)."""
    with logged_in_client() as client:
        ticket = client.support.close(ticket_id)
    out.note(f"ticket #{ticket.id} closed")
