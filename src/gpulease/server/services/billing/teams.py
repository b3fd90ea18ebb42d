"""Teams: a shared wallet, its members and what each may charge to it per month."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpulease.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpulease.core.names import NameRule
from gpulease.server.db import utcnow
from gpulease.server.orm import Team, TeamMember, User
from gpulease.server.services import users
from gpulease.server.services.rows import find_one

TEAM_NAME = NameRule("team name", 2, 64)


def create_team(session: Session, owner: User, name: str) -> Team:
    TEAM_NAME.check(name)
    if session.scalar(select(Team.id).where(Team.name == name)):
        raise Conflict(f"the team name {name!r} is taken; choose another")
    team = Team(name=name, owner_id=owner.id, created_at=utcnow())
    session.add(team)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"the team name {name!r} is taken; choose another") from None
    session.add(TeamMember(team_id=team.id, user_id=owner.id, created_at=utcnow()))
    session.flush()
    return team


def get_team(session: Session, name: str) -> Team:
    return find_one(session, Team, Team.name == name, missing=f"there is no team named {name!r}")


def team_for_member(session: Session, user: User, name: str) -> tuple[Team, TeamMember]:
    """The team, if user belongs to it. A team you are not in is simply not found."""
    row = session.execute(
        select(Team, TeamMember)
        .join(TeamMember, TeamMember.team_id == Team.id)
        .where(Team.name == name, TeamMember.user_id == user.id)
    ).first()
    if row is None:
        raise NotFound(f"you are not in a team named {name!r}; see `gpulease team ls`")
    return row[0], row[1]


def team_for_owner(session: Session, user: User, name: str) -> Team:
    team, _ = team_for_member(session, user, name)
    if team.owner_id != user.id:
        raise Forbidden(f"only the owner of team {name!r} can do that")
    return team


def my_teams(session: Session, user: User) -> list[Team]:
    return list(
        session.scalars(
            select(Team)
            .join(TeamMember, TeamMember.team_id == Team.id)
            .where(TeamMember.user_id == user.id)
            .order_by(Team.name)
        )
    )


def members(session: Session, team: Team) -> list[tuple[TeamMember, User]]:
    rows = session.execute(
        select(TeamMember, User)
        .join(User, User.id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id)
        .order_by(User.name)
    ).all()
    return [(m, u) for m, u in rows]


def set_member(
    session: Session, team: Team, user_name: str, monthly_limit_micro: int | None
) -> TeamMember:
    """Add a member or change their monthly limit (None: no limit)."""
    if monthly_limit_micro is not None and monthly_limit_micro < 0:
        raise InvalidInput("a spending limit cannot be negative")
    user = users.get_user_by_name(session, user_name)
    member = session.scalar(
        select(TeamMember).where(TeamMember.team_id == team.id, TeamMember.user_id == user.id)
    )
    if member is None:
        member = TeamMember(team_id=team.id, user_id=user.id, created_at=utcnow())
        session.add(member)
    member.monthly_limit_micro = monthly_limit_micro
    session.flush()
    return member


def remove_member(session: Session, team: Team, user_name: str) -> None:
    user = users.get_user_by_name(session, user_name)
    if user.id == team.owner_id:
        raise InvalidInput("the owner cannot leave their team")
    member = session.scalar(
        select(TeamMember).where(TeamMember.team_id == team.id, TeamMember.user_id == user.id)
    )
    if member is None:
        raise NotFound(f"{user_name} is not a member of {team.name}")
    session.delete(member)
