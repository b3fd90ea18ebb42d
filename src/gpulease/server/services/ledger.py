"""The ledger: append-only double-entry transactions in integer micro-credits.

Every transaction's entries sum to zero. A wallet's balance is the sum of its entries.
A transaction's idempotency key is unique: posting the same key twice is a no-op, which is
what makes a retried or replayed billing tick harmless.

Entries are stamped with the time the caller gives (`at`: the second a charge bills up to,
the tick's now) or else with `clock()`, the module's one reading of the real time, which
tests replace (a Clock, as the rate limiter takes one) to pin the day an entry falls on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session

from gpulease.core.errors import InvalidInput
from gpulease.server.db import batches, utcnow
from gpulease.server.orm import LedgerAccount, LedgerEntry, LedgerTransaction

WALLET = "wallet"
TEAM_WALLET = "team_wallet"
REVENUE = "revenue"
GRANTS = "grants"
MAX_GRANT_MICRO = 10**15  # a billion credits: anything bigger is a typo

Clock = Callable[[], datetime]
clock: Clock = utcnow  # the time entries get when the caller names none


def account_id(
    session: Session, kind: str, user_id: int | None = None, team_id: int | None = None
) -> int:
    def find() -> int | None:
        return session.scalar(
            select(LedgerAccount.id).where(
                LedgerAccount.kind == kind,
                LedgerAccount.user_id.is_(None)
                if user_id is None
                else LedgerAccount.user_id == user_id,
                LedgerAccount.team_id.is_(None)
                if team_id is None
                else LedgerAccount.team_id == team_id,
            )
        )

    found = find()
    if found is not None:
        return found
    try:
        with session.begin_nested():
            account = LedgerAccount(kind=kind, user_id=user_id, team_id=team_id)
            session.add(account)
            session.flush()
            return account.id
    except IntegrityError:
        found = find()  # another transaction created it first
        assert found is not None
        return found


def wallet_account(session: Session, user_id: int, team_id: int | None) -> int:
    """The account an instance's charges go to: its team's wallet or its owner's."""
    if team_id is not None:
        return account_id(session, TEAM_WALLET, team_id=team_id)
    return account_id(session, WALLET, user_id)


def wallet_accounts(
    session: Session, wallets: Iterable[tuple[int, int | None]]
) -> dict[tuple[int, int | None], int]:
    """wallet_account for many (user_id, team_id) at once: a query per 500 owners for those
    that exist."""
    wanted = set(wallets)
    users = sorted({u for u, t in wanted if t is None})
    teams = sorted({t for _, t in wanted if t is not None})
    of_user = _wallets(session, WALLET, LedgerAccount.user_id, LedgerAccount.team_id, users)
    of_team = _wallets(session, TEAM_WALLET, LedgerAccount.team_id, LedgerAccount.user_id, teams)
    found: dict[tuple[int, int | None], int] = {}
    for user_id, team_id in wanted:
        known = of_user.get(user_id) if team_id is None else of_team.get(team_id)
        # a wallet's first charge makes its account
        found[(user_id, team_id)] = known or wallet_account(session, user_id, team_id)
    return found


def _wallets(
    session: Session,
    kind: str,
    owner: InstrumentedAttribute[int | None],
    other: InstrumentedAttribute[int | None],
    owners: list[int],
) -> dict[int, int]:
    """The existing wallet accounts of kind held by owners (owner column -> account id),
    a slice of owners a query."""
    found: dict[int, int] = {}
    for batch in batches(owners):
        for acc_id, owner_id in session.execute(
            select(LedgerAccount.id, owner).where(
                LedgerAccount.kind == kind, owner.in_(batch), other.is_(None)
            )
        ):
            if owner_id is not None:
                found[owner_id] = acc_id
    return found


