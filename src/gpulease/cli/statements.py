"""`gpulease statement` and `gpulease admin revenue`: usage and revenue for a period."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, NamedTuple, TypeVar

import typer

from gpulease.cli.connection import logged_in_client
from gpulease.cli.output import OutputFormat, console, emit, show_fields, show_rows
from gpulease.client import GpuleaseClient
from gpulease.core.money import format_credits
from gpulease.schemas.statements import RevenuePublic, StatementPublic

M = TypeVar("M", StatementPublic, RevenuePublic)


class Period(NamedTuple):
    """The days a report covers, as given on the command line (None: the server's default)."""

    start: str | None
    end: str | None
    tz: str | None


class ReportFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


ReportOption = Annotated[
    ReportFormat,
    typer.Option("--output", "-o", help="table for people, json or csv for scripts"),
]
FromOption = Annotated[
    str | None, typer.Option("--from", help="first day, YYYY-MM-DD (default: this month's 1st)")
]
ToOption = Annotated[
    str | None, typer.Option("--to", help="last day, YYYY-MM-DD (default: end of that month)")
]
TzOption = Annotated[
    str | None, typer.Option("--tz", help="time zone of the days (default: the server's)")
]


def _hours(gpu_seconds: int) -> str:
    return f"{gpu_seconds / 3600:,.2f}"


def _period_report(
    csv: Callable[[GpuleaseClient, Period], str],
    get: Callable[[GpuleaseClient, Period], M],
    show: Callable[[M], None],
    doc: str,
) -> Callable[..., None]:
    """A command over a period (--from, --to, --tz): CSV text from the server, or what
    `get` finds as JSON or for people."""

    def command(
        start: FromOption = None,
        end: ToOption = None,
        tz: TzOption = None,
        output: ReportOption = ReportFormat.table,
    ) -> None:
        period = Period(start, end, tz)
        with logged_in_client() as client:
            if output is ReportFormat.csv:
                typer.echo(csv(client, period), nl=False)
                return
            found = get(client, period)
        emit(found, OutputFormat(output.value), show)

    command.__doc__ = doc
    return command


def _show_statement(found: StatementPublic) -> None:
    totals = found.totals
    show_fields(
        [
            ("period", f"{found.start} to {found.end} ({found.tz})"),
            ("opening balance", found.opening_balance),
            ("charged", totals.charged),
            ("credited", totals.credited),
            ("closing balance", found.closing_balance),
            ("GPU-hours", _hours(totals.gpu_seconds)),
        ]
    )
    show_rows(
        found.by_gpu_model,
        ("GPU", "GPU-HOURS", "CHARGED"),
        lambda m: (m.gpu_model, _hours(m.gpu_seconds), m.charged),
        empty="no GPU usage in this period",
        title="by GPU model",
    )
    show_rows(
        found.by_day,
        ("DAY", "GPU-HOURS", "CHARGED", "CREDITED"),
        lambda d: (d.day, _hours(d.gpu_seconds), d.charged, d.credited),
        empty="nothing happened in this period",
        title="by day",
    )
    show_rows(
        found.by_instance,
        ("INSTANCE", "GPU", "GPU-HOURS", "CHARGED"),
        lambda i: (
            i.name,
            f"{i.gpu_model}:{i.gpu_count}" if i.gpu_count else i.gpu_model,
            _hours(i.gpu_seconds),
            i.charged,
        ),
        empty="no instance usage in this period",
        title="by instance",
    )
    show_rows(
        found.by_kind,
        ("KIND", "ENTRIES", "AMOUNT"),
        lambda k: (k.kind, k.transactions, k.amount),
        empty="no ledger entries in this period",
        title="by kind",
    )


def _show_revenue(found: RevenuePublic) -> None:
    symbol = found.currency_symbol
    show_fields(
        [
            ("period", f"{found.start} to {found.end} ({found.tz})"),
            ("revenue", found.totals.revenue),
            ("GPU-hours sold", _hours(found.totals.gpu_seconds)),
        ]
    )
    show_rows(
        found.by_gpu_model,
        ("GPU", "GPU-HOURS", "REVENUE"),
        lambda m: (m.gpu_model or "(no instance)", _hours(m.gpu_seconds), m.revenue),
        empty="no revenue in this period",
        title="by GPU model",
    )
    show_rows(
        sorted(found.by_model_day, key=lambda c: (c.day, c.gpu_model or "")),
        ("DAY", "GPU", "GPU-HOURS", "REVENUE"),
        lambda c: (c.day, c.gpu_model or "(no instance)", _hours(c.gpu_seconds), c.revenue),
        empty="no revenue in this period",
        title="by day and GPU model",
    )
    busiest = max(found.by_day, key=lambda d: d.revenue_micro, default=None)
    if busiest is not None and busiest.revenue_micro > 0:
        console().print(
            f"best day: {busiest.day}, {format_credits(busiest.revenue_micro, symbol)}",
            markup=False,
        )


statement = _period_report(
    lambda client, p: client.statements.csv(p.start, p.end, tz=p.tz),
    lambda client, p: client.statements.get(p.start, p.end, tz=p.tz),
    _show_statement,
    "Your usage and charges for a period: by GPU model, day, instance and kind.",
)
revenue = _period_report(
    lambda client, p: client.statements.revenue_csv(p.start, p.end, tz=p.tz),
    lambda client, p: client.statements.revenue(p.start, p.end, tz=p.tz),
    _show_revenue,
    "Revenue and GPU-hours sold per GPU model per day (admins only).",
)
