"""Operator endpoints: users and credit grants."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from gpulease.core.errors import InvalidInput
from gpulease.core.money import MoneyError, parse_credits
from gpulease.server.routers.api.presenters import ledger_line
from gpulease.server.routers.deps import current_admin, runtime, tx
from gpulease.server.schemas import GrantCreate, LedgerLine, UserPublic
from gpulease.server.services import ledger, users
from gpulease.server.services.billing import teams

router = APIRouter(prefix="/admin", tags=["admin"])


@router.get("/users")
def list_users(request: Request) -> list[UserPublic]:
    with tx(request) as session:
        current_admin(session, request)
        return [UserPublic.model_validate(u) for u in users.list_users(session)]


@router.post("/grants", status_code=201)
def grant_credit(body: GrantCreate, request: Request) -> LedgerLine:
    try:
        amount = parse_credits(body.amount)
    except MoneyError as exc:
        raise InvalidInput(str(exc)) from exc
    if (body.user is None) == (body.team is None):
        raise InvalidInput("grant to either a user or a team")
    with tx(request) as session:
        admin = current_admin(session, request)
        if body.team is not None:
            team = teams.get_team(session, body.team)
            user_id, team_id = team.owner_id, team.id
        else:
            assert body.user is not None
            user_id, team_id = users.get_user_by_name(session, body.user).id, None
        txn = ledger.grant(
            session,
            user_id,
            amount,
            kind="grant",
            key=f"grant:{uuid.uuid4()}",
            memo=f"{body.memo} (by {admin.name})",
            team_id=team_id,
        )
        assert txn is not None
        return ledger_line(txn, amount, runtime(request).catalog)
