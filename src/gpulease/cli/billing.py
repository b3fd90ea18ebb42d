"""Money commands: balance, usage (the bill), and the operator's credit grants and user list."""

from __future__ import annotations

from datetime import date
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
from gpulease.cli.statements import FromOption, ToOption, TzOption
from gpulease.core.money import format_credits
from gpulease.schemas.bill import BillLinePublic
from gpulease.schemas.ledger import Balance, GrantCreate


def balance(output: OutputOption = OutputFormat.table) -> None:
    """Your credit, in money and in NCU (1 NCU = one A100 for 24 hours)."""
    emit(
        fetch(lambda client: client.billing.balance()),
        output,
        lambda found: show_fields(
            [("balance", f"{found.balance} {found.currency}"), ("ncu", found.ncu)]
        ),
    )


def usage(
    start: FromOption = None,
    end: ToOption = None,
    tz: TzOption = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """What you were billed, as the Billing page's bill: one line per instance session and
    day ("box: A100-80GB × 1, on demand, 2 h 14 min"), grants and vouchers, newest first.

    The period runs from --from to --to (default: this month). -o json prints, as before,
    the usage segments and every ledger line (GET /api/v1/usage), and the period's bill
    lines under "bill".
    """
    with logged_in_client() as client:
        lines = client.billing.bill(start, end, tz=tz)
        if output is OutputFormat.json:
            found = client.billing.usage().model_dump(mode="json")
            print_json({**found, "bill": [line.model_dump(mode="json") for line in lines]})
            return
        wallet = client.billing.balance()
    _show_bill(lines, wallet, bool(start or end))


def _show_bill(lines: list[BillLinePublic], wallet: Balance, dated: bool) -> None:
    period = "in this period" if dated else "this month"
    shown: list[date] = []

    def cells(line: BillLinePublic) -> tuple[object, ...]:
        first_of_day = not shown or shown[-1] != line.day
        shown.append(line.day)
        return (line.day if first_of_day else "", line.text, line.amount)

    show_rows(
        lines,
        ("DAY", "WHAT", "AMOUNT"),
        cells,
        title=f"bill {period}, in {wallet.currency}",
        empty=f"nothing billed or credited {period}",
    )
    symbol = symbol_of(wallet.balance, wallet.balance_micro)
    charged = sum(-line.amount_micro for line in lines if line.amount_micro < 0)
    credited = sum(line.amount_micro for line in lines if line.amount_micro > 0)
    console().print(
        f"charged {format_credits(charged, symbol)}, credited {format_credits(credited, symbol)}"
        f" {period}; balance now {wallet.balance} {wallet.currency}",
        markup=False,
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
