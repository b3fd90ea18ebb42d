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
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, String, Text, bindparam, cast, select, text, type_coerce, update
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


# An open segment: the ones charge_open_segments bills (ix_usage_segments_open holds them).
_OPEN = UsageSegment.ended_at.is_(None)


def open_ids() -> Select[int]:
    """The open segments' ids: the meter asks whether there is any (db.finds_any) before it
    opens a write transaction, so that a server with nothing running takes no write lock."""
    return select(UsageSegment.id).where(_OPEN)


def charge_open_segments(
    session: Session, now: datetime | None = None, *, min_step_s: int = 0
) -> set[int]:
    """Bill every open segment up to now, in bulk. Returns the owners that were charged.

    min_step_s skips segments billed less than that many seconds ago, so a long rental
    makes one ledger transaction per step rather than one per second; closing a segment
    always bills it to the second. The segments are locked for the tick (skipping rows
    another replica holds), so the bill computed from them is the one written.

    Python computes each segment's price (core.pricing, exact); the database writes them:
    three set-based statements over one JSON parameter of (segment, seconds, due, amount,
    wallet) rows make the transactions (key and memo as charge_segment writes them), their
    two legs, and the segments' new billed seconds. A Python loop of ORM rows or bound
    parameters per segment costs several times the writes themselves.
    """
    now = (now or utcnow()).astimezone(UTC)
    naive_now = now.replace(tzinfo=None)
    # Core rows, not ORM objects; the offpeak snapshot as its JSON text (decoded once per
    # distinct value here, not once per row by the driver), started_at raw (text on SQLite)
    open_segments = (
        session.connection()
        .execute(
            select(
                UsageSegment.id,
                UsageSegment.owner_id,
                UsageSegment.team_id,
                UsageSegment.hourly_micro,
                cast(UsageSegment.offpeak, Text()),
                type_coerce(UsageSegment.started_at, String()),
                UsageSegment.billed_seconds,
                UsageSegment.charged_micro,
            )
            .where(_OPEN)
            .order_by(UsageSegment.id)
            .with_for_update(skip_locked=True)
        )
        .all()
    )
    windows_of: dict[str | None, list[OffPeakWindow]] = {}
    bills: list[tuple[int, int, int, int, int, int | None]] = []
    for seg_id, owner_id, team_id, hourly, snapshot, started, billed, charged in open_segments:
        if isinstance(started, str):  # SQLite: naive UTC text
            elapsed = (naive_now - datetime.fromisoformat(started)).total_seconds()
        else:
            elapsed = (now - started).total_seconds()
        seconds = math.floor(elapsed)
        if seconds <= billed or elapsed - billed < min_step_s:
            continue
        windows = windows_of.get(snapshot)
        if windows is None:
            decoded = json.loads(snapshot) if snapshot else None
            windows = windows_of[snapshot] = offpeak.from_snapshot(decoded or {})
        if windows:
            due = price_seconds(_aware(started), seconds, hourly, windows)
        else:
            due = cost_for_seconds(hourly, seconds)
        bills.append((seg_id, seconds, due, due - charged, owner_id, team_id))
    if not bills:
        return set()
    wallets = ledger.wallet_accounts(session, {(b[4], b[5]) for b in bills})
    revenue = ledger.account_id(session, ledger.REVENUE)
    if session.get_bind().dialect.name == "postgresql":
        columns = zip(*[(*b[:4], wallets[(b[4], b[5])]) for b in bills], strict=True)
        # each column as one array literal: the driver's per-element array dumping costs more
        # than the statement's parse of it
        arrays = {
            name: "{" + ",".join(map(str, values)) + "}"
            for name, values in zip(_BILL_COLUMNS, columns, strict=True)
        }
        session.execute(_PG_TICK, {**arrays, "now": now, "revenue": revenue})
    else:
        _sqlite_tick(session, bills, wallets, now, revenue)
    billed_now = {b[0]: b for b in bills}
    for held in list(session.identity_map.values()):  # ORM copies the caller holds
        if isinstance(held, UsageSegment) and held.id in billed_now:
            set_committed_value(held, "billed_seconds", billed_now[held.id][1])
            set_committed_value(held, "charged_micro", billed_now[held.id][2])
    return {b[4] for b in bills if b[3] > 0}


def _aware(value: datetime | str) -> datetime:
    """A UTC datetime from what the driver gives for a UTCDateTime read raw."""
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


_BILL_COLUMNS = ("id", "seconds", "due", "amount", "wallet")
_KEY = "'usage:' || b.id || ':' || b.seconds"  # as charge_segment names it
# the memo as _memo writes it, from the segment's columns (s.billed_seconds still the old)
_MEMO = (
    "s.gpu_model || ' × ' || s.gpu_count || ' ' || s.plan || ', segment ' || s.id "
    "|| ', seconds ' || s.billed_seconds || '–' || b.seconds"
)

