"""Teams and their shared wallets."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from gpulease.core.money import format_credits
from gpulease.schemas.billing import TeamCreate, TeamMemberPublic, TeamMemberUpdate, TeamPublic
from gpulease.server.orm import Team, User
from gpulease.server.routers.api.clock import Now
from gpulease.server.routers.deps import CurrentUser, SessionDep, credits, runtime
from gpulease.server.services import ledger
from gpulease.server.services.billing import limits, teams

router = APIRouter(tags=["teams"])


def _public(
    session: Session, request: Request, team: Team, viewer: User, now: datetime
) -> TeamPublic:
    """The owner sees every member's spending (this month, as of now); a member sees their
    own line."""
    symbol = runtime(request).catalog.currency_symbol
    balance = ledger.balance(session, team.owner_id, team.id)
    owner = session.get(User, team.owner_id)
    assert owner is not None
    rows = [
        TeamMemberPublic(
            user=user.name,
            monthly_limit_micro=member.monthly_limit_micro,
            month_spend_micro=limits.month_spend(session, user.id, now, team.id),
        )
        for member, user in teams.members(session, team)
        if viewer.id == team.owner_id or user.id == viewer.id
    ]
    return TeamPublic(
        name=team.name,
        owner=owner.name,
        balance_micro=balance,
        balance=format_credits(balance, symbol),
        members=rows,
    )


@router.post("/teams", status_code=201)
def create_team(
    body: TeamCreate, session: SessionDep, user: CurrentUser, request: Request, now: Now
) -> TeamPublic:
    return _public(session, request, teams.create_team(session, user, body.name), user, now)


@router.get("/teams")
def list_teams(
    session: SessionDep, user: CurrentUser, request: Request, now: Now
) -> list[TeamPublic]:
    return [_public(session, request, t, user, now) for t in teams.my_teams(session, user)]


@router.get("/teams/{name}")
def show_team(
    name: str, session: SessionDep, user: CurrentUser, request: Request, now: Now
) -> TeamPublic:
    team, _ = teams.team_for_member(session, user, name)
    return _public(session, request, team, user, now)


@router.put("/teams/{name}/members/{member}")
def set_member(
    name: str,
    member: str,
    body: TeamMemberUpdate,
    session: SessionDep,
    user: CurrentUser,
    request: Request,
    now: Now,
) -> TeamPublic:
    team = teams.team_for_owner(session, user, name)
    teams.set_member(session, team, member, credits(body.monthly_limit, "monthly limit"))
    return _public(session, request, team, user, now)


@router.delete("/teams/{name}/members/{member}", status_code=204)
def remove_member(name: str, member: str, session: SessionDep, user: CurrentUser) -> Response:
    teams.remove_member(session, teams.team_for_owner(session, user, name), member)
    return Response(status_code=204)
