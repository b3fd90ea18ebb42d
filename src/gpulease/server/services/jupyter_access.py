"""Access to an instance's JupyterLab, which is served on an origin of its own.

The console mints a ticket for the instance's owner (one minute, one use) and sends the
browser to the instance's Jupyter host with it; that host redeems it for a cookie of its
own (hours), valid for that instance only. Both are rows of api_tokens (stored as SHA-256,
so several server replicas share them) whose kinds the API refuses as bearer tokens: what
runs in a notebook can never act on the console as its owner. Each new ticket first deletes
tickets and cookies that expired or were used up, so they do not pile up.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from gpulease.server.db import utcnow
from gpulease.server.orm import ApiToken, User
from gpulease.server.security import hash_token, new_token

TICKET_KIND = "jupyter-ticket"
ACCESS_KIND = "jupyter"
KINDS = (TICKET_KIND, ACCESS_KIND)
PREFIX = "glj_"
TICKET_TTL = timedelta(seconds=60)
ACCESS_TTL = timedelta(hours=8)
PRUNE_BATCH = 1000


def _name(instance_id: int) -> str:
    return f"jupyter {instance_id}"


def _issue(session: Session, user_id: int, instance_id: int, kind: str, ttl: timedelta) -> str:
    secret = new_token(PREFIX)
    now = utcnow()
    session.add(
        ApiToken(
            user_id=user_id,
            name=_name(instance_id),
            kind=kind,
            token_hash=hash_token(secret),
            prefix=secret[:10],
            created_at=now,
            expires_at=now + ttl,
        )
    )
    session.flush()
    return secret


def _live(session: Session, secret: str, instance_id: int, kind: str) -> ApiToken | None:
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    now = utcnow()
    if (
        row is None
        or row.kind != kind
        or row.name != _name(instance_id)
        or row.revoked_at is not None
        or row.expires_at is None
        or row.expires_at <= now
    ):
        return None
    return row


def prune(session: Session, now: datetime) -> int:
    """Delete up to PRUNE_BATCH tickets and cookies (any user's) that expired by now or were
    used up or revoked: they open nothing any more. Rows another transaction holds are
    skipped (PostgreSQL: SKIP LOCKED), so two pruning requests never wait on each other.
    Returns how many were deleted."""
    dead = (
        select(ApiToken.id)
        .where(
            ApiToken.kind.in_(KINDS),
            or_(ApiToken.expires_at <= now, ApiToken.revoked_at.is_not(None)),
        )
        .order_by(ApiToken.id)
        .limit(PRUNE_BATCH)
        .with_for_update(skip_locked=True)
    )
    ids = list(session.scalars(dead))
    if not ids:
        return 0
    session.execute(
        delete(ApiToken).where(ApiToken.id.in_(ids)).execution_options(synchronize_session=False)
    )
    return len(ids)


def mint_ticket(session: Session, owner: User, instance_id: int) -> str:
    """A one-use ticket into JupyterLab of instance_id (the caller checked ownership)."""
    prune(session, utcnow())
    return _issue(session, owner.id, instance_id, TICKET_KIND, TICKET_TTL)


def redeem_ticket(session: Session, ticket: str, instance_id: int) -> str | None:
    """The Jupyter host's cookie for a live ticket of this instance, which is used up now;
    None for an unknown, expired, used or other instance's ticket."""
    row = _live(session, ticket, instance_id, TICKET_KIND)
    if row is None:
        return None
    used = session.execute(
        update(ApiToken)
        .where(ApiToken.id == row.id, ApiToken.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if used.rowcount != 1:  # type: ignore[attr-defined]
        return None  # redeemed at the same moment elsewhere
    return _issue(session, row.user_id, instance_id, ACCESS_KIND, ACCESS_TTL)


def resolve_access(session: Session, secret: str | None, instance_id: int) -> User | None:
    """The user a Jupyter host cookie belongs to, if it is live and for this instance."""
    if not secret:
        return None
    row = _live(session, secret, instance_id, ACCESS_KIND)
    return row.user if row is not None else None
