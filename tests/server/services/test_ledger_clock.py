"""The ledger's time: entries carry the time the caller bills for, or the injected clock;
never the wall clock behind the caller's back. And the bulk tick writes what the
per-segment path would, to every wallet, keeping ORM copies in step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from gpulease.core.money import cost_for_seconds
from gpulease.server import db
from gpulease.server.db import transaction
from gpulease.server.orm import Instance, LedgerEntry, LedgerTransaction, Team, UsageSegment
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering, users

BEFORE_MIDNIGHT = datetime(2026, 12, 31, 23, 59, 30, 500_000, tzinfo=UTC)


def _instance(session: object, owner_id: int, name: str, team_id: int | None = None) -> Instance:
    instance = Instance(
        owner_id=owner_id,
        team_id=team_id,
        name=name,
        gpu_model="T4",
        gpu_count=1,
        template="python",
        hourly_micro=250_000,
        status="running",
        desired_state="running",
        created_at=BEFORE_MIDNIGHT,
        updated_at=BEFORE_MIDNIGHT,
    )
    session.add(instance)  # type: ignore[attr-defined]
    session.flush()  # type: ignore[attr-defined]
    return instance


def _stamps(session: object, txn_id: int) -> set[datetime]:
    txn = session.get(LedgerTransaction, txn_id)  # type: ignore[attr-defined]
    entries = session.scalars(  # type: ignore[attr-defined]
        select(LedgerEntry.created_at).where(LedgerEntry.transaction_id == txn_id)
    ).all()
    return {txn.created_at, *entries}


def test_entries_take_the_injected_clock(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "clock", lambda: BEFORE_MIDNIGHT)
    with transaction(rt.sessions) as session:
        ann = users.create_user(session, "ann", "password-123", signup_credit_micro=0)
        txn = ledger.grant(session, ann.id, 5_000_000, kind="grant", key="g1", memo="credit")
        assert txn is not None
        assert _stamps(session, txn.id) == {BEFORE_MIDNIGHT}
        later = BEFORE_MIDNIGHT + timedelta(hours=2)
        charged = ledger.charge(session, ann.id, 1_000, key="c1", memo="x", at=later)
        assert charged is not None and _stamps(session, charged.id) == {later}


def test_a_charge_is_stamped_with_the_second_it_bills(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Billing across 00:00 UTC puts each charge on the day it bills up to, whatever the
    real time is when the test runs."""
    monkeypatch.setattr(ledger, "clock", lambda: pytest.fail("the ledger read the clock"))
    with transaction(rt.sessions) as session:
        ann = users.create_user(session, "ann", "password-123", signup_credit_micro=0)
        segment = metering.open_segment(session, _instance(session, ann.id, "a"), BEFORE_MIDNIGHT)
        upto = BEFORE_MIDNIGHT + timedelta(seconds=40)  # 00:00:10.5 the next day
        assert metering.charge_segment(session, segment, upto) == cost_for_seconds(250_000, 40)
        (txn,) = session.scalars(select(LedgerTransaction)).all()
        assert _stamps(session, txn.id) == {upto}
        tick = upto + timedelta(seconds=60)
        assert metering.charge_open_segments(session, tick) == {ann.id}
        newest = session.scalars(select(LedgerTransaction).order_by(LedgerTransaction.id)).all()
        assert _stamps(session, newest[-1].id) == {tick}
        assert tick.date() == datetime(2027, 1, 1, tzinfo=UTC).date()


def test_the_bulk_tick_bills_every_wallet_exactly(rt: Runtime) -> None:
    start = BEFORE_MIDNIGHT
    with transaction(rt.sessions) as session:
        ann = users.create_user(session, "ann", "password-123", signup_credit_micro=10**9)
        bob = users.create_user(session, "bob", "password-123", signup_credit_micro=10**9)
        lab = Team(name="lab", owner_id=ann.id, created_at=start)
        session.add(lab)
        session.flush()
        held = {
            "a": metering.open_segment(session, _instance(session, ann.id, "a"), start),
            "b": metering.open_segment(session, _instance(session, bob.id, "b"), start),
            "t": metering.open_segment(
                session, _instance(session, ann.id, "t", lab.id), start - timedelta(seconds=7)
            ),
        }
        before = {w: ledger.balance(session, *w) for w in ((ann.id, None), (bob.id, None))}
        now = start + timedelta(seconds=100, milliseconds=700)
        assert metering.charge_open_segments(session, now) == {ann.id, bob.id}
        # the ORM copies this session holds see what was written
        assert {k: s.billed_seconds for k, s in held.items()} == {"a": 100, "b": 100, "t": 107}
        session.expire_all()
        rows = session.scalars(select(UsageSegment).order_by(UsageSegment.id)).all()
        assert [s.charged_micro for s in rows] == [
            cost_for_seconds(250_000, s) for s in (100, 100, 107)
        ]
        cost = cost_for_seconds(250_000, 100)
        assert ledger.balance(session, ann.id) == before[(ann.id, None)] - cost
        assert ledger.balance(session, bob.id) == before[(bob.id, None)] - cost
        assert ledger.balance(session, ann.id, lab.id) == -cost_for_seconds(250_000, 107)
        query = select(LedgerTransaction.idempotency_key, LedgerTransaction.memo)
        written = dict(session.execute(query).all())
        for s in rows:  # key and memo as charge_segment writes them
            memo = f"T4 × 1 on_demand, segment {s.id}, seconds 0–{s.billed_seconds}"
            assert written[f"usage:{s.id}:{s.billed_seconds}"] == memo
        # again at the same time: nothing new
        assert metering.charge_open_segments(session, now) == set()


def test_wallet_accounts_finds_every_wallet_a_slice_of_owners_at_a_time(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A billing tick asks for every paying wallet at once; PostgreSQL refuses more than
    # 65,535 parameters a statement, so the owners are asked a slice at a time (here 2).
    monkeypatch.setattr(db, "IN_BATCH", 2)
    with transaction(rt.sessions) as session:
        people = [
            users.create_user(session, f"u{n}", "password-123", signup_credit_micro=0)
            for n in range(5)
        ]
        teams = [
            Team(name=f"lab{n}", owner_id=people[0].id, created_at=BEFORE_MIDNIGHT)
            for n in range(3)
        ]
        session.add_all(teams)
        session.flush()
        wallets = [(p.id, None) for p in people] + [(people[0].id, t.id) for t in teams]
        first = ledger.wallet_accounts(session, wallets)
        assert first == {w: ledger.wallet_account(session, *w) for w in wallets}
        assert len(set(first.values())) == len(wallets)
        # every account exists now: the second call must find each one in its queries
        monkeypatch.setattr(ledger, "wallet_account", _not_asked_one_by_one)
        assert ledger.wallet_accounts(session, wallets) == first


def _not_asked_one_by_one(*wallet: object) -> int:
    raise AssertionError(f"wallet {wallet} was not found by the batched query")
