"""Plans and their rules, vouchers, spending caps, teams and off-peak windows."""

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
    symbol_of,
    when,
)
from gpulease.client import GpuleaseClient
from gpulease.core.money import format_cap
from gpulease.schemas.billing import (
    AdminLimitsUpdate,
    LimitsPublic,
    LimitsUpdate,
    OffPeakCreate,
    TeamCreate,
    TeamMemberUpdate,
    TeamPublic,
    VoucherCreate,
    VoucherRedeem,
)
from gpulease.schemas.ledger import GrantCreate


def _money(micro: int | None, symbol: str) -> str:
    return format_cap(micro, symbol, 4, unset="-")


def _symbol(client: GpuleaseClient) -> str:
    """The server's currency symbol, as its answers write amounts."""
    wallet = client.billing.balance()
    return symbol_of(wallet.balance, wallet.balance_micro)


def plans(
    gpu: Annotated[str, typer.Argument(help="MODEL:COUNT, e.g. A100-80GB:2")],
    output: OutputOption = OutputFormat.table,
) -> None:
    """Prices of each plan for a GPU request, and the rules you accept by choosing one."""
    emit_rows(
        fetch(lambda client: client.billing.plans(gpu)),
        output,
        ("PLAN", "PER HOUR", "NCU/H", "BLOCK", "RULES"),
        lambda q: (
            q.plan,
            q.hourly,
            q.hourly_ncu,
            _money(q.block_micro, symbol_of(q.hourly, q.hourly_micro)),
            q.rules,
        ),
        empty="no plans",
    )


def offpeak(output: OutputOption = OutputFormat.table) -> None:
    """Off-peak windows: when GPUs cost less."""
    emit_rows(
        fetch(lambda client: client.billing.offpeak()),
        output,
        ("ID", "DAYS", "FROM", "TO", "DISCOUNT", "ZONE"),
        lambda w: (w.id, ",".join(w.weekdays), w.start, w.end, f"{w.discount_percent}%", w.tz),
        empty="no off-peak windows on this server",
    )


voucher_app = typer.Typer(help="Redeem credit vouchers.", no_args_is_help=True)


@voucher_app.command("redeem")
def redeem(code: Annotated[str, typer.Argument(help="the voucher code")]) -> None:
    """Add a voucher's credit to your wallet."""
    with logged_in_client() as client:
        found = client.billing.redeem(VoucherRedeem(code=code))
    console().print(f"redeemed; your balance is {found.balance} {found.currency}", markup=False)


limits_app = typer.Typer(help="Your spending caps and low-balance warning.", no_args_is_help=True)


def _show_limits(found: LimitsPublic, symbol: str, output: OutputFormat) -> None:
    emit(
        found,
        output,
        lambda found: show_fields(
            [
                ("max hourly spend", _money(found.effective_max_hourly_micro, symbol)),
                ("  set by you", _money(found.max_hourly_micro, symbol)),
                ("  admin ceiling", _money(found.admin_max_hourly_micro, symbol)),
                ("monthly budget", _money(found.effective_monthly_budget_micro, symbol)),
                ("  set by you", _money(found.monthly_budget_micro, symbol)),
                ("  admin ceiling", _money(found.admin_monthly_budget_micro, symbol)),
                ("low-balance warning", _money(found.low_balance_micro, symbol)),
                ("spending now, per hour", _money(found.hourly_spend_micro, symbol)),
                ("spent this month", _money(found.month_spend_micro, symbol)),
            ]
        ),
    )


@limits_app.command("show")
def show_limits(output: OutputOption = OutputFormat.table) -> None:
    """Your caps and what you spend against them."""
    with logged_in_client() as client:
        _show_limits(client.billing.limits(), _symbol(client), output)


