"""Money commands: balance, usage, and the operator's credit grants and user list."""

from __future__ import annotations

from typing import Annotated

import typer

from gpulease.cli.connection import fetch, logged_in_client
from gpulease.cli.output import (
    OutputFormat,
    OutputOption,
    console,
    emit,
    emit_rows,
    show_fields,
    show_rows,
    when,
)
from gpulease.core.money import format_credits
from gpulease.schemas.ledger import GrantCreate, Usage


def balance(output: OutputOption = OutputFormat.table) -> None:
    """Your credit, in money and in NCU (1 NCU = one A100 for 24 hours)."""
    emit(
        fetch(lambda client: client.billing.balance()),
        output,
        lambda found: show_fields(
            [("balance", f"{found.balance} {found.currency}"), ("ncu", found.ncu)]
        ),
    )


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def usage(output: OutputOption = OutputFormat.table) -> None:
    """What you were billed: GPU usage segments, then every ledger line."""
    emit(fetch(lambda client: client.billing.usage()), output, _show_usage)


def _show_usage(found: Usage) -> None:
    show_rows(
        found.segments,
        ("INSTANCE", "GPU", "RATE/H", "STARTED", "ENDED", "BILLED", "CHARGED"),
        lambda s: (
            s.instance_id,
            f"{s.gpu_model}:{s.gpu_count}" if s.gpu_count else s.gpu_model,
            format_credits(s.hourly_micro, ""),
            when(s.started_at),
            when(s.ended_at) if s.ended_at else "running",
            _duration(s.billed_seconds),
            format_credits(s.charged_micro, ""),
        ),
        empty="no GPU usage yet",
        title="usage",
    )
    show_rows(
        found.ledger,
        ("TIME", "KIND", "AMOUNT", "INSTANCE", "MEMO"),
        lambda line: (when(line.created_at), line.kind, line.amount, line.instance_id, line.memo),
        empty="no ledger entries yet",
        title="ledger",
    )


admin_app = typer.Typer(help="Operator commands (admin accounts only).", no_args_is_help=True)


@admin_app.command("grant")
def grant(
    user: Annotated[str, typer.Argument(help="account name")],
    amount: Annotated[str, typer.Argument(help="credits, e.g. 25.00")],
    memo: Annotated[str, typer.Option("--memo", help="shown in the user's ledger")] = (
        "admin grant"
    ),
    output: OutputOption = OutputFormat.table,
) -> None:
    """Give a user credit."""
    with logged_in_client() as client:
        line = client.admin.grant(GrantCreate(user=user, amount=amount, memo=memo))
    emit(
        line,
        output,
        lambda line: console().print(
            f"granted {line.amount} to {user} (ledger entry {line.id})", markup=False
        ),
    )


@admin_app.command("users")
def users(output: OutputOption = OutputFormat.table) -> None:
    """All accounts on this server."""
    emit_rows(
        fetch(lambda client: client.admin.users()),
        output,
        ("ID", "NAME", "ROLE", "CREATED"),
        lambda u: (u.id, u.name, u.role, when(u.created_at)),
        empty="no users",
    )
