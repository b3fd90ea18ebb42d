"""The ledger as a bill: a wallet's movements in a period, the meter's many small charges
grouped into one line per instance session (usage segment) and day, in plain words.

A read-side view only: the ledger keeps every charge as posted. The meter posts a charge
every few seconds, keyed `usage:<segment>:<seconds>` (a refund `usage-refund:<segment>:...`),
and storage meters post theirs keyed `storage:<meter>:...`; those are grouped by segment or
meter and the day they were posted on. Every other movement (grants, vouchers, daily blocks)
is a line of its own. Lines that come to zero are left out. A line's time is the session's
seconds on that day (split at the period zone's midnight, as statements split them); its
amount is what was posted that day, so a charge that straddles midnight counts on the day it
was posted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from zoneinfo import ZoneInfo

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpulease.core.durations import span
from gpulease.core.money import format_credits
from gpulease.core.periods import Period, split_by_day
from gpulease.schemas.bill import BillLinePublic
from gpulease.server.orm import (
    Instance,
    LedgerAccount,
    LedgerEntry,
    LedgerTransaction,
    UsageSegment,
)
from gpulease.server.services import ledger

_GROUPED = ("usage", "usage-refund", "storage")  # key prefixes that group by their first id


@dataclass(frozen=True)
class WalletRow:
    """One movement of a wallet, as the ledger holds it."""

    id: int
    kind: str
    key: str
    memo: str
    instance_id: int | None
    created_at: datetime
    amount_micro: int


@dataclass(frozen=True)
class SessionInfo:
    """A usage segment as its bill line names it."""

    instance: str
    gpu_model: str
    gpu_count: int
    plan: str
    started_at: datetime
    billed_seconds: int


def _group(row: WalletRow) -> tuple[str, int] | None:
    """(kind of group, segment or meter id) of a grouped charge; None for a line of its own."""
    prefix, _, rest = row.key.partition(":")
    ident = rest.partition(":")[0]
    if prefix not in _GROUPED or not ident.isdigit():
        return None
    return ("storage" if prefix == "storage" else "usage"), int(ident)


def session_words(info: SessionInfo, seconds: int) -> str:
    """'train: A100-80GB × 1, on demand, 2 h 14 min' (a CPU-only one says 'CPU only')."""
    gpus = f"{info.gpu_model} × {info.gpu_count}" if info.gpu_count else "CPU only"
    return f"{info.instance}: {gpus}, {info.plan.replace('_', ' ')}, {span(seconds)}"


def bill_lines(
    rows: Iterable[WalletRow],
    sessions: Mapping[int, SessionInfo],
    zone: ZoneInfo,
    symbol: str,
) -> list[BillLinePublic]:
    """The rows as bill lines, newest first; zero lines left out."""
    groups: dict[tuple[object, ...], list[WalletRow]] = {}
    for row in rows:
        if row.amount_micro == 0:
            continue  # nothing moved: not a line, not an entry of one
        day = row.created_at.astimezone(zone).date()
        grouped = _group(row)
        key: tuple[object, ...] = (day, *grouped) if grouped else (day, "row", row.id)
        groups.setdefault(key, []).append(row)
    lines = []
    for key, members in groups.items():
        amount = sum(r.amount_micro for r in members)
        if amount == 0:
            continue
        day = members[0].created_at.astimezone(zone).date()
        newest = max(members, key=lambda r: (r.created_at, r.id))
        lines.append(
            BillLinePublic(
                day=day,
                kind=newest.kind,
                text=_words(key, members, newest, sessions, zone, amount),
                amount_micro=amount,
                amount=format_credits(amount, symbol),
                instance_id=newest.instance_id,
                entries=len(members),
                last_at=newest.created_at,
            )
        )
    lines.sort(key=lambda line: line.last_at, reverse=True)
    return lines


def _words(
    key: tuple[object, ...],
    members: list[WalletRow],
    newest: WalletRow,
    sessions: Mapping[int, SessionInfo],
    zone: ZoneInfo,
    amount: int,
) -> str:
    day, group, ident = key
    assert isinstance(day, date) and isinstance(ident, int)
    if group == "usage" and ident in sessions:
        info = sessions[ident]
        one_day = Period(day, day, zone)
        seconds = split_by_day(one_day, info.started_at, info.billed_seconds).get(day, 0)
        words = session_words(info, seconds)
        return words if amount < 0 else f"refund: {words}"  # a wallet pays with negatives
    if group == "storage":
        # the memo up to its measurements: "workspace storage (workspace 12)"
        return newest.memo.partition(",")[0]
    return newest.memo if len(members) == 1 else f"{newest.memo} ({len(members)} entries)"


def wallet_rows(session: Session, user_id: int, period: Period) -> list[WalletRow]:
    """The user's own wallet movements posted in the period, newest first."""
    found = session.execute(
        select(
            LedgerTransaction.id,
            LedgerTransaction.kind,
            LedgerTransaction.idempotency_key,
            LedgerTransaction.memo,
            LedgerTransaction.instance_id,
            LedgerTransaction.created_at,
            LedgerEntry.amount,
        )
        .join(LedgerEntry, LedgerEntry.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == LedgerEntry.account_id)
        .where(
            LedgerAccount.kind == ledger.WALLET,
            LedgerAccount.user_id == user_id,
            LedgerTransaction.created_at >= period.begins,
            LedgerTransaction.created_at < period.ends,
        )
        .order_by(LedgerTransaction.id.desc())
    )
    return [WalletRow(*row) for row in found]


def sessions_of(session: Session, rows: Iterable[WalletRow]) -> dict[int, SessionInfo]:
    """The usage segments the rows' grouped charges belong to, by segment id."""
    ids = {g[1] for g in map(_group, rows) if g and g[0] == "usage"}
    if not ids:
        return {}
    found = session.execute(
        select(UsageSegment, Instance.name)
        .join(Instance, Instance.id == UsageSegment.instance_id)
        .where(UsageSegment.id.in_(ids))
    )
    return {
        seg.id: SessionInfo(
            instance=name,
            gpu_model=seg.gpu_model,
            gpu_count=seg.gpu_count,
            plan=seg.plan,
            started_at=seg.started_at,
            billed_seconds=seg.billed_seconds,
        )
        for seg, name in found
    }


def user_bill(session: Session, user_id: int, period: Period, symbol: str) -> list[BillLinePublic]:
    """The user's own wallet in the period as bill lines, newest first."""
    rows = wallet_rows(session, user_id, period)
    return bill_lines(rows, sessions_of(session, rows), period.zone, symbol)
