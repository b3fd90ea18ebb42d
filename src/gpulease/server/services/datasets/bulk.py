"""Many rows in one executemany, without SQLAlchemy's per-row statement work: the driver
gets plain tuples (each value through its column's bind processor, as SQLAlchemy would),
on SQLite and PostgreSQL alike. For the 100,000 chunk rows of one push."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.orm import Session


def _placeholder(paramstyle: str) -> str:
    if paramstyle == "qmark":
        return "?"
    if paramstyle in ("format", "pyformat"):
        return "%s"
    raise NotImplementedError(f"bulk writes do not know the paramstyle {paramstyle!r}")


def execute_rows(
    session: Session,
    table: Table,
    sql: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> None:
    """Run sql once per row, in one executemany. sql marks each value with ? (and quotes
    names that are SQL keywords with double quotes, which both databases read); columns are
    the table's columns the values go to, in order, so that their bind processors apply."""
    connection = session.connection()
    dialect = connection.dialect
    text = sql.replace("?", _placeholder(dialect.paramstyle or "qmark"))
    processors: list[Callable[[Any], Any] | None] = [
        table.c[name].type.bind_processor(dialect) for name in columns
    ]
    if any(processors):
        prepared = [
            tuple(
                value if p is None else p(value) for p, value in zip(processors, row, strict=True)
            )
            for row in rows
        ]
    else:
        prepared = [tuple(row) for row in rows]
    if prepared:
        connection.exec_driver_sql(text, prepared)
