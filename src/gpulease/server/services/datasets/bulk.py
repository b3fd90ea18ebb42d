"""Many rows in one executemany, without SQLAlchemy's per-row statement work: the driver
gets plain tuples (values through their column's bind processor where it has one that
matters), on SQLite and PostgreSQL alike. For the 100,000 chunk rows of one push."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import BigInteger, Integer, LargeBinary, String, Table
from sqlalchemy.orm import Session

from gpulease.server.db import batches


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
    the table's columns the values go to, in order, so that their bind processors apply.
    Integer, string and binary columns are handed to the driver as they are (both drivers
    take them so): for 100,000 rows the per-value processor calls were most of the time."""
    connection = session.connection()
    dialect = connection.dialect
    text = sql.replace("?", _placeholder(dialect.paramstyle or "qmark"))
    processors: list[tuple[int, Callable[[Any], Any]]] = []
    for at, name in enumerate(columns):
        kind = table.c[name].type
        if type(kind) in _PLAIN:
            continue
        found = kind.dialect_impl(dialect).bind_processor(dialect)
        if found is not None:
            processors.append((at, found))
    if processors:
        # A value that repeats from row to row (the one `now` of a push's 5,000 new rows) is
        # processed once: the datetime binds were a tenth of a file list part's writes.
        done: dict[tuple[int, type, Any], Any] = {}
        prepared: list[Sequence[Any]] = []
        for row in rows:
            values = list(row)
            for at, process in processors:
                value = values[at]
                try:
                    key = (at, type(value), value)
                    values[at] = done[key]
                except KeyError:
                    values[at] = done[key] = process(value)
                except TypeError:  # not hashable: processed every time
                    values[at] = process(value)
            prepared.append(tuple(values))
    else:
        prepared = list(rows)
    if prepared:
        connection.exec_driver_sql(text, prepared)


# Exactly these types, not subclasses or decorators of them, whose processors may matter.
_PLAIN = frozenset({Integer, BigInteger, String, LargeBinary})


def chunk_rows(
    session: Session, owner_id: int, columns: str, shas: Sequence[str], condition: str = ""
) -> Iterator[Sequence[Any]]:
    """The driver's rows of `SELECT columns FROM dataset_chunks WHERE owner_id = ? AND sha256
    IN (...)` (AND condition, when given) for shas, 500 at a time: plain tuples, without
    SQLAlchemy's per-value work on each IN list. Booleans come as the driver gives them
    (1 and 0 on SQLite)."""
    connection = session.connection()
    mark = _placeholder(connection.dialect.paramstyle or "qmark")
    extra = f" AND {condition}" if condition else ""
    for batch in batches(shas):
        marks = ", ".join([mark] * len(batch))
        sql = (
            f"SELECT {columns} FROM dataset_chunks "
            f"WHERE owner_id = {mark} AND sha256 IN ({marks}){extra}"
        )
        yield from connection.exec_driver_sql(sql, (owner_id, *batch)).fetchall()
