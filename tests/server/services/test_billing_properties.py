"""Property: whatever the segment, plan, windows and tick times, the ledger entries of a
segment add up to its independently computed price, to the micro-credit."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from gpulease.core.catalog import load_catalog
from gpulease.core.errors import InvalidInput
from gpulease.core.pricing import OffPeakWindow, check_no_overlap
from gpulease.server.db import make_engine, make_sessionmaker, migrate, transaction
from gpulease.server.orm import Instance, LedgerEntry, LedgerTransaction, OffPeakWindowRow, User
from gpulease.server.services import ledger, metering
from gpulease.server.services.billing import offpeak, plans
from pricing_oracle import brute_force_price

CATALOG = load_catalog(None)
USER_SEQ = itertools.count()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    path: Path = tmp_path_factory.mktemp("prop") / "gpulease.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


windows_st = st.lists(
    st.builds(
        OffPeakWindow,
        weekdays=st.frozensets(st.integers(0, 6), min_size=1),
        start_minute=st.integers(0, 1439),
        end_minute=st.integers(0, 1439),
        discount_bp=st.integers(1, 10_000),
        tz=st.just("Asia/Shanghai"),
    ),
    max_size=2,
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)
    ),
    duration_ms=st.integers(0, 30 * 3600 * 1000),
    ticks=st.lists(st.floats(0, 1), max_size=8),
    model=st.sampled_from([m.name for m in CATALOG.models]),
    count=st.integers(1, 8),
    plan=st.sampled_from([plans.ON_DEMAND, plans.SPOT]),
    windows=windows_st,
)
def test_ledger_sum_equals_the_price(
    sessions: sessionmaker[Session],
    start: datetime,
    duration_ms: int,
    ticks: list[float],
    model: str,
    count: int,
    plan: str,
    windows: list[OffPeakWindow],
) -> None:
    try:
        check_no_overlap(windows)
    except InvalidInput:
        windows = windows[:1]
    entry = CATALOG.get(model)
    rate = plans.hourly_rate(entry, count, plan)
    end = start + timedelta(milliseconds=duration_ms)
    with transaction(sessions) as session:
        session.execute(delete(OffPeakWindowRow))
        for w in windows:
            offpeak.add_window(session, w)
        user = User(name=f"u{next(USER_SEQ)}", password_hash="x", role="user", created_at=start)
        session.add(user)
        session.flush()
        instance = Instance(
            owner_id=user.id,
            name="p",
            gpu_model=model,
            gpu_count=count,
            template="python",
            hourly_micro=rate,
            plan=plan,
            status="running",
            desired_state="running",
            created_at=start,
            updated_at=start,
        )
        session.add(instance)
        session.flush()
        metering.open_segment(session, instance, start)
        instance_id, user_id = instance.id, user.id
    for fraction in sorted(ticks):  # each tick its own transaction, as in the server
        with transaction(sessions) as session:
            seg = metering.open_segment_of(session, instance_id)
            assert seg is not None
            metering.charge_segment(session, seg, start + (end - start) * fraction)
    with transaction(sessions) as session:
        instance = session.get(Instance, instance_id)
        assert instance is not None
        metering.close_segment(session, instance, end)
        charged = -session.scalar(
            select(func.coalesce(func.sum(LedgerEntry.amount), 0))
            .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.transaction_id)
            .where(
                LedgerTransaction.instance_id == instance_id,
                LedgerEntry.account_id == ledger.account_id(session, ledger.WALLET, user_id),
            )
        )
    seconds = math.floor((end - start).total_seconds())
    assert charged == brute_force_price(start, seconds, rate, windows)
