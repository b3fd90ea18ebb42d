"""GPU quotas: the most GPUs a user's (or a team's) instances may hold at once, set by admins.

The scheduler enforces them (scheduler/policy.py): a request that would take its owner or
team past the cap waits, with that as its reason, until some of their instances stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import InvalidInput, NotFound
from gpulease.schemas.quotas import MAX_QUOTA
from gpulease.server.orm import Team, User


@dataclass(frozen=True)
class Quotas:
    """Caps by the scheduler's owner and team keys (their ids as text)."""

    users: dict[str, int]
    teams: dict[str, int]


def current(session: Session) -> Quotas:
    users = session.execute(select(User.id, User.max_gpus).where(User.max_gpus.is_not(None)))
    teams = session.execute(select(Team.id, Team.max_gpus).where(Team.max_gpus.is_not(None)))
    return Quotas(
        {str(i): int(n) for i, n in users if n is not None},
        {str(i): int(n) for i, n in teams if n is not None},
    )


def set_quota(session: Session, kind: str, name: str, max_gpus: int | None) -> User | Team:
    """Cap the GPUs user or team (`kind`) `name` may hold at once (None: no cap). Running
    instances keep their GPUs; the cap holds back new starts."""
    if max_gpus is not None and not 0 <= max_gpus <= MAX_QUOTA:
        raise InvalidInput(
            f"a GPU quota must be between 0 and {MAX_QUOTA} GPUs (or none to lift it), "
            f"not {max_gpus}"
        )
    row: User | Team | None
    if kind == "user":
        row = session.scalar(select(User).where(User.name == name))
    else:
        row = session.scalar(select(Team).where(Team.name == name))
    if row is None:
        raise NotFound(f"there is no {kind} {name!r}")
    row.max_gpus = max_gpus
    return row


def list_quotas(session: Session) -> list[tuple[str, str, int]]:
    """Every cap set: (kind "user" or "team", name, GPUs), by kind and name."""
    rows = [
        ("user", name, int(n))
        for name, n in session.execute(
            select(User.name, User.max_gpus).where(User.max_gpus.is_not(None))
        )
        if n is not None
    ]
    rows += [
        ("team", name, int(n))
        for name, n in session.execute(
            select(Team.name, Team.max_gpus).where(Team.max_gpus.is_not(None))
        )
        if n is not None
    ]
    return sorted(rows)
