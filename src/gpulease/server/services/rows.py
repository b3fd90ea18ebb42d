"""Reading and adding rows the way services do: one row that belongs to the caller or a
404, the one row a condition picks or a 404, every row matching conditions, an insert whose
id is known at once.

A row that exists but belongs to someone else is reported exactly like one that does not
exist, so ids cannot be probed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import ColumnElement, inspect, select
from sqlalchemy.orm import Session

from gpulease.core.errors import NotFound
from gpulease.server.orm import Base

M = TypeVar("M", bound=Base)


def insert(session: Session, row: M) -> M:
    """row added and flushed, so its id and column defaults are set."""
    session.add(row)
    session.flush()
    return row


def get_owned(session: Session, model: type[M], row_id: int, missing: str, **owner: Any) -> M:
    """The model row with that id whose `owner` columns hold the given values
    (`instance_id=instance.id`); otherwise NotFound with the message `missing`."""
    row = session.get(model, row_id)
    if row is None or any(getattr(row, column) != value for column, value in owner.items()):
        raise NotFound(missing)
    return row


def find_one(session: Session, model: type[M], *where: ColumnElement[bool], missing: str) -> M:
    """The model row matching every condition; NotFound with the message `missing` if none."""
    row = session.scalar(select(model).where(*where))
    if row is None:
        raise NotFound(missing)
    return row


def find_all(
    session: Session,
    model: type[M],
    *where: ColumnElement[bool],
    order_by: Any = None,
    limit: int | None = None,
) -> list[M]:
    """The model rows matching every condition, in order_by's order (default: by primary
    key, which for every table here is the order rows were added in)."""
    query = select(model).where(*where)
    if order_by is None:
        query = query.order_by(*inspect(model).primary_key)
    else:
        query = query.order_by(order_by)
    if limit is not None:
        query = query.limit(limit)
    return list(session.scalars(query))
