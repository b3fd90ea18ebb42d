"""Credit grants: an admin puts credit into a user's wallet or a team's shared wallet."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.errors import InvalidInput
from gpulease.server.orm import LedgerEntry, LedgerTransaction, User
from gpulease.server.services import ledger, users
from gpulease.server.services.billing import teams

MAX_MEMO = 200


def grant_credit(
    session: Session,
    admin: User,
    amount_micro: int,
    *,
    user: str | None = None,
    team: str | None = None,
    memo: str = "admin grant",
) -> LedgerTransaction:
    """Post one grant (a fresh idempotency key each time: two clicks are two grants).

    Exactly one of user and team names the wallet; the memo records which admin gave it.
    """
    if (user is None) == (team is None):
        raise InvalidInput("grant to either a user or a team")
    memo = memo.strip() or "admin grant"
    if len(memo) > MAX_MEMO:
        raise InvalidInput(f"the memo is too long: use at most {MAX_MEMO} characters")
    if team is not None:
        found = teams.get_team(session, team)
        user_id, team_id = found.owner_id, found.id
    else:
        assert user is not None
        user_id, team_id = users.get_user_by_name(session, user).id, None
    txn = ledger.grant(
        session,
        user_id,
        amount_micro,
        kind="grant",
        key=f"grant:{uuid.uuid4()}",
        memo=f"{memo} (by {admin.name})",
        team_id=team_id,
    )
    assert txn is not None  # a fresh key is never a replay
    return txn


def describe_grant(session: Session, txn_id: int) -> tuple[str, int] | None:
    """(user name, amount) of a grant transaction; None when txn_id is not a grant."""
    row = session.execute(
        select(User.name, LedgerEntry.amount)
        .select_from(LedgerTransaction)
        .join(User, User.id == LedgerTransaction.user_id)
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .where(
            LedgerTransaction.id == txn_id,
            LedgerTransaction.kind == "grant",
            LedgerEntry.amount > 0,
        )
    ).first()
    return None if row is None else (str(row[0]), int(row[1]))
