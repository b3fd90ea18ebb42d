"""Per-user storage quota: the distinct chunk bytes a user holds or has reserved for a push."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.core.datasets import format_bytes
from gpulease.core.errors import GpuleaseError
from gpulease.server.orm import DatasetChunk, DatasetUsage


class QuotaExceeded(GpuleaseError):
    """A push would take its owner past their storage quota."""

    status = 413


HINT = "remove a dataset you no longer need (`gpulease dataset rm NAME`) or ask an admin"


def usage(session: Session, owner_id: int) -> int:
    """Bytes counted against owner's quota: every chunk they have, and every chunk a push in
    progress announced (reserved), each once however many datasets use it."""
    row = session.get(DatasetUsage, owner_id)
    return row.bytes if row is not None else 0


def add_usage(session: Session, owner_id: int, delta: int) -> None:
    """Move owner's counter with their chunk rows; the caller holds their storage lock."""
    if delta == 0:
        return
    row = session.get(DatasetUsage, owner_id)
    if row is None:
        session.add(DatasetUsage(owner_id=owner_id, bytes=delta))
        session.flush()
    else:
        row.bytes += delta


def counted_usage(session: Session, owner_id: int) -> int:
    """The same number summed over the chunk rows (the counter must always equal it)."""
    total = session.scalar(
        select(func.coalesce(func.sum(DatasetChunk.size), 0)).where(
            DatasetChunk.owner_id == owner_id
        )
    )
    return int(total or 0)


def check_push_size(used: int, quota: int, declared: int) -> None:
    """At the start of a push: refuse one that cannot fit even if all of it were known."""
    if declared > quota:
        raise QuotaExceeded(
            f"this dataset is {format_bytes(declared)}, more than your whole storage quota of "
            f"{format_bytes(quota)}; {HINT}"
        )
    if declared > 0 and used >= quota:
        raise QuotaExceeded(
            f"your storage quota is full: you use {format_bytes(used)} of "
            f"{format_bytes(quota)}; {HINT}"
        )


def check_new_content(used_after: int, quota: int, new_bytes: int) -> None:
    """After reserving a push's new chunks: refuse when the owner would pass the quota."""
    if used_after > quota:
        before = used_after - new_bytes
        raise QuotaExceeded(
            f"this push needs {format_bytes(new_bytes)} of new storage but only "
            f"{format_bytes(max(quota - before, 0))} is left: you use {format_bytes(before)} "
            f"of your {format_bytes(quota)} quota; {HINT}"
        )
