"""Statements: a user's GPU time and money for a period, and the operator's revenue.

GPU time comes from usage segments: the seconds a segment has been billed for
([started_at, started_at + billed_seconds)), split at midnight in the statement's time zone,
second by second (a second belongs to the day it starts in), so the days add up to the
segment exactly. Money comes from the ledger: each wallet entry on the day its transaction
was posted. The meter posts running charges every few seconds, so time and money agree by
day except for a charge that straddles midnight.

Nothing here takes a user id from the caller: a statement is always the caller's own.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from gpulease.core.catalog import Catalog
from gpulease.core.errors import InvalidInput
from gpulease.core.money import SECONDS_PER_HOUR, format_credits
from gpulease.schemas.statements import (
    DayUsage,
    GpuModelUsage,
    InstanceUsage,
    KindTotal,
    RevenueDay,
    RevenueLine,
    RevenueModel,
    RevenueModelDay,
    RevenuePublic,
    RevenueTotals,
    StatementLine,
    StatementPublic,
    UsageTotals,
)
from gpulease.server.db import utcnow
from gpulease.server.orm import (
    Instance,
    LedgerAccount,
    LedgerEntry,
    LedgerTransaction,
    Team,
    UsageSegment,
    User,
)
from gpulease.server.services import ledger

MAX_DAYS = 366
# The kind that carries GPU time in statement lines (the meter's charges).
TIME_KIND = "usage"
PERSONAL = "personal"
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MICROSECONDS = 1_000_000
K = TypeVar("K")


# -- the period -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Period:
    """Whole days from start to end (both included) in a time zone."""

    start: date
    end: date
    zone: ZoneInfo

    @property
    def tz(self) -> str:
        return self.zone.key

    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    def midnight(self, day: date) -> datetime:
        """The UTC instant a day begins in the period's zone."""
        return datetime.combine(day, time(0), tzinfo=self.zone).astimezone(UTC)

    @property
    def begins(self) -> datetime:
        return self.midnight(self.start)

    @property
    def ends(self) -> datetime:
        return self.midnight(self.end + timedelta(days=1))

    def day_of(self, moment: datetime) -> date:
        return moment.astimezone(self.zone).date()


def zone(name: str | None) -> ZoneInfo:
    text = (name or "UTC").strip() or "UTC"
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"tz {text!r} is not a time zone; use a name like UTC or Europe/Berlin"
        ) from None


def _date(name: str, text: str) -> date:
    text = text.strip()
    if DATE_RE.match(text):
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass
    raise InvalidInput(f"{name} must be a date like 2026-11-01 (YYYY-MM-DD), not {text!r}")


def _month_end(day: date) -> date:
    first_of_next = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
    return first_of_next - timedelta(days=1)


def parse_period(
    start: str | None, end: str | None, tz: str | None = "UTC", *, now: datetime | None = None
) -> Period:
    """A statement's period from what people type. Neither date: this calendar month in the
    zone; only one: the rest of that one's month. At most MAX_DAYS days."""
    where = zone(tz)
    first = _date("from", start) if start and start.strip() else None
    last = _date("to", end) if end and end.strip() else None
    if first is None and last is None:
        today = (now or utcnow()).astimezone(where).date()
        first, last = today.replace(day=1), _month_end(today)
    elif first is None:
        assert last is not None
        first = last.replace(day=1)
    elif last is None:
        last = _month_end(first)
    if first > last:
        raise InvalidInput(f"from ({first}) is after to ({last}); swap them")
    days = (last - first).days + 1
    if days > MAX_DAYS:
        raise InvalidInput(
            f"from {first} to {last} is {days} days; a statement covers at most {MAX_DAYS} "
            "days, so ask for one year at a time"
        )
    return Period(first, last, where)


# -- splitting GPU time by day ----------------------------------------------------------------


