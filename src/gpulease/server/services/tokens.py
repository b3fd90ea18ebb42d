"""API and session tokens: create (shown once), list, revoke, resolve a bearer to its user."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import InvalidInput, NotFound, Unauthorized
from gpulease.server.db import utcnow
from gpulease.server.orm import ApiToken, User
from gpulease.server.security import hash_token, new_token


def create_token(
    session: Session, user: User, name: str, *, kind: str = "api", ttl: timedelta | None = None
) -> tuple[str, ApiToken]:
    """A new token of user's (its secret, shown once, and its row): kind api (permanent
    until revoked) or session (the console's, expiring after ttl)."""
    name = name.strip()
    if not name or len(name) > 100:
        raise InvalidInput("a token needs a name of 1 to 100 characters, e.g. 'laptop'")
    secret = new_token()
    now = utcnow()
    row = ApiToken(
        user_id=user.id,
        name=name,
        kind=kind,
        token_hash=hash_token(secret),
        prefix=secret[:10],
        created_at=now,
        expires_at=now + ttl if ttl else None,
    )
    session.add(row)
    session.flush()
    return secret, row


def list_tokens(session: Session, user: User) -> list[ApiToken]:
    return list(
        session.scalars(
            select(ApiToken)
            .where(ApiToken.user_id == user.id, ApiToken.kind == "api")
            .order_by(ApiToken.id)
        )
    )


def revoke_token(session: Session, user: User, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id)
    if row is None or row.user_id != user.id:
        raise NotFound(f"you have no token with id {token_id}; see `gpulease token ls`")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def resolve_token(session: Session, secret: str) -> User:
    """The user behind a bearer token, or Unauthorized saying what to do."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    now = utcnow()
    # JupyterLab's tickets and cookies (services/jupyter_access) open one notebook only.
    if row is None or row.kind in ("jupyter", "jupyter-ticket"):
        raise Unauthorized("unknown token; log in again with `gpulease login`")
    if row.revoked_at is not None:
        raise Unauthorized("this token was revoked; log in again or create a new token")
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthorized("this session has expired; log in again")
    if row.last_used_at is None or now - row.last_used_at > timedelta(minutes=1):
        row.last_used_at = now
    return row.user
