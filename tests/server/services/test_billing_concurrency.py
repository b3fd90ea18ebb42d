"""Money under concurrency: many threads at once never lose or double an entry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, select

from factories import Caller, RunnerDouble
from gpulease.core.errors import GpuleaseError
from gpulease.server.db import transaction, utcnow
from gpulease.server.orm import Gpu, LedgerEntry, LedgerTransaction, UsageSegment, User
from gpulease.server.reconcilers import scheduler
from gpulease.server.runtime import Runtime
from gpulease.server.services import ledger, metering, users
from gpulease.server.services.billing import vouchers
from gpulease.server.services.instances import lifecycle

THREADS = 12


def run_together(n: int, work: Callable[[int], object]) -> tuple[list[object], list[BaseException]]:
    """Start n threads on one barrier so they hit the database at the same instant."""
    barrier = threading.Barrier(n)
    results: list[object] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(i: int) -> None:
        barrier.wait()
        try:
            result = work(i)
        except BaseException as exc:  # collected and checked by the test
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(result)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


def test_one_voucher_redeemed_at_once_by_many_gives_one_credit(rt: Runtime, admin: Caller) -> None:
    admin.post("/api/v1/admin/vouchers", json={"amount": "7", "code": "ONLY-ONCE"})
    with transaction(rt.sessions) as session:
        ids = [users.create_user(session, f"racer{i}", "password-123").id for i in range(THREADS)]

    def redeem(i: int) -> int:
        with transaction(rt.sessions) as session:
            user = session.get(User, ids[i])
            assert user is not None
            return vouchers.redeem(session, user, "ONLY-ONCE")

    results, errors = run_together(THREADS, redeem)
    assert results == [7_000_000]
    assert len(errors) == THREADS - 1 and all(isinstance(e, GpuleaseError) for e in errors)
    with transaction(rt.sessions) as session:
        total = sum(ledger.balance(session, i) for i in ids)
        kinds = session.scalars(select(LedgerTransaction.kind)).all()
    assert total == 7_000_000 and kinds.count("voucher") == 1


def test_concurrent_top_ups_and_charges_balance_exactly(rt: Runtime, ann: Caller) -> None:
    with transaction(rt.sessions) as session:
        user_id = users.get_user_by_name(session, "ann").id
    rounds = 15

    def work(i: int) -> None:
        for r in range(rounds):
            with transaction(rt.sessions) as session:
                if i % 2:
                    ledger.grant(
                        session, user_id, 1_000_000, kind="grant", key=f"t{i}:{r}", memo=""
                    )
                else:
                    ledger.charge(session, user_id, 333_333, key=f"c{i}:{r}", memo="")

    _, errors = run_together(THREADS, work)
    assert errors == []
    half = THREADS // 2
    expected = 10_000_000 + half * rounds * 1_000_000 - half * rounds * 333_333
    with transaction(rt.sessions) as session:
        assert ledger.balance(session, user_id) == expected
        unbalanced = session.execute(
            select(LedgerEntry.transaction_id)
            .group_by(LedgerEntry.transaction_id)
            .having(func.sum(LedgerEntry.amount) != 0)
        ).all()
        assert unbalanced == []


def test_meters_racing_on_the_same_segments_charge_each_second_once(
    rt: Runtime, ann: Caller, tick: Callable[[], None], runner_for: Callable[[int], RunnerDouble]
) -> None:
    ids = []
    for gpu in ("A100-80GB:1", "A100-80GB:1", "T4:1"):
        instance_id = ann.post("/api/v1/instances", json={"gpu": gpu}).json()["id"]
        tick()
        runner_for(instance_id).ready()
        ids.append(instance_id)
    with transaction(rt.sessions) as session:
        for seg in session.scalars(select(UsageSegment)):
            seg.started_at -= timedelta(hours=1)
    start = utcnow()

    def meter(i: int) -> None:
        for step in range(10):
            with transaction(rt.sessions) as session:
                metering.charge_open_segments(session, start + timedelta(seconds=step * 7 + i % 3))

    _, errors = run_together(THREADS, meter)
    assert errors == []
    with transaction(rt.sessions) as session:
        for seg in session.scalars(select(UsageSegment)):
            posted = -session.scalar(
                select(func.sum(LedgerEntry.amount))
                .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
                .where(
                    LedgerTransaction.instance_id == seg.instance_id,
                    LedgerTransaction.kind == "usage",
                    LedgerEntry.amount < 0,
                )
            )
            assert posted == seg.charged_micro == metering.segment_price(seg, seg.billed_seconds)


def test_concurrent_creates_and_schedulers_never_share_a_gpu(rt: Runtime, ann: Caller) -> None:
    def create(i: int) -> int:
        with transaction(rt.sessions) as session:
            owner = users.get_user_by_name(session, "ann")
            instance = lifecycle.create_instance(
                session,
                owner,
                catalog=rt.catalog,
                gpu="A100-80GB:1",
                template="python",
                name=None,
                auto_release=False,
                min_start_minutes=1,
                workspaces=rt.settings.workspaces_path,
            )
            return instance.id

    created, errors = run_together(8, create)
    assert errors == [] and len(created) == 8
    _, errors = run_together(4, lambda i: scheduler.tick(rt))
    assert errors == []
    with transaction(rt.sessions) as session:
        held = (
            session.execute(
                select(Gpu.instance_id).where(
                    Gpu.instance_id.is_not(None), Gpu.model == "A100-80GB"
                )
            )
            .scalars()
            .all()
        )
    assert len(held) == 2 and len(set(held)) == 2
    states = [ann.get(f"/api/v1/instances/{i}").json()["status"] for i in created]
    assert states.count("starting") == 2 and states.count("queued") == 6