# PostgreSQL: one statement over the bills as arrays. Each charged bill draws its
# transaction's id from the table's sequence up front, so that its two legs need no lookup
# of the rows just written; the segments' UPDATE reads the same snapshot as the inserts.
# The sequence is found once (a scalar subquery runs once per statement; in the call's
# argument the catalog lookup ran for every row).
_PG_TICK = text(
    "WITH b AS MATERIALIZED (SELECT u.*, CASE WHEN u.amount > 0 THEN "
    "nextval((SELECT CAST(pg_get_serial_sequence('ledger_transactions', 'id') AS regclass))) "
    "END AS tid "
    "FROM unnest(CAST(:id AS bigint[]), CAST(:seconds AS bigint[]), CAST(:due AS bigint[]), "
    "CAST(:amount AS bigint[]), CAST(:wallet AS bigint[])) AS u({columns})), "
    "t AS (INSERT INTO ledger_transactions "
    "(id, kind, idempotency_key, memo, user_id, instance_id, created_at) "
    f"SELECT b.tid, 'usage', {_KEY}, {_MEMO}, s.owner_id, s.instance_id, :now "
    "FROM b JOIN usage_segments AS s ON s.id = b.id WHERE b.amount > 0), "
    "e AS (INSERT INTO ledger_entries (transaction_id, account_id, amount, created_at) "
    "SELECT b.tid, CASE WHEN leg.n = 0 THEN b.wallet ELSE :revenue END, "
    "CASE WHEN leg.n = 0 THEN -b.amount ELSE b.amount END, :now "
    "FROM b CROSS JOIN (VALUES (0), (1)) AS leg(n) WHERE b.amount > 0) "
    "UPDATE usage_segments SET billed_seconds = b.seconds, charged_micro = b.due "
    "FROM b WHERE usage_segments.id = b.id".format(columns=", ".join(_BILL_COLUMNS))
).bindparams(bindparam("now", type_=UTCDateTime()))

# SQLite: the bills go into a temporary table of the connection (parsed once from one JSON
# parameter), which three statements read.
_BILLS_SQLITE = "(SELECT {} FROM json_each(:bills))".format(
    ", ".join(f"value ->> {i} AS {name}" for i, name in enumerate(_BILL_COLUMNS))
)
_SQLITE_BILLS_TABLE = (
    "CREATE TEMP TABLE IF NOT EXISTS tick_bills (id INTEGER PRIMARY KEY, seconds INTEGER, "
    "due INTEGER, amount INTEGER, wallet INTEGER)"
)
_SQLITE_TICK = (
    "INSERT INTO ledger_transactions "
    "(kind, idempotency_key, memo, user_id, instance_id, created_at) "
    f"SELECT 'usage', {_KEY}, {_MEMO}, s.owner_id, s.instance_id, :now "
    "FROM temp.tick_bills AS b JOIN usage_segments AS s ON s.id = b.id WHERE b.amount > 0",
    # each transaction's two legs: the wallet pays, revenue earns (CROSS JOIN keeps the
    # legs the inner loop: each bill's transaction is looked up once)
    "INSERT INTO ledger_entries (transaction_id, account_id, amount, created_at) "
    "SELECT t.id, CASE WHEN leg.n = 0 THEN b.wallet ELSE :revenue END, "
    "CASE WHEN leg.n = 0 THEN -b.amount ELSE b.amount END, :now "
    f"FROM temp.tick_bills AS b JOIN ledger_transactions AS t ON t.idempotency_key = {_KEY} "
    "CROSS JOIN (SELECT 0 AS n UNION ALL SELECT 1) AS leg WHERE b.amount > 0",
    "UPDATE usage_segments SET billed_seconds = b.seconds, charged_micro = b.due "
    "FROM temp.tick_bills AS b WHERE usage_segments.id = b.id",
)


def _sqlite_tick(
    session: Session,
    bills: list[tuple[int, int, int, int, int, int | None]],
    wallets: dict[tuple[int, int | None], int],
    now: datetime,
    revenue: int,
) -> None:
    rows = json.dumps([[*b[:4], wallets[(b[4], b[5])]] for b in bills], separators=(",", ":"))
    session.execute(text(_SQLITE_BILLS_TABLE))
    session.execute(text("DELETE FROM temp.tick_bills"))
    session.execute(
        text(f"INSERT INTO temp.tick_bills SELECT * FROM {_BILLS_SQLITE}"), {"bills": rows}
    )
    params = {"now": now, "revenue": revenue}
    for statement in _SQLITE_TICK:
        sql = text(statement)
        if ":now" in statement:
            sql = sql.bindparams(bindparam("now", type_=UTCDateTime()))
        session.execute(sql, {k: v for k, v in params.items() if f":{k}" in statement})


def list_segments(session: Session, owner_id: int, limit: int = 200) -> list[UsageSegment]:
    return list(
        session.scalars(
            select(UsageSegment)
            .where(UsageSegment.owner_id == owner_id)
            .order_by(UsageSegment.id.desc())
            .limit(limit)
        )
    )
