"""Read-only queries the web console needs and the resource services do not offer."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.server.orm import ApiToken, Instance, LogChunk, MetricPoint, User
from gpulease.server.security import hash_token


def session_token(session: Session, secret: str) -> ApiToken | None:
    """The browser-session token row behind a cookie secret; None for any other secret."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    if row is None or row.kind != "session":
        return None
    return row


def instance_names(session: Session, owner: User, ids: Collection[int]) -> dict[int, str]:
    """Names of owner's instances by id, released ones included (old runs point at them)."""
    if not ids:
        return {}
    rows = session.execute(
        select(Instance.id, Instance.name).where(
            Instance.owner_id == owner.id, Instance.id.in_(list(ids))
        )
    )
    return {row.id: row.name for row in rows}


def last_log_seqs(session: Session, run_ids: Collection[int]) -> dict[int, int]:
    """The highest stored log seq of each run that has output. Callers check ownership."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(LogChunk.run_id, func.max(LogChunk.seq))
        .where(LogChunk.run_id.in_(list(run_ids)))
        .group_by(LogChunk.run_id)
    )
    return {int(run_id): int(seq) for run_id, seq in rows}


def metric_keys(session: Session, run_ids: Collection[int]) -> list[str]:
    """The metric keys the runs have points for, sorted. Callers check ownership."""
    if not run_ids:
        return []
    rows = session.scalars(
        select(MetricPoint.key).where(MetricPoint.run_id.in_(list(run_ids))).distinct()
    )
    return sorted(rows)
