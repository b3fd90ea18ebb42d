"""How the CLI prints: Rich tables for people, JSON (`-o json`) for scripts, red errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpulease.core.money import format_credits

D = TypeVar("D", bound=BaseModel | Sequence[BaseModel] | dict[str, Any])
R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


OutputOption = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", help="table for people, json for scripts"),
]


def console() -> Console:
    """Standard output. Made per call so it follows sys.stdout (tests swap it). No emoji
    codes: `:ab:` in a fingerprint or a name stays text."""
    return Console(highlight=False, soft_wrap=False, emoji=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, emoji=False)


def error(message: str) -> None:
    """`error: message` in red on stderr, unwrapped."""
    err_console().print(f"[bold red]error:[/bold red] [red]{escape(message)}[/red]", soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print the error and exit with `code` (1: refused or failed, 2: usage errors)."""
    error(message)
    raise typer.Exit(code)


def note(message: str) -> None:
    """A dim remark on stderr, so stdout stays clean for data and job output."""
    err_console().print(f"[dim]{escape(message)}[/dim]", soft_wrap=True)


def print_json(data: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        payload: Any = data.model_dump(mode="json")
    elif isinstance(data, dict):
        payload = data
    else:
        payload = [item.model_dump(mode="json") for item in data]
    typer.echo(json.dumps(payload, indent=2))


def symbol_of(formatted: str, micro: int) -> str:
    """The currency symbol in an amount the server wrote with core.money.format_credits
    ('$' in '$1.5000' for 1_500_000); '' when `formatted` is not that amount."""
    number = format_credits(micro, "")
    sign = "-" if number.startswith("-") else ""
    value = number[len(sign) :]
    if not (formatted.startswith(sign) and formatted.endswith(value)):
        return ""
    return formatted[len(sign) : len(formatted) - len(value)]


def when(value: datetime | None) -> str:
    """A timestamp in local time, to the minute; '-' for none."""
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M")


def table(*columns: str, title: str | None = None) -> Table:
    result = Table(title=title, header_style="bold", title_justify="left")
    for column in columns:
        result.add_column(column)
    return result


def show_table(result: Table, *, empty: str) -> None:
    if result.row_count == 0:
        note(empty)
        return
    console().print(result)


def show_fields(fields: Sequence[tuple[str, object]]) -> None:
    """Key/value lines for one object (`instance show`, `whoami`)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in fields:
        grid.add_row(key, escape(str(value)) if value not in (None, "") else "-")
    console().print(grid)


def add_row(result: Table, *cells: object) -> None:
    """Add a row of plain text: names, memos and commands are never read as Rich markup."""
    result.add_row(*("-" if cell is None else escape(str(cell)) for cell in cells))


def emit(data: D, output: OutputFormat, show: Callable[[D], object]) -> None:
    """What a command found: JSON for scripts (`-o json`), `show(data)` for people."""
    if output is OutputFormat.json:
        print_json(data)
    else:
        show(data)


def emit_rows(
    rows: Sequence[R],
    output: OutputFormat,
    columns: Sequence[str],
    cells: Callable[[R], Sequence[object]],
    *,
    empty: str,
    title: str | None = None,
) -> None:
    """A listing: JSON for scripts, else a table of `cells(row)` per row (`empty` when
    there are none)."""
    emit(rows, output, lambda found: show_rows(found, columns, cells, empty=empty, title=title))


def show_rows(
    rows: Iterable[T],
    columns: Sequence[str],
    cells: Callable[[T], Sequence[object]],
    *,
    empty: str,
    title: str | None = None,
) -> None:
    """A table of `cells(row)` per row, or the dim `empty` note when there are none."""
    result = table(*columns, title=title)
    for row in rows:
        add_row(result, *cells(row))
    show_table(result, empty=empty)
