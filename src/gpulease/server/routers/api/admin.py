"""Operator endpoints: users and credit grants."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpulease.core.errors import InvalidInput
from gpulease.core.money import MoneyError, parse_credits
from gpulease.schemas.accounts import UserPublic
from gpulease.schemas.ledger import GrantCreate, LedgerLine
from gpulease.server.routers.api.presenters import ledger_line
from gpulease.server.routers.deps import AdminUser, SessionDep, runtime
from gpulease.server.services import grants, users

router = APIRouter(prefix="/admin", tags=["admin"])


@router.get("/users")
def list_users(session: SessionDep, _: AdminUser) -> list[UserPublic]:
    return [UserPublic.model_validate(u) for u in users.list_users(session)]


@router.post("/grants", status_code=201)
def grant_credit(
    body: GrantCreate, session: SessionDep, admin: AdminUser, request: Request
) -> LedgerLine:
    try:
        amount = parse_credits(body.amount)
    except MoneyError as exc:
        raise InvalidInput(str(exc)) from exc
    txn = grants.grant_credit(
        session, admin, amount, user=body.user, team=body.team, memo=body.memo
    )
    return ledger_line(txn, amount, runtime(request).catalog)
