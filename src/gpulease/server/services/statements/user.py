"""A user's statement: their GPU time and money in a period, by instance, day, model, kind.

Nothing here takes a user id from the caller: a statement is always the caller's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.money import format_credits
from gpulease.core.periods import Period, split_by_day
from gpulease.schemas.statements import (
    DayUsage,
    GpuModelUsage,
    InstanceUsage,
    KindTotal,
    StatementLine,
    StatementPublic,
    UsageTotals,
)
from gpulease.server.orm import Instance, LedgerAccount, LedgerEntry, LedgerTransaction, Team, User
from gpulease.server.services import ledger
from gpulease.server.services.statements.segments import TIME_KIND, segments_in
from gpulease.server.services.statements.sums import Sum, grouped, total

PERSONAL = "personal"


@dataclass(frozen=True)
class _InstanceInfo:
    name: str
    gpu_model: str
    gpu_count: int


# A statement line's key: day, wallet, instance id (None: not an instance's), kind.
_LineKey = tuple[date, str, int | None, str]


def _order(key: _LineKey) -> tuple[date, str, int, str]:
    day, wallet, instance_id, kind = key
    return day, wallet, -1 if instance_id is None else instance_id, kind


_Money = tuple[str, str, datetime, int, int | None]
"""(wallet, kind, posted at, signed amount, instance id)."""


def _wallet_label(team: str | None) -> str:
    return PERSONAL if team is None else f"team {team}"


def _team_names(session: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    rows = session.execute(select(Team.id, Team.name).where(Team.id.in_(sorted(ids))))
    return {int(i): str(name) for i, name in rows}


def _wallet_rows(session: Session, user: User, period: Period) -> list[_Money]:
    """The user's money in the period: every entry on their own wallet, and their own
    charges to a team's wallet (a team's grants are the team owner's business)."""
    window = (
        LedgerTransaction.created_at >= period.begins,
        LedgerTransaction.created_at < period.ends,
    )
    columns = (
        LedgerTransaction.kind,
        LedgerTransaction.created_at,
        LedgerEntry.amount,
        LedgerTransaction.instance_id,
        Team.name,
    )
    rows = session.execute(
        select(*columns)
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .outerjoin(Team, Team.id == LedgerAccount.team_id)
        .where(
            or_(
                and_(LedgerAccount.kind == ledger.WALLET, LedgerAccount.user_id == user.id),
                and_(
                    LedgerAccount.kind == ledger.TEAM_WALLET,
                    LedgerTransaction.user_id == user.id,
                    LedgerEntry.amount < 0,
                ),
            ),
            *window,
        )
        .order_by(LedgerTransaction.id)
    ).all()
    return [
        (_wallet_label(team), str(kind), posted, int(amount), instance_id)
        for kind, posted, amount, instance_id, team in rows
    ]


def _own_balance_before(session: Session, user: User, moment: datetime) -> int:
    total = session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount), 0))
        .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .where(
            LedgerAccount.kind == ledger.WALLET,
            LedgerAccount.user_id == user.id,
            LedgerTransaction.created_at < moment,
        )
    )
    return int(total or 0)


def _instances(session: Session, owner: User, ids: set[int]) -> dict[int, _InstanceInfo]:
    if not ids:
        return {}
    rows = session.execute(
        select(Instance.id, Instance.name, Instance.gpu_model, Instance.gpu_count).where(
            Instance.id.in_(sorted(ids)), Instance.owner_id == owner.id
        )
    )
    return {int(i): _InstanceInfo(name, model, int(count)) for i, name, model, count in rows}


