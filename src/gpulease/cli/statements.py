"""`gpulease statement` and `gpulease admin revenue`: usage and revenue for a period."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, TypeVar

import typer

from gpulease.cli.connection import logged_in_client
from gpulease.cli.output import add_row, console, print_json, show_fields, show_table, table
from gpulease.client import GpuleaseClient
from gpulease.core.money import format_credits
from gpulease.schemas.statements import RevenuePublic, StatementPublic

M = TypeVar("M", StatementPublic, RevenuePublic)


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


def statement(
    start: FromOption = None,
    end: ToOption = None,
    tz: TzOption = None,
    output: ReportOption = ReportFormat.table,
) -> None:
    """Your usage and charges for a period: by GPU model, day, instance and kind."""
    _report(
        output,
        lambda client: client.statements.csv(start, end, tz=tz),
        lambda client: client.statements.get(start, end, tz=tz),
        _show_statement,
    )


def _report(
    output: ReportFormat,
    csv: Callable[[GpuleaseClient], str],
    fetch: Callable[[GpuleaseClient], M],
    show: Callable[[M], None],
) -> None:
    """CSV text from the server, or what `fetch` finds as JSON or for people."""
    with logged_in_client() as client:
        if output is ReportFormat.csv:
            typer.echo(csv(client), nl=False)
            return
        found = fetch(client)
    if output is ReportFormat.json:
        print_json(found)
    else:
        show(found)


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
    models = table("GPU", "GPU-HOURS", "CHARGED", title="by GPU model")
    for m in found.by_gpu_model:
        add_row(models, m.gpu_model, _hours(m.gpu_seconds), m.charged)
    show_table(models, empty="no GPU usage in this period")
    days = table("DAY", "GPU-HOURS", "CHARGED", "CREDITED", title="by day")
    for d in found.by_day:
        add_row(days, d.day, _hours(d.gpu_seconds), d.charged, d.credited)
    show_table(days, empty="nothing happened in this period")
    instances = table("INSTANCE", "GPU", "GPU-HOURS", "CHARGED", title="by instance")
    for i in found.by_instance:
        gpu = f"{i.gpu_model}:{i.gpu_count}" if i.gpu_count else i.gpu_model
        add_row(instances, i.name, gpu, _hours(i.gpu_seconds), i.charged)
    show_table(instances, empty="no instance usage in this period")
    kinds = table("KIND", "ENTRIES", "AMOUNT", title="by kind")
    for k in found.by_kind:
        add_row(kinds, k.kind, k.transactions, k.amount)
    show_table(kinds, empty="no ledger entries in this period")


def revenue(
    start: FromOption = None,
    end: ToOption = None,
    tz: TzOption = None,
    output: ReportOption = ReportFormat.table,
) -> None:
    """Revenue and GPU-hours sold per GPU model per day (admins only)."""
    _report(
        output,
        lambda client: client.statements.revenue_csv(start, end, tz=tz),
        lambda client: client.statements.revenue(start, end, tz=tz),
        _show_revenue,
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
    models = table("GPU", "GPU-HOURS", "REVENUE", title="by GPU model")
    for m in found.by_gpu_model:
        add_row(models, m.gpu_model or "(no instance)", _hours(m.gpu_seconds), m.revenue)
    show_table(models, empty="no revenue in this period")
    cells = table("DAY", "GPU", "GPU-HOURS", "REVENUE", title="by day and GPU model")
    for c in sorted(found.by_model_day, key=lambda c: (c.day, c.gpu_model or "")):
        add_row(cells, c.day, c.gpu_model or "(no instance)", _hours(c.gpu_seconds), c.revenue)
    show_table(cells, empty="no revenue in this period")
    busiest = max(found.by_day, key=lambda d: d.revenue_micro, default=None)
    if busiest is not None and busiest.revenue_micro > 0:
        console().print(
            f"best day: {busiest.day}, {format_credits(busiest.revenue_micro, symbol)}",
            markup=False,
        )
