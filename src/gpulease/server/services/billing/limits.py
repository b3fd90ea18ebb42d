"""Spending caps: a maximum hourly spend and a monthly budget per user (set by the user,
capped by admins), team members' monthly limits, and the low-balance threshold."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpulease.core.errors import InvalidInput, PaymentRequired
from gpulease.core.money import format_credits
from gpulease.core.records import from_attributes
from gpulease.server.orm import (
    Instance,
    LedgerEntry,
    LedgerTransaction,
    SpendingLimit,
    TeamMember,
)
from gpulease.server.services import ledger
from gpulease.server.services.instances.states import LIVE, QUEUED

# What an owner spends on now: every instance from queued until it has stopped.
SPENDING = (QUEUED, *LIVE)
SPEND_KINDS = ("usage", "daily_block", "storage")


@dataclass(frozen=True)
class Caps:
    max_hourly_micro: int | None
    monthly_budget_micro: int | None
    admin_max_hourly_micro: int | None
    admin_monthly_budget_micro: int | None
    low_balance_micro: int | None

    @property
    def hourly(self) -> int | None:
        return _tighter(self.max_hourly_micro, self.admin_max_hourly_micro)

    @property
    def monthly(self) -> int | None:
        return _tighter(self.monthly_budget_micro, self.admin_monthly_budget_micro)


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _row(session: Session, user_id: int) -> SpendingLimit:
    row = session.get(SpendingLimit, user_id)
    if row is None:
        row = SpendingLimit(user_id=user_id)
        session.add(row)
        session.flush()
    return row


def caps_from(row: SpendingLimit | None) -> Caps:
    """The caps a user's limits row holds; none at all without a row."""
    if row is None:
        return Caps(None, None, None, None, None)
    return from_attributes(Caps, row)


def caps_of(session: Session, user_id: int) -> Caps:
    return caps_from(session.get(SpendingLimit, user_id))


def month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def hourly_spend(session: Session, user_id: int) -> int:
    """The summed hourly rates of the user's live instances (what they spend now)."""
    total = session.scalar(
        select(func.coalesce(func.sum(Instance.hourly_micro), 0)).where(
            Instance.owner_id == user_id, Instance.status.in_(SPENDING)
        )
    )
    return int(total or 0)


def month_spend(session: Session, user_id: int, now: datetime, team_id: int | None = None) -> int:
    """What the user spent since the start of the month (UTC): from their own wallet, or,
    with team_id, what they charged to that team's wallet."""
    account = ledger.wallet_account(session, user_id, team_id)
    total = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount), 0))
        .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
        .where(
            LedgerEntry.account_id == account,
            LedgerTransaction.kind.in_(SPEND_KINDS),
            LedgerTransaction.user_id == user_id,
            LedgerTransaction.created_at >= month_start(now),
        )
    )
    return -int(total or 0)


def set_user_caps(
    session: Session,
    user_id: int,
    now: datetime,
    *,
    max_hourly_micro: int | None,
    monthly_budget_micro: int | None,
    low_balance_micro: int | None,
    symbol: str,
) -> Caps:
    """The user's own caps. Each must respect the admin ceiling and be above what is
    already spent (a cap below it could only stop things, not prevent them)."""
    row = _row(session, user_id)
    _check(session, user_id, now, max_hourly_micro, monthly_budget_micro, symbol)
    admin_hourly, admin_monthly = row.admin_max_hourly_micro, row.admin_monthly_budget_micro
    if (
        max_hourly_micro is not None
        and admin_hourly is not None
        and max_hourly_micro > admin_hourly
    ):
        raise InvalidInput(
            f"an admin caps your hourly spend at "
            f"{format_credits(admin_hourly, symbol)}/h; set at most that"
        )
    if (
        monthly_budget_micro is not None
        and admin_monthly is not None
        and monthly_budget_micro > admin_monthly
    ):
        raise InvalidInput(
            f"an admin caps your monthly budget at "
            f"{format_credits(admin_monthly, symbol)}; set at most that"
        )
    if low_balance_micro is not None and low_balance_micro < 0:
        raise InvalidInput("the low-balance threshold cannot be negative")
    row.max_hourly_micro = max_hourly_micro
    row.monthly_budget_micro = monthly_budget_micro
    row.low_balance_micro = low_balance_micro
    return caps_of(session, user_id)