def _seconds_before(start: datetime, moment: datetime, seconds: int) -> int:
    """How many of a segment's whole seconds (second k starts at start + k) start before
    `moment`: ceil(moment - start), clipped to 0..seconds."""
    micro = (moment - start) // timedelta(microseconds=1)
    return min(max(-(-micro // MICROSECONDS), 0), seconds)


def split_by_day(period: Period, start: datetime, seconds: int) -> dict[date, int]:
    """The seconds of [start, start + seconds) that fall on each day of the period."""
    if seconds <= 0:
        return {}
    out: dict[date, int] = {}
    first = max(period.day_of(start), period.start)
    last = min(period.day_of(start + timedelta(seconds=seconds)), period.end)
    day = first
    while day <= last:
        count = _seconds_before(start, period.midnight(day + timedelta(days=1)), seconds)
        count -= _seconds_before(start, period.midnight(day), seconds)
        if count:
            out[day] = count
        day += timedelta(days=1)
    return out


def _segments(session: Session, period: Period, owner_id: int | None) -> list[UsageSegment]:
    query = select(UsageSegment).where(
        UsageSegment.started_at < period.ends,
        or_(UsageSegment.ended_at.is_(None), UsageSegment.ended_at > period.begins),
    )
    if owner_id is not None:
        query = query.where(UsageSegment.owner_id == owner_id)
    return list(session.scalars(query.order_by(UsageSegment.id)))


# -- adding up ---------------------------------------------------------------------------------


@dataclass
class _Sum:
    seconds: int = 0
    gpu_seconds: int = 0
    charged: int = 0
    credited: int = 0
    transactions: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def time(self, seconds: int, gpus: int) -> None:
        self.seconds += seconds
        self.gpu_seconds += seconds * gpus

    def money(self, kind: str, amount: int) -> None:
        self.transactions += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + amount
        if amount < 0:
            self.charged -= amount
        else:
            self.credited += amount

    def usage(self, symbol: str) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": round(self.gpu_seconds / SECONDS_PER_HOUR, 4),
            "charged_micro": self.charged,
            "charged": format_credits(self.charged, symbol),
            "credited_micro": self.credited,
            "credited": format_credits(self.credited, symbol),
            "by_kind": dict(sorted(self.by_kind.items())),
        }

    def revenue(self, symbol: str) -> dict[str, object]:
        total = sum(self.by_kind.values())
        return {
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": round(self.gpu_seconds / SECONDS_PER_HOUR, 4),
            "revenue_micro": total,
            "revenue": format_credits(total, symbol),
            "by_kind": dict(sorted(self.by_kind.items())),
        }


def _grouped(items: Iterable[tuple[K, _Sum]]) -> dict[K, _Sum]:
    """Merge (key, sum) pairs by key."""
    out: dict[K, _Sum] = {}
    for key, part in items:
        acc = out.setdefault(key, _Sum())
        acc.seconds += part.seconds
        acc.gpu_seconds += part.gpu_seconds
        acc.charged += part.charged
        acc.credited += part.credited
        acc.transactions += part.transactions
        for kind, amount in part.by_kind.items():
            acc.by_kind[kind] = acc.by_kind.get(kind, 0) + amount
    return out


def _total(items: Iterable[tuple[object, _Sum]]) -> _Sum:
    return _grouped((0, part) for _, part in items).get(0, _Sum())


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


# -- a user's statement ------------------------------------------------------------------------


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
    segments = _segments(session, period, user.id)
    money = _wallet_rows(session, user, period)
    teams = _team_names(session, {s.team_id for s in segments if s.team_id is not None})
    info = _instances(
        session, user, {s.instance_id for s in segments} | {m[4] for m in money if m[4]}
    )
    for s in segments:  # what a segment held, even if its instance changed since
        info.setdefault(s.instance_id, _InstanceInfo(f"#{s.instance_id}", "?", 0))
        info[s.instance_id] = _InstanceInfo(info[s.instance_id].name, s.gpu_model, s.gpu_count)

    lines: dict[_LineKey, _Sum] = {}
    for s in segments:
        wallet = _wallet_label(None if s.team_id is None else teams.get(s.team_id, "?"))
        for day, seconds in split_by_day(period, s.started_at, s.billed_seconds).items():
            lines.setdefault((day, wallet, s.instance_id, TIME_KIND), _Sum()).time(
                seconds, s.gpu_count
            )
    for wallet, kind, posted, amount, instance_id in money:
        key = (period.day_of(posted), wallet, instance_id, kind)
        lines.setdefault(key, _Sum()).money(kind, amount)
    ordered = sorted(lines.items(), key=lambda item: _order(item[0]))

    def about(instance_id: int | None) -> _InstanceInfo | None:
        return None if instance_id is None else info.get(instance_id)

    def model_of(instance_id: int | None) -> str | None:
        found = about(instance_id)
        return found.gpu_model if found else None

    by_day = _grouped((key[0], part) for key, part in ordered)
    by_instance = _grouped((key[2], part) for key, part in ordered if key[2] is not None)
    by_model = _grouped(
        (model, part) for key, part in ordered if (model := model_of(key[2])) is not None
    )
    by_kind = _grouped((key[3], part) for key, part in ordered if part.transactions)
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
        totals=UsageTotals.model_validate(_total(ordered).usage(symbol)),
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


# -- the operator's revenue --------------------------------------------------------------------


def revenue(session: Session, period: Period, catalog: Catalog) -> RevenuePublic:
    """Revenue (the revenue account's entries) and GPU time sold, per GPU model per day."""
    symbol = catalog.currency_symbol
    lines: dict[tuple[date, str | None, str], _Sum] = {}
    for s in _segments(session, period, None):
        for day, seconds in split_by_day(period, s.started_at, s.billed_seconds).items():
            lines.setdefault((day, s.gpu_model, TIME_KIND), _Sum()).time(seconds, s.gpu_count)
    rows = session.execute(
        select(
            LedgerTransaction.kind,
            LedgerTransaction.created_at,
            LedgerEntry.amount,
            Instance.gpu_model,
        )
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .outerjoin(Instance, Instance.id == LedgerTransaction.instance_id)
        .where(
            LedgerAccount.kind == ledger.REVENUE,
            LedgerTransaction.created_at >= period.begins,
            LedgerTransaction.created_at < period.ends,
        )
    ).all()
    for kind, posted, amount, model in rows:
        lines.setdefault((period.day_of(posted), model, kind), _Sum()).money(kind, int(amount))

    def order(key: tuple[date, str | None, str]) -> tuple[date, str, str]:
        return key[0], key[1] or "", key[2]

    ordered = sorted(lines.items(), key=lambda item: order(item[0]))
    by_day = _grouped((key[0], part) for key, part in ordered)
    by_model = _grouped((key[1], part) for key, part in ordered)
    by_model_day = _grouped(((key[0], key[1]), part) for key, part in ordered)
    return RevenuePublic(
        start=period.start,
        end=period.end,
        tz=period.tz,
        currency=catalog.currency_name,
        currency_symbol=symbol,
        totals=RevenueTotals.model_validate(_total(ordered).revenue(symbol)),
        by_gpu_model=[
            RevenueModel.model_validate({"gpu_model": model, **part.revenue(symbol)})
            for model, part in sorted(by_model.items(), key=lambda item: item[0] or "")
        ],
        by_day=[
            RevenueDay.model_validate({"day": day, **by_day.get(day, _Sum()).revenue(symbol)})
            for day in period.days()
        ],
        by_model_day=[
            RevenueModelDay.model_validate({"day": day, "gpu_model": model, **part.revenue(symbol)})
            for (day, model), part in by_model_day.items()
        ],
        lines=[
            RevenueLine(
                day=day,
                gpu_model=model,
                kind=kind,
                gpu_seconds=part.gpu_seconds,
                revenue_micro=sum(part.by_kind.values()),
                revenue=format_credits(sum(part.by_kind.values()), symbol),
            )
            for (day, model, kind), part in ordered
        ],
    )


# -- CSV -------------------------------------------------------------------------------------


STATEMENT_COLUMNS = (
    "day",
    "wallet",
    "instance_id",
    "instance",
    "gpu_model",
    "gpu_count",
    "kind",
    "seconds",
    "gpu_seconds",
    "gpu_hours",
    "amount_micro",
    "amount",
)
REVENUE_COLUMNS = (
    "day",
    "gpu_model",
    "kind",
    "gpu_seconds",
    "gpu_hours",
    "revenue_micro",
    "revenue",
)


def _csv(columns: tuple[str, ...], rows: Iterable[tuple[object, ...]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if cell is None else cell for cell in row])
    return out.getvalue()


def _hours(gpu_seconds: int) -> str:
    return f"{gpu_seconds / SECONDS_PER_HOUR:.4f}"


def statement_csv(statement: StatementPublic) -> str:
    """The statement's lines, one per day × wallet × instance × kind; amounts in credits
    with all six decimals (no currency symbol) beside the exact micro-credits."""
    return _csv(
        STATEMENT_COLUMNS,
        (
            (
                line.day.isoformat(),
                line.wallet,
                line.instance_id,
                line.instance,
                line.gpu_model,
                line.gpu_count,
                line.kind,
                line.seconds,
                line.gpu_seconds,
                _hours(line.gpu_seconds),
                line.amount_micro,
                format_credits(line.amount_micro, "", 6),
            )
            for line in statement.lines
        ),
    )


def revenue_csv(report: RevenuePublic) -> str:
    return _csv(
        REVENUE_COLUMNS,
        (
            (
                line.day.isoformat(),
                line.gpu_model,
                line.kind,
                line.gpu_seconds,
                _hours(line.gpu_seconds),
                line.revenue_micro,
                format_credits(line.revenue_micro, "", 6),
            )
            for line in report.lines
        ),
    )