@limits_app.command("set")
def set_limits(
    max_hourly: Annotated[
        str | None, typer.Option("--max-hourly", help="most you may spend per hour")
    ] = None,
    monthly_budget: Annotated[
        str | None, typer.Option("--monthly-budget", help="most you may spend a month")
    ] = None,
    low_balance: Annotated[
        str | None, typer.Option("--low-balance", help="warn when the balance falls below")
    ] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Set your caps (leave an option out to remove that cap)."""
    with logged_in_client() as client:
        _show_limits(
            client.billing.set_limits(
                LimitsUpdate(
                    max_hourly=max_hourly, monthly_budget=monthly_budget, low_balance=low_balance
                )
            ),
            _symbol(client),
            output,
        )


team_app = typer.Typer(help="Teams: a shared wallet and its members.", no_args_is_help=True)


def _print_team(team: TeamPublic) -> None:
    symbol = symbol_of(team.balance, team.balance_micro)
    console().print(f"team {team.name} (owner {team.owner}), balance {team.balance}", markup=False)
    show_rows(
        team.members,
        ("MEMBER", "MONTHLY LIMIT", "SPENT THIS MONTH"),
        lambda m: (
            m.user,
            _money(m.monthly_limit_micro, symbol),
            _money(m.month_spend_micro, symbol),
        ),
        empty="no members",
    )


@team_app.command("create")
def create_team(name: str, output: OutputOption = OutputFormat.table) -> None:
    """Create a team; you own it and its wallet."""
    emit(fetch(lambda client: client.teams.create(TeamCreate(name=name))), output, _print_team)


@team_app.command("ls")
def list_teams(output: OutputOption = OutputFormat.table) -> None:
    """Teams you belong to."""
    emit_rows(
        fetch(lambda client: client.teams.list()),
        output,
        ("TEAM", "OWNER", "BALANCE", "MEMBERS"),
        lambda t: (t.name, t.owner, t.balance, len(t.members)),
        empty="you are in no team",
    )


@team_app.command("show")
def show_team(name: str, output: OutputOption = OutputFormat.table) -> None:
    """A team's balance and each member's spending (owners see everyone)."""
    emit(fetch(lambda client: client.teams.get(name)), output, _print_team)


@team_app.command("add")
def add_member(
    team: str,
    user: str,
    monthly_limit: Annotated[
        str | None, typer.Option("--monthly-limit", help="most they may spend a month")
    ] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Add a member (or change their limit). Owners only."""
    emit(
        fetch(
            lambda client: client.teams.set_member(
                team, user, TeamMemberUpdate(monthly_limit=monthly_limit)
            )
        ),
        output,
        _print_team,
    )


@team_app.command("rm")
def remove_member(team: str, user: str) -> None:
    """Remove a member. Owners only."""
    with logged_in_client() as client:
        client.teams.remove_member(team, user)
    console().print(f"removed {user} from {team}", markup=False)


# -- admin ---------------------------------------------------------------------------------


def admin_offpeak_add(
    start: Annotated[str, typer.Argument(help="HH:MM, operator's time zone")],
    end: Annotated[str, typer.Argument(help="HH:MM; before start = past midnight")],
    discount: Annotated[str, typer.Argument(help="percent off, e.g. 40")],
    days: Annotated[str, typer.Option("--days", help="mon-fri, sat,sun or all")] = "all",
    output: OutputOption = OutputFormat.table,
) -> None:
    """Add an off-peak window (segments opened from now on get its discount)."""
    with logged_in_client() as client:
        w = client.admin.add_offpeak(
            OffPeakCreate(weekdays=days, start=start, end=end, discount=discount)
        )
    emit(
        w,
        output,
        lambda w: console().print(
            f"window {w.id}: {','.join(w.weekdays)} {w.start}-{w.end} {w.tz}, "
            f"{w.discount_percent}% off",
            markup=False,
        ),
    )


def admin_offpeak_rm(window_id: int) -> None:
    """Remove an off-peak window."""
    with logged_in_client() as client:
        client.admin.remove_offpeak(window_id)
    console().print(f"removed window {window_id}", markup=False)


def admin_voucher_create(
    amount: Annotated[str, typer.Argument(help="credits, e.g. 25.00")],
    code: Annotated[str | None, typer.Option("--code", help="default: generated")] = None,
    expires: Annotated[
        str | None, typer.Option("--expires", help="ISO date/time, e.g. 2026-12-31T23:59Z")
    ] = None,
    uses: Annotated[int, typer.Option("--uses", help="how many redemptions in all")] = 1,
    per_user: Annotated[int, typer.Option("--per-user", help="redemptions per user")] = 1,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Issue a voucher."""
    with logged_in_client() as client:
        v = client.admin.create_voucher(
            VoucherCreate(
                amount=amount,
                code=code,
                expires_at=expires,
                max_redemptions=uses,
                per_user_limit=per_user,
            )
        )
    emit(
        v,
        output,
        lambda v: console().print(
            f"voucher {v.code}: {v.amount}, {v.max_redemptions} use(s)", markup=False
        ),
    )


def admin_voucher_ls(output: OutputOption = OutputFormat.table) -> None:
    """Issued vouchers and their use."""
    emit_rows(
        fetch(lambda client: client.admin.vouchers()),
        output,
        ("CODE", "AMOUNT", "USED", "EXPIRES"),
        lambda v: (v.code, v.amount, f"{v.used}/{v.max_redemptions}", when(v.expires_at)),
        empty="no vouchers",
    )


def admin_limits(
    user: str,
    max_hourly: Annotated[str | None, typer.Option("--max-hourly")] = None,
    monthly_budget: Annotated[str | None, typer.Option("--monthly-budget")] = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Set a user's ceilings (leave an option out to remove it)."""
    with logged_in_client() as client:
        _show_limits(
            client.admin.set_limits(
                user, AdminLimitsUpdate(max_hourly=max_hourly, monthly_budget=monthly_budget)
            ),
            _symbol(client),
            output,
        )


def admin_grant_team(
    team: str,
    amount: Annotated[str, typer.Argument(help="credits, e.g. 100.00")],
    memo: Annotated[str, typer.Option("--memo")] = "admin grant",
) -> None:
    """Give a team's wallet credit."""
    with logged_in_client() as client:
        line = client.admin.grant(GrantCreate(team=team, amount=amount, memo=memo))
    console().print(f"granted {line.amount} to team {team}", markup=False)