def user_statement(
    session: Session, user: User, period: Period, catalog: Catalog
) -> StatementPublic:
    """The caller's GPU time and money in the period, by instance, day, GPU model and kind."""
    symbol = catalog.currency_symbol
    segments = segments_in(session, period, user.id)
    money = _wallet_rows(session, user, period)
    teams = _team_names(session, {s.team_id for s in segments if s.team_id is not None})
    info = _instances(
        session, user, {s.instance_id for s in segments} | {m[4] for m in money if m[4]}
    )
    for s in segments:  # what a segment held, even if its instance changed since
        info.setdefault(s.instance_id, _InstanceInfo(f"#{s.instance_id}", "?", 0))
        info[s.instance_id] = _InstanceInfo(info[s.instance_id].name, s.gpu_model, s.gpu_count)

    lines: dict[_LineKey, Sum] = {}
    for s in segments:
        wallet = _wallet_label(None if s.team_id is None else teams.get(s.team_id, "?"))
        for day, seconds in split_by_day(period, s.started_at, s.billed_seconds).items():
            lines.setdefault((day, wallet, s.instance_id, TIME_KIND), Sum()).time(
                seconds, s.gpu_count
            )
    for wallet, kind, posted, amount, instance_id in money:
        key = (period.day_of(posted), wallet, instance_id, kind)
        lines.setdefault(key, Sum()).money(kind, amount)
    ordered = sorted(lines.items(), key=lambda item: _order(item[0]))

    def about(instance_id: int | None) -> _InstanceInfo | None:
        return None if instance_id is None else info.get(instance_id)

    def model_of(instance_id: int | None) -> str | None:
        found = about(instance_id)
        return found.gpu_model if found else None

    by_day = grouped((key[0], part) for key, part in ordered)
    by_instance = grouped((key[2], part) for key, part in ordered if key[2] is not None)
    by_model = grouped(
        (model, part) for key, part in ordered if (model := model_of(key[2])) is not None
    )
    by_kind = grouped((key[3], part) for key, part in ordered if part.transactions)
    opening = _own_balance_before(session, user, period.begins)
    closing = opening + sum(m[3] for m in money if m[0] == PERSONAL)
    return StatementPublic(
        user=user.name,
        start=period.start,
        end=period.end,
        tz=period.tz,
        currency=catalog.currency_name,
        currency_symbol=symbol,
        opening_balance_micro=opening,
        opening_balance=format_credits(opening, symbol),
        closing_balance_micro=closing,
        closing_balance=format_credits(closing, symbol),
        totals=UsageTotals.model_validate(total(ordered).usage(symbol)),
        by_kind=[
            KindTotal(
                kind=kind,
                transactions=part.transactions,
                amount_micro=sum(part.by_kind.values()),
                amount=format_credits(sum(part.by_kind.values()), symbol),
            )
            for kind, part in sorted(by_kind.items())
        ],
        by_day=[
            DayUsage.model_validate({"day": day, **part.usage(symbol)})
            for day, part in sorted(by_day.items())
        ],
        by_instance=[
            InstanceUsage.model_validate(
                {
                    "instance_id": instance_id,
                    "name": info[instance_id].name if instance_id in info else f"#{instance_id}",
                    "gpu_model": model_of(instance_id) or "?",
                    "gpu_count": info[instance_id].gpu_count if instance_id in info else 0,
                    **part.usage(symbol),
                }
            )
            for instance_id, part in sorted(by_instance.items(), key=lambda item: item[0] or 0)
        ],
        by_gpu_model=[
            GpuModelUsage.model_validate({"gpu_model": model, **part.usage(symbol)})
            for model, part in sorted(by_model.items())
        ],
        lines=[
            StatementLine(
                day=day,
                wallet=wallet,
                instance_id=instance_id,
                instance=found.name if (found := about(instance_id)) else None,
                gpu_model=found.gpu_model if found else None,
                gpu_count=found.gpu_count if found else 0,
                kind=kind,
                seconds=part.seconds,
                gpu_seconds=part.gpu_seconds,
                amount_micro=sum(part.by_kind.values()),
                amount=format_credits(sum(part.by_kind.values()), symbol),
            )
            for (day, wallet, instance_id, kind), part in ordered
        ],
    )