def post(
    session: Session,
    *,
    kind: str,
    key: str,
    legs: list[tuple[int, int]],
    memo: str = "",
    user_id: int | None = None,
    instance_id: int | None = None,
    at: datetime | None = None,
) -> LedgerTransaction | None:
    """Append one balanced transaction of (account_id, amount) legs, stamped `at` (default:
    clock()).

    Returns None when a transaction with this key exists already (a replay).
    """
    if sum(amount for _, amount in legs) != 0:
        raise ValueError(f"unbalanced ledger transaction {key}: {legs}")
    if session.scalar(select(LedgerTransaction.id).where(LedgerTransaction.idempotency_key == key)):
        return None
    now = at or clock()
    txn = LedgerTransaction(
        kind=kind,
        idempotency_key=key,
        memo=memo,
        user_id=user_id,
        instance_id=instance_id,
        created_at=now,
    )
    session.add(txn)
    session.flush()
    for acc, amount in legs:
        session.add(
            LedgerEntry(transaction_id=txn.id, account_id=acc, amount=amount, created_at=now)
        )
    session.flush()
    return txn


def grant(
    session: Session,
    user_id: int,
    amount_micro: int,
    *,
    kind: str,
    key: str,
    memo: str,
    team_id: int | None = None,
    at: datetime | None = None,
) -> LedgerTransaction | None:
    if amount_micro <= 0:
        raise InvalidInput("a credit grant must be a positive amount")
    if amount_micro > MAX_GRANT_MICRO:
        raise InvalidInput("that grant is larger than a billion credits; check the amount")
    return post(
        session,
        kind=kind,
        key=key,
        legs=[
            (account_id(session, GRANTS), -amount_micro),
            (wallet_account(session, user_id, team_id), amount_micro),
        ],
        memo=memo,
        user_id=user_id,
        at=at,
    )


def charge(
    session: Session,
    user_id: int,
    amount_micro: int,
    *,
    key: str,
    memo: str,
    kind: str = "usage",
    team_id: int | None = None,
    instance_id: int | None = None,
    at: datetime | None = None,
) -> LedgerTransaction | None:
    """Move amount from the wallet (the team's when team_id is set) to revenue."""
    if amount_micro == 0:
        return None
    if amount_micro < 0:
        raise ValueError("a charge cannot be negative")
    return post(
        session,
        kind=kind,
        key=key,
        legs=[
            (wallet_account(session, user_id, team_id), -amount_micro),
            (account_id(session, REVENUE), amount_micro),
        ],
        memo=memo,
        user_id=user_id,
        instance_id=instance_id,
        at=at,
    )


def charge_usage(
    session: Session,
    user_id: int,
    instance_id: int,
    amount_micro: int,
    *,
    key: str,
    memo: str,
    team_id: int | None = None,
    at: datetime | None = None,
) -> LedgerTransaction | None:
    return charge(
        session,
        user_id,
        amount_micro,
        key=key,
        memo=memo,
        team_id=team_id,
        instance_id=instance_id,
        at=at,
    )


def balance(session: Session, user_id: int, team_id: int | None = None) -> int:
    """A wallet's balance: the user's own, or the team's when team_id is given."""
    if team_id is not None:
        kind_filter = (LedgerAccount.kind == TEAM_WALLET, LedgerAccount.team_id == team_id)
    else:
        kind_filter = (LedgerAccount.kind == WALLET, LedgerAccount.user_id == user_id)
    total = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount), 0))
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .where(*kind_filter)
    )
    return int(total or 0)


def wallet_entries(
    session: Session, user_id: int, limit: int = 200, offset: int = 0
) -> list[tuple[LedgerTransaction, int]]:
    """The user's wallet movements, newest first: (transaction, signed amount); offset skips
    that many of the newest (a page of the ledger)."""
    rows = session.execute(
        select(LedgerTransaction, LedgerEntry.amount)
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .where(LedgerAccount.kind == WALLET, LedgerAccount.user_id == user_id)
        .order_by(LedgerTransaction.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return [(txn, int(amount)) for txn, amount in rows]
