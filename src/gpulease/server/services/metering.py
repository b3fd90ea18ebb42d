"""Usage segments and charging them: per second, in micro-credits, exactly once.

A segment's total charge is always core.pricing.price_seconds(start, billed_seconds, rate,
its off-peak windows) (for a segment without windows, cost_for_seconds(rate, seconds)); each
tick posts
only the difference from what was charged, under an idempotency key naming the segment and
the second it bills up to, and moves billed_seconds with a guarded UPDATE in the same
transaction. A crash before commit loses nothing (the next tick bills the same seconds); a
replay after commit finds the key and posts nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import String, bindparam, select, text, type_coerce, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from gpulease.core.money import cost_for_seconds
from gpulease.core.pricing import OffPeakWindow, price_seconds
from gpulease.server.db import utcnow
from gpulease.server.orm import Instance, UsageSegment, UTCDateTime
from gpulease.server.services import ledger
from gpulease.server.services.billing import offpeak, plans


def open_segment(session: Session, instance: Instance, at: datetime) -> UsageSegment:
    """Start billing an instance. Daily instances are prepaid: their segments record the
    GPU time at rate 0. On-demand and spot segments keep the off-peak windows of now."""
    prepaid = instance.plan == plans.DAILY
    segment = UsageSegment(
        instance_id=instance.id,
        owner_id=instance.owner_id,
        team_id=instance.team_id,
        gpu_model=instance.gpu_model,
        gpu_count=instance.gpu_count,
        hourly_micro=0 if prepaid else instance.hourly_micro,
        plan=instance.plan,
        offpeak={} if prepaid else offpeak.snapshot(session),
        started_at=at,
        billed_seconds=0,
        charged_micro=0,
    )
    session.add(segment)
    session.flush()
    return segment


def open_segment_of(session: Session, instance_id: int) -> UsageSegment | None:
    return session.scalar(
        select(UsageSegment).where(
            UsageSegment.instance_id == instance_id, UsageSegment.ended_at.is_(None)
        )
    )


def _memo(segment: Any, start: int, end: int) -> str:
    """A usage charge's memo; segment: a UsageSegment or a row with its columns."""
    return (
        f"{segment.gpu_model} × {segment.gpu_count} {segment.plan}, "
        f"segment {segment.id}, seconds {start}–{end}"
    )


def charge_segment(session: Session, segment: UsageSegment, upto: datetime) -> int:
    """Bill segment for the whole seconds between its start and `upto`. Returns the amount
    charged now (0 when there is nothing new). Safe to call again with the same `upto`, and
    when another replica bills the same segment meanwhile (it then bills what is left)."""
    seconds = max(0, math.floor((upto - segment.started_at).total_seconds()))
    charged_now = 0
    while seconds > segment.billed_seconds:
        due = segment_price(segment, seconds)
        amount = due - segment.charged_micro
        if not _move_billed(session, segment, seconds, due):
            session.refresh(segment)  # another replica billed it meanwhile: bill the rest
            continue
        if amount > 0:
            ledger.charge_usage(
                session,
                segment.owner_id,
                segment.instance_id,
                amount,
                key=f"usage:{segment.id}:{seconds}",
                memo=_memo(segment, segment.billed_seconds, seconds),
                team_id=segment.team_id,
                at=upto,
            )
        set_committed_value(segment, "billed_seconds", seconds)
        set_committed_value(segment, "charged_micro", due)
        charged_now += amount
    return charged_now


