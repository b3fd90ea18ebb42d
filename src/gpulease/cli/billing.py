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
    print_json,
    show_fields,
    show_rows,
    symbol_of,
    when,
)
from gpulease.core.money import format_credits
from gpulease.schemas.ledger import GrantCreate


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
    with logged_in_client() as client:
        found = client.billing.usage()
        if output is OutputFormat.json:
            print_json(found)
            return
        names = {i.id: i.name for i in client.instances.list(include_released=True)}
        wallet = client.billing.balance()
    symbol = symbol_of(wallet.balance, wallet.balance_micro)

    def money(micro: int) -> str:
        return format_credits(micro, symbol)

    show_rows(
        found.segments,
        ("INSTANCE", "GPU", "RATE/H", "STARTED", "ENDED", "BILLED", "CHARGED"),
        lambda s: (
            names.get(s.instance_id, s.instance_id),
            f"{s.gpu_model}:{s.gpu_count}" if s.gpu_count else s.gpu_model,
            money(s.hourly_micro),
            when(s.started_at),
            when(s.ended_at) if s.ended_at else "running",
            _duration(s.billed_seconds),
            money(s.charged_micro),
        ),
        empty="no GPU usage yet",
        title=f"usage, in {wallet.currency}",
    )
    show_rows(
        found.ledger,
        ("TIME", "KIND", "AMOUNT", "INSTANCE", "MEMO"),
        lambda line: (
            when(line.created_at),
            line.kind,
            money(line.amount_micro),
            names.get(line.instance_id, line.instance_id) if line.instance_id else None,
            line.memo,
        ),
        empty="no ledger entries yet",
        title=f"ledger, in {wallet.currency}",
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