def set_admin_caps(
    session: Session,
    user_id: int,
    now: datetime,
    *,
    max_hourly_micro: int | None,
    monthly_budget_micro: int | None,
    symbol: str,
) -> Caps:
    row = _row(session, user_id)
    _check(session, user_id, now, max_hourly_micro, monthly_budget_micro, symbol)
    row.admin_max_hourly_micro = max_hourly_micro
    row.admin_monthly_budget_micro = monthly_budget_micro
    return caps_of(session, user_id)


def _check(
    session: Session,
    user_id: int,
    now: datetime,
    hourly: int | None,
    monthly: int | None,
    symbol: str,
) -> None:
    for value in (hourly, monthly):
        if value is not None and not 0 <= value <= ledger.MAX_GRANT_MICRO:
            raise InvalidInput("a cap must be between 0 and a billion credits")
    if hourly is not None and hourly < (spend := hourly_spend(session, user_id)):
        raise InvalidInput(
            f"that hourly cap ({format_credits(hourly, symbol)}/h) is below what your live "
            f"instances cost now ({format_credits(spend, symbol)}/h); stop some first"
        )
    if monthly is not None and monthly < (spent := month_spend(session, user_id, now)):
        raise InvalidInput(
            f"that monthly budget ({format_credits(monthly, symbol)}) is below what you "
            f"spent this month already ({format_credits(spent, symbol)})"
        )


def check_start(
    session: Session,
    user_id: int,
    team_id: int | None,
    hourly_micro: int,
    upfront_micro: int,
    now: datetime,
    symbol: str,
) -> None:
    """Refuse a start that would break a cap, with the numbers."""
    caps = caps_of(session, user_id)
    if caps.hourly is not None:
        spend = hourly_spend(session, user_id)
        if spend + hourly_micro > caps.hourly:
            after = format_credits(spend + hourly_micro, symbol)
            cap = format_credits(caps.hourly, symbol)
            raise PaymentRequired(
                f"this start would raise your spend to {after}/h, above your cap of {cap}/h; "
                "stop an instance or raise the cap with `gpulease limits set`"
            )
    if caps.monthly is not None and team_id is None:
        spent = month_spend(session, user_id, now)
        if spent + upfront_micro > caps.monthly:
            raise PaymentRequired(
                f"your monthly budget is {format_credits(caps.monthly, symbol)} and you spent "
                f"{format_credits(spent, symbol)}; this start needs "
                f"{format_credits(upfront_micro, symbol)} more"
            )
    if team_id is not None:
        limit = session.scalar(
            select(TeamMember.monthly_limit_micro).where(
                TeamMember.team_id == team_id, TeamMember.user_id == user_id
            )
        )
        if limit is not None:
            spent = month_spend(session, user_id, now, team_id)
            if spent + upfront_micro > limit:
                raise PaymentRequired(
                    f"the team lets you spend {format_credits(limit, symbol)} a month and you "
                    f"spent {format_credits(spent, symbol)}; this start needs "
                    f"{format_credits(upfront_micro, symbol)} more; ask the team's owner"
                )


def over_budget(session: Session, user_id: int, team_id: int | None, now: datetime) -> str | None:
    """Why the user's live instances on this wallet must stop now, or None."""
    if team_id is None:
        monthly = caps_of(session, user_id).monthly
        if monthly is not None and month_spend(session, user_id, now) >= monthly:
            return "your monthly budget is spent"
        return None
    limit = session.scalar(
        select(TeamMember.monthly_limit_micro).where(
            TeamMember.team_id == team_id, TeamMember.user_id == user_id
        )
    )
    if limit is not None and month_spend(session, user_id, now, team_id) >= limit:
        return "your monthly limit on the team wallet is spent"
    return None