def _move_billed(session: Session, segment: UsageSegment, seconds: int, due: int) -> bool:
    """Set the segment's billed seconds and charge, guarded by the billed seconds it was read
    with; False when another replica moved them meanwhile."""
    result = session.execute(
        update(UsageSegment)
        .where(
            UsageSegment.id == segment.id,
            UsageSegment.billed_seconds == segment.billed_seconds,
        )
        .values(billed_seconds=seconds, charged_micro=due)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def segment_price(segment: UsageSegment, seconds: int) -> int:
    """What the first `seconds` seconds of a segment cost, exactly."""
    windows = offpeak.from_snapshot(segment.offpeak or {})
    return _price(segment.started_at, segment.hourly_micro, windows, seconds)


def _price(
    started_at: datetime, hourly_micro: int, windows: list[OffPeakWindow], seconds: int
) -> int:
    if not windows:
        return cost_for_seconds(hourly_micro, seconds)
    return price_seconds(started_at, seconds, hourly_micro, windows)


def close_segment(session: Session, instance: Instance, at: datetime) -> None:
    segment = open_segment_of(session, instance.id)
    if segment is None:
        return
    at = max(at, segment.started_at)
    charge_segment(session, segment, at)
    refund_past(session, segment, at)
    segment.ended_at = at


def refund_past(session: Session, segment: UsageSegment, end: datetime) -> int:
    """Give back what the meter billed past `end`: it bills open segments up to now, and a
    segment may end earlier than the tick that closes it (at a dead runner's last
    heartbeat). Leaves the segment charged exactly its whole seconds up to `end`; returns
    the amount given back."""
    seconds = max(0, math.floor((end - segment.started_at).total_seconds()))
    refunded = 0
    while seconds < segment.billed_seconds:
        due = segment_price(segment, seconds)
        amount = segment.charged_micro - due
        if not _move_billed(session, segment, seconds, due):
            session.refresh(segment)  # another replica billed it meanwhile
            continue
        if amount > 0:
            ledger.post(
                session,
                kind="usage",
                key=f"usage-refund:{segment.id}:{segment.billed_seconds}:{seconds}",
                legs=[
                    (ledger.account_id(session, ledger.REVENUE), -amount),
                    (ledger.wallet_account(session, segment.owner_id, segment.team_id), amount),
                ],
                memo=f"refund of {_memo(segment, seconds, segment.billed_seconds)}, "
                "billed past its end",
                user_id=segment.owner_id,
                instance_id=segment.instance_id,
            )
        set_committed_value(segment, "billed_seconds", seconds)
        set_committed_value(segment, "charged_micro", due)
        refunded += amount
    return refunded


def charge_open_segments(
    session: Session, now: datetime | None = None, *, min_step_s: int = 0
) -> set[int]:
    """Bill every open segment up to now, in bulk. Returns the owners that were charged.

    min_step_s skips segments billed less than that many seconds ago, so a long rental
    makes one ledger transaction per step rather than one per second; closing a segment
    always bills it to the second. The segments are locked for the tick (skipping rows
    another replica holds), so the bill computed from them is the one written.

    The prices are computed here (core.pricing); the writes are three set-based statements
    over the bills passed as one JSON parameter (transactions, their two legs each, the
    segments' new billed_seconds), so that the database, not a Python loop per row, does
    the per-segment work.
    """
    now = now or utcnow()
    # started_at and offpeak come raw (a string on SQLite) and are decoded here, once per
    # distinct value: 10,000 rows through the column types cost more than the writes
    open_segments = session.execute(
        select(
            UsageSegment.id,
            UsageSegment.instance_id,
            UsageSegment.owner_id,
            UsageSegment.team_id,
            UsageSegment.gpu_model,
            UsageSegment.gpu_count,
            UsageSegment.plan,
            UsageSegment.hourly_micro,
            type_coerce(UsageSegment.offpeak, String()).label("offpeak"),
            type_coerce(UsageSegment.started_at, String()).label("started_at"),
            UsageSegment.billed_seconds,
            UsageSegment.charged_micro,
        )
        .where(UsageSegment.ended_at.is_(None))
        .order_by(UsageSegment.id)
        .with_for_update(skip_locked=True)
    ).all()
    windows_of: dict[str, list[OffPeakWindow]] = {}
    bills: list[tuple[Any, int, int]] = []  # (segment row, seconds, due)
    for seg in open_segments:
        started_at = _aware(seg.started_at)
        elapsed = (now - started_at).total_seconds()
        seconds = max(0, math.floor(elapsed))
        if seconds <= seg.billed_seconds or elapsed - seg.billed_seconds < min_step_s:
            continue
        raw = seg.offpeak if isinstance(seg.offpeak, str) else json.dumps(seg.offpeak)
        if raw not in windows_of:
            windows_of[raw] = offpeak.from_snapshot(json.loads(raw) or {})
        due = _price(started_at, seg.hourly_micro, windows_of[raw], seconds)
        bills.append((seg, seconds, due))
    if not bills:
        return set()
    revenue = ledger.account_id(session, ledger.REVENUE)
    wallets = ledger.wallet_accounts(session, {(s.owner_id, s.team_id) for s, _, _ in bills})
    charged = [(s, sec, due - s.charged_micro) for s, sec, due in bills if due > s.charged_micro]
    params = {
        "now": now,
        "revenue": revenue,
        "txns": _json(
            [f"usage:{s.id}:{sec}", _memo(s, s.billed_seconds, sec), s.owner_id, s.instance_id]
            for s, sec, _ in charged
        ),
        "legs": _json(
            [f"usage:{s.id}:{sec}", wallets[(s.owner_id, s.team_id)], amount]
            for s, sec, amount in charged
        ),
        "segments": _json([s.id, sec, due] for s, sec, due in bills),
    }
    postgres = session.get_bind().dialect.name == "postgresql"
    for template, sources in _TICK_STATEMENTS:
        if not charged and ":txns" in str(sources):
            continue
        statement = template.format(
            **{name: _rows(name, columns, postgres) for name, columns in sources.items()}
        )
        sql = text(statement)
        if ":now" in statement:
            sql = sql.bindparams(bindparam("now", type_=UTCDateTime()))
        session.execute(sql, {k: v for k, v in params.items() if f":{k}" in statement})
    billed = {s.id: (sec, due) for s, sec, due in bills}
    for held in list(session.identity_map.values()):  # ORM copies the caller holds
        if isinstance(held, UsageSegment) and held.id in billed:
            set_committed_value(held, "billed_seconds", billed[held.id][0])
            set_committed_value(held, "charged_micro", billed[held.id][1])
    return {s.owner_id for s, _, _ in charged}


def _aware(value: datetime | str) -> datetime:
    """A UTC datetime from what the driver gives for a UTCDateTime read raw."""
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _json(rows: Iterable[list[Any]]) -> str:
    return json.dumps(list(rows), ensure_ascii=False, separators=(",", ":"))


def _rows(param: str, columns: tuple[tuple[str, str], ...], postgres: bool) -> str:
    """A subquery of the rows that the JSON array of arrays :param holds."""
    if postgres:
        picked = ", ".join(
            f"CAST(e->>{i} AS {kind}) AS {name}" for i, (name, kind) in enumerate(columns)
        )
        return f"(SELECT {picked} FROM jsonb_array_elements(CAST(:{param} AS jsonb)) AS e)"
    picked = ", ".join(f"value ->> {i} AS {name}" for i, (name, _) in enumerate(columns))
    return f"(SELECT {picked} FROM json_each(:{param}))"


_TXNS = (("key", "text"), ("memo", "text"), ("owner_id", "bigint"), ("instance_id", "bigint"))
_LEGS = (("key", "text"), ("wallet", "bigint"), ("amount", "bigint"))
_SEGMENTS = (("id", "bigint"), ("seconds", "bigint"), ("due", "bigint"))
_TICK_STATEMENTS: tuple[tuple[str, dict[str, tuple[tuple[str, str], ...]]], ...] = (
    (
        "INSERT INTO ledger_transactions "
        "(kind, idempotency_key, memo, user_id, instance_id, created_at) "
        "SELECT 'usage', b.key, b.memo, b.owner_id, b.instance_id, :now FROM {txns} AS b",
        {"txns": _TXNS},
    ),
    (  # each transaction's two legs: the wallet pays, revenue earns
        "INSERT INTO ledger_entries (transaction_id, account_id, amount, created_at) "
        "SELECT t.id, CASE WHEN leg.n = 0 THEN b.wallet ELSE :revenue END, "
        "CASE WHEN leg.n = 0 THEN -b.amount ELSE b.amount END, :now "
        "FROM {legs} AS b JOIN ledger_transactions AS t ON t.idempotency_key = b.key "
        "CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1) AS leg ORDER BY t.id, leg.n",
        {"legs": _LEGS},
    ),
    (
        "UPDATE usage_segments SET billed_seconds = b.seconds, charged_micro = b.due "
        "FROM {segments} AS b WHERE usage_segments.id = b.id",
        {"segments": _SEGMENTS},
    ),
)


def list_segments(session: Session, owner_id: int, limit: int = 200) -> list[UsageSegment]:
    return list(
        session.scalars(
            select(UsageSegment)
            .where(UsageSegment.owner_id == owner_id)
            .order_by(UsageSegment.id.desc())
            .limit(limit)
        )
    )
